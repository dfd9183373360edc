"""sme2-client suite create|list|run [--wait]|show|delete|pause|resume, and sme2-client regressions [--ack ID]."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from sme2farm.analysis.memory import fmt_bytes
from sme2farm.client.api import default_of, wire
from sme2farm.client.common import EXIT_FAILED, EXIT_OK, connect, outcome_code, parse_selector, wait_for
from sme2farm.protocol import DetectableStep, SeriesRead, SuitePatch, SuiteSpec, SuiteThresholds

_SHA = re.compile(r"^[0-9a-fA-F]{64}$")


def _model_ref(text: str) -> dict:
    """--model SHA256[=NAME] or PATH.pte[=NAME]: a path is hashed here (the server must have the
    model stored already: any experiment that uploaded it did)."""
    ref, _, name = text.partition("=")
    if _SHA.match(ref):
        return {"sha256": ref.lower(), **({"name": name} if name else {})}
    path = Path(ref)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"--model {ref!r} is neither a sha256 nor a file")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "name": name or path.stem}


def _iso(t: datetime | None) -> str | None:
    """A timestamp as the server wrote it (isoformat)."""
    return t.isoformat() if t is not None else None


def cmd_suite_create(args) -> int:
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        print(f"sme2-client: --threads {args.threads!r}: give comma-separated whole numbers, e.g. 1,4", file=sys.stderr)
        return 2
    selector = parse_selector(args.device)
    device = {} if selector is None else {"device": selector.model_dump(exclude_none=True, exclude_defaults=True)}
    spec: dict = {"name": args.name, "models": args.model, "sme2": args.sme2, "threads": threads,
                  "iterations": args.iterations, "warmup": args.warmup, "sessions": args.sessions,
                  "schedule": args.schedule, "thresholds": {"min_effect": args.min_effect, "alpha": args.alpha,
                                                            "memory": args.memory_threshold},
                  "canary": args.canary, "webhook": args.webhook, **device}
    suite = connect(args).create_suite(spec)
    print(json.dumps(wire(suite), indent=2) if args.json else
          f"suite {suite.name} created; next run {_iso(suite.next_run_at)}")
    for w in suite.warnings or []:
        print(f"sme2-client: warning: {w}", file=sys.stderr)
    return 0


def cmd_suite_delete(args) -> int:
    out = connect(args).delete_suite(args.name)
    print(json.dumps(wire(out), indent=2) if args.json else
          f"suite {out.deleted} deleted with {out.runs} run(s), {out.points} point(s) and "
          f"{out.changes} regression(s)/improvement(s); its experiments stay")
    return 0


def cmd_suite_pause(args) -> int:
    suite = connect(args).update_suite(args.name, SuitePatch(paused=args.suite_cmd == "pause"))
    print(json.dumps(wire(suite), indent=2) if args.json else
          f"suite {suite.name} paused: its schedule starts nothing until resumed (suite run still works)"
          if suite.paused else f"suite {suite.name} resumed; next run {_iso(suite.next_run_at)}")
    return 0


def cmd_suite_list(args) -> int:
    suites = connect(args).suites()
    if args.json:
        print(json.dumps(wire(suites), indent=2))
        return 0
    if not suites:
        print("no suites")
    for s in suites:
        models = ", ".join(m.name for m in s.models)
        print(f"{s.name:<24} {s.schedule:<14} next {_iso(s.next_run_at) or '-':<26} "
              f"last {_iso(s.last_run_at) or '-':<26} {'canary ' if s.canary else ''}models: {models}")
    return 0


def detectable_text(d: DetectableStep | None) -> str:
    """GET /suites/{name}/series' `detectable` estimate as one line."""
    if not d:
        return ""
    if d.step is None:
        return f"  detectable step: {d.note}"
    return (f"  detectable step ~ {d.step:.1%} at this device's noise (sigma {d.sigma_between:.1%} between "
            f"nights, from {d.noise}, {d.nights} baseline nights); {d.note}")


def series_text(series: SeriesRead) -> str:
    lines = []
    for s in series.series:
        k = s.key
        shown = s.points[-12:]
        lines.append(f"{k.model_name} on {k.device_model} (SME2 {k.sme2}, {k.threads} thread(s)): "
                     f"{len(s.points)} point(s), median ms: "
                     + " ".join(f"{p.median_ms:.3f}" if p.median_ms is not None else "-" for p in shown))
        for p in shown:
            if p.median_ms is None:  # the "-" above: say why
                why = (p.device_state or {}).get("reason") or "no samples"
                lines.append(f"  - experiment {p.experiment_id} ({_iso(p.at)}): no samples: {why}")
        if s.detectable:
            lines.append(detectable_text(s.detectable))
        for c in s.changes:
            lines.append(f"  change #{c.id} [{c.status}, {c.blamed}] {c.sentence}")
        if (memory := next((p.memory for p in reversed(s.points) if p.memory), None)) is not None:
            lines.append("  memory (latest): " + ", ".join(
                f"{name} {fmt_bytes(value)}" for value, name in (
                    (memory.planned_bytes, "planned"), (memory.weights_bytes, "weights"),
                    (memory.runtime_allocated_bytes, "runtime allocated"), (memory.peak_rss_bytes, "peak RSS"))
                if value is not None))
        lines += [f"  memory change: {c.sentence}" for c in s.memory_changes]
        if (llm := next((p.llm for p in reversed(s.points) if p.llm), None)) is not None:
            lines.append(f"  LLM (latest, prompt {llm.prompt}, decode {llm.decode}, {llm.generations} generation(s)): "
                         + ", ".join(f"{name} {v:.{digits}f}{unit}" for name, v, digits, unit in (
                             ("time to first token", llm.ttft_ms, 3, " ms"),
                             ("prefill", llm.prefill_tokens_per_s, 1, " tokens/s"),
                             ("decode", llm.decode_tokens_per_s, 1, " tokens/s")) if v is not None))
        lines += [f"  {c.metric} change #{c.id} [{c.status}, {c.blamed}] {c.sentence}" for c in s.metric_changes]
    return "\n".join(lines) or "no points yet"


def cmd_suite_show(args) -> int:
    client = connect(args)
    suite, series = client.suite(args.name), client.suite_series(args.name)
    if args.json:
        print(json.dumps({**wire(suite), "series": wire(series.series)}, indent=2))
        return 0
    print(f"suite {suite.name}: schedule {suite.schedule} "
          f"({'paused' if suite.paused else 'next ' + str(_iso(suite.next_run_at))}), "
          f"min effect {suite.thresholds.min_effect:.1%}, alpha {suite.thresholds.alpha:g}, "
          f"memory threshold {suite.thresholds.memory:.1%}"
          f"{', canary' if suite.canary else ''}{', webhook ' + suite.webhook if suite.webhook else ''}")
    for r in suite.runs[:10]:
        print(f"  run {r.id} {r.trigger:<8} {r.status:<9} {_iso(r.triggered_at)} experiments {r.experiment_ids}"
              + (f" ({r.reason})" if r.reason else ""))
    print(series_text(series))
    return 0


def cmd_suite_run(args) -> int:
    from sme2farm.client.api import Patience, note

    client = connect(args)
    if not args.wait:
        srun = client.run_suite(args.name)
        print(f"suite {args.name}: run {srun.id} started, experiments {srun.experiment_ids}", file=sys.stderr)
        print(json.dumps(wire(srun), indent=2) if args.json else srun.id)
        return 0
    # --wait: transient faults are waited out, and --timeout bounds the whole of it (Patience);
    # starting the run is retried only where the server did nothing (a second start is a second run)
    patience = Patience(client, f"suite {args.name} to start", args.timeout, say=None if args.json else note)
    srun = patience.call(client.run_suite, args.name, idempotent=False)
    print(f"suite {args.name}: run {srun.id} started, experiments {srun.experiment_ids}", file=sys.stderr)
    reports = []
    for exp_id in srun.experiment_ids:
        patience.what = f"experiment {exp_id} of suite run {srun.id} to finish"
        reports.append(wait_for(client, exp_id, quiet=args.json, patience=patience))
    # the experiments ended: the analysis (points, detection) follows in the worker
    patience.what = f"suite run {srun.id} to be analysed"
    while True:
        run = next((r for r in patience.call(client.suite, args.name).runs if r.id == srun.id), None)
        if run is not None and run.status in ("complete", "failed"):
            break
        patience.seen = f"it was last {run.status if run else 'not listed'}"
        patience.check()
        time.sleep(min(0.2, patience.left()))
    series = patience.call(client.suite_series, args.name)
    print(json.dumps({"run": wire(run), **wire(series)}, indent=2) if args.json else series_text(series))
    # A point without samples because its runs failed or were cancelled fails the wait (1); one
    # whose runs could not be placed (an SME2-on arm with no SME2 device) is told apart (3).
    code = outcome_code(reports)
    if code == EXIT_OK and (run.status != "complete" or run.reason):
        code = EXIT_FAILED
    if code != EXIT_OK:
        print(f"sme2-client: suite run {run.id} {run.status}: {run.reason or 'failed'}", file=sys.stderr)
    return code


def cmd_regressions(args) -> int:
    client = connect(args)
    if args.ack is not None:
        out = client.acknowledge(args.ack)
        print(json.dumps(wire(out), indent=2) if args.json else f"acknowledged #{out.id}: {out.sentence}")
        return 0
    rows = client.regressions(suite=args.suite, candidates=args.candidates)
    if args.json:
        print(json.dumps(wire(rows), indent=2))
        return 0
    if not rows:
        print("no regressions or improvements")
    for r in rows:
        w = r.webhook
        hook = "" if w.state == "none" else f" webhook {w.state} ({w.attempts} attempt(s))"
        what = "" if r.metric == "latency" else f"{r.metric} "
        print(f"#{r.id:<5} {r.suite:<16} {r.direction:<11} {what}x{r.ratio:.3f} [{r.status}, {r.blamed}]{hook}"
              f"\n       {r.sentence}")
    return 0


def add_parsers(sub) -> None:
    su = sub.add_parser("suite", help="suites: models run on a schedule, watched for regressions")
    ss = su.add_subparsers(dest="suite_cmd", required=True)
    c = ss.add_parser("create", help="create a suite of stored models")
    c.add_argument("name")
    c.add_argument("--model", action="append", required=True, type=_model_ref, metavar="SHA256|PATH.pte[=NAME]",
                   help="a stored model (repeatable); a path is hashed locally")
    c.add_argument("--sme2", choices=["on", "off", "both"], default=default_of(SuiteSpec, "sme2"))
    c.add_argument("--threads", default=",".join(map(str, default_of(SuiteSpec, "threads"))),
                   help="comma-separated thread counts")
    c.add_argument("--iterations", type=int, default=default_of(SuiteSpec, "iterations"))
    c.add_argument("--warmup", type=int, default=default_of(SuiteSpec, "warmup"))
    c.add_argument("--sessions", type=int, default=default_of(SuiteSpec, "sessions"))
    c.add_argument("--device", help="selector: a serial, or platform=android,tags=a+b,sme2=true")
    schedule, min_effect = default_of(SuiteSpec, "schedule"), default_of(SuiteThresholds, "min_effect")
    c.add_argument("--schedule", default=schedule,
                   help=f"cron, exactly 5 fields: minute hour day month weekday, UTC (default '{schedule}': nightly "
                        "at 03:00)")
    c.add_argument("--min-effect", type=float, default=min_effect,
                   help=f"smallest change claimed: a fraction, 0 <= x <= 0.5 (default {min_effect:g}: "
                        f"{min_effect * 100:g}%%)")
    c.add_argument("--alpha", type=float, default=default_of(SuiteThresholds, "alpha"),
                   help="two-sided level that confirms a change, 0 < x < 1")
    memory = default_of(SuiteThresholds, "memory")
    c.add_argument("--memory-threshold", type=float, default=memory,
                   help=f"smallest memory change that alerts: a fraction, 0 <= x < 1 (default {memory:g}: "
                        f"{memory * 100:g}%%)")
    c.add_argument("--canary", action="store_true", help="this suite's series are their devices' canary")
    c.add_argument("--webhook", help="http(s) URL alerts are POSTed to (needs an admin token)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_suite_create)
    ls = ss.add_parser("list", help="list suites")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_suite_list)
    sh = ss.add_parser("show", help="a suite, its runs and its series")
    sh.add_argument("name")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(fn=cmd_suite_show)
    de = ss.add_parser("delete", help="delete a suite with its runs, series and regressions (not while a run is in flight)")
    de.add_argument("name")
    de.add_argument("--json", action="store_true")
    de.set_defaults(fn=cmd_suite_delete)
    for verb, what in (("pause", "stop the schedule starting runs (suite run still works)"),
                       ("resume", "restart the schedule (next run: its next fire time)")):
        pa = ss.add_parser(verb, help=what)
        pa.add_argument("name")
        pa.add_argument("--json", action="store_true")
        pa.set_defaults(fn=cmd_suite_pause)
    r = ss.add_parser("run", help="start a suite now",
                      description="Exit codes with --wait: 0 when every point of the run has samples; 3 when "
                                  "points have none only because their runs could not be placed (e.g. the SME2-on "
                                  "arm on a farm without SME2) and no run failed; 1 when a run failed or was "
                                  "cancelled, the suite run failed, or the server refused; 2 on bad arguments.")
    r.add_argument("name")
    r.add_argument("--wait", action="store_true", help="wait for its experiments and the analysis, print the series")
    r.add_argument("--timeout", type=float, default=None,
                   help="with --wait: give up after this many seconds (server restarts, database outages and 429s "
                        "within it are waited out)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_suite_run)

    rg = sub.add_parser("regressions", help="confirmed regressions and improvements; --ack ID accepts one")
    rg.add_argument("--suite")
    rg.add_argument("--candidates", action="store_true", help="also unconfirmed candidates")
    rg.add_argument("--ack", type=int, metavar="ID", help="acknowledge: the change's level becomes the baseline")
    rg.add_argument("--json", action="store_true")
    rg.set_defaults(fn=cmd_regressions)
