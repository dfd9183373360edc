"""sme2-client artifacts ID [NAME] [-o DIR]: a run's artifacts (R34), listed, or downloaded (one by
NAME, or all with -o); E12 does it for every run of experiment 12, into DIR/run<id>/. A bare 34 is
whichever of run 34 and experiment 34 exists (common.run_or_experiment).
File names are only ever the server's fixed artifact names (protocol.ARTIFACT_NAMES), never a
path from the server or the user, so nothing is written outside DIR."""

from __future__ import annotations

import sys
from pathlib import Path

from sme2farm.client import kit_dir
from sme2farm.client.common import RefRefused, connect, run_or_experiment
from sme2farm.protocol import ARTIFACT_NAMES


def add_parser(sub) -> None:
    a = sub.add_parser("artifacts", help="list or download a run's artifacts (trace.etdump, runner.log, report.json …)",
                       description="ID: a run (R34) or an experiment (E12: each of its runs, into DIR/run<id>/); a bare 34 "
                                   "is whichever of the two exists, refused where both do. "
                                   "Without NAME or -o: list them. With NAME: download that one. With -o DIR alone: "
                                   f"download all. Names: {', '.join(sorted(ARTIFACT_NAMES))}.")
    a.add_argument("id", help="run id (R34) or experiment id (E12); a bare number where only one of them exists")
    a.add_argument("name", nargs="?", choices=sorted(ARTIFACT_NAMES), metavar="NAME",
                   help="one artifact to download (default with -o: all of them)")
    a.add_argument("-o", "--output", metavar="DIR", help="where to write (default: the current directory)")
    a.add_argument("--kit", action="store_true",
                   help="with E<id>: write the SME2 kit's run directory (DIR/runs/<platform>/ with manifest.json, "
                        "metrics.json, analysis_summary.json, the traces and logs; DIR/artifacts/ the model), one per "
                        "device, which the kit's own tools read")
    a.set_defaults(fn=run)


def run(args) -> int:
    client = connect(args)
    try:
        kind, number = run_or_experiment(client, args.id)
    except RefRefused as e:
        print(f"sme2-client: {e}", file=sys.stderr)
        return e.code
    if args.kit:
        if kind != "experiment" or args.name:
            print("sme2-client: --kit writes an experiment's runs: give E<id> and no artifact NAME", file=sys.stderr)
            return 2
        return kit_dir.cmd_export(args, number)
    many = kind == "experiment"
    if many:
        runs = [(r.id, r.artifacts) for r in client.experiment(number, runs="full").runs]  # not a summary
    else:
        runs = [(number, client.run(number).artifacts)]
    download = args.name is not None or args.output is not None
    if not download:
        for run_id, names in runs:
            print(f"run {run_id}: {', '.join(names) if names else 'no artifacts (yet)'}")
        return 0
    base = Path(args.output or ".")
    wrote = 0
    missing = []
    for run_id, names in runs:
        # only names from the fixed set: a server cannot make the client write elsewhere
        wanted = [args.name] if args.name else [n for n in names if n in ARTIFACT_NAMES]
        for name in wanted:
            if name not in names:
                missing.append(f"run {run_id} has no {name}")
                continue
            where = (base / f"run{run_id}" if many else base) / name
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_bytes(client.artifact(run_id, name))
            print(f"{where} ({where.stat().st_size} bytes)")
            wrote += 1
    listing = f"sme2-client artifacts {'E' if many else 'R'}{number}"   # the explicit form: no guess the second time
    for line in missing:
        print(f"sme2-client: {line} (list them with: {listing})", file=sys.stderr)
    # an experiment's runs differ (an unschedulable run has none): only nothing at all, or the one
    # run asked for lacking it, is a failure
    return 1 if not wrote or (missing and not many) else 0
