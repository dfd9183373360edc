"""sme2-client scaling ID: how an experiment's latency changes with threads (and core masks), per
device and arm: median and interval per thread count, speedup over the fewest threads and
parallel efficiency with intervals, where more threads stop helping, the SME2 on/off ratio per
thread count, and the device's clusters as --core-mask values; --svg FILE writes its chart. Emulated runs:
no speed figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sme2farm.analysis.scaling import rows
from sme2farm.client.common import connect, experiment_id
from sme2farm.protocol import ScalingRead


def add_parser(sub) -> None:
    s = sub.add_parser("scaling", help="thread and core scaling of an experiment (submit with --threads 1,2,4)",
                       description=__doc__.split(":", 1)[1].strip())
    s.add_argument("id", type=experiment_id, help="experiment id (12 or E12)")
    s.add_argument("--with", dest="joined", type=experiment_ids, default=None, metavar="ID,ID",
                   help="other experiments of the same model to join (e.g. one per --core-mask: which cluster is "
                        "fastest)")
    s.add_argument("--json", action="store_true", help="the API's answer (GET /experiments/{id}/scaling)")
    s.add_argument("--svg", metavar="FILE", type=Path, default=None,
                   help="also write the chart (speedup against threads, one series per device, core mask and SME2 "
                        "setting, the --with experiments included) as an SVG file")
    s.set_defaults(fn=run)


def experiment_ids(text: str) -> list[int]:
    """--with 13,E14 as a list of experiment ids (each as common.experiment_id reads one)."""
    return [experiment_id(x) for x in text.split(",") if x.strip()]


def table(headers: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [headers, *body]) for i in range(len(headers))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [headers, *body]]


def scaling_text(view: ScalingRead) -> str:
    """The view as text: a table per device (analysis.scaling.rows, which reads the device's JSON)."""
    out = [f"Experiment {view.experiment_id}: threads {', '.join(map(str, view.threads))}"
           + (f", core mask {view.core_mask}" if view.core_mask else "")
           + (f", with experiments {', '.join(map(str, view.joined))}" if view.joined else "")]
    for d in view.devices:
        out += ["", f"{d.device or '?'} ({d.device_model or '?'})" + (f", emulated by {d.emulator}" if d.emulated else "")]
        headers, body = rows(d.model_dump(mode="json"))
        out += ["  " + line for line in table(headers, body)]
        out += [f"  {s}" for s in d.sentences]
    out += view.sentences
    return "\n".join(out)


def run(args) -> int:
    svg = getattr(args, "svg", None)
    if svg is not None and not svg.resolve().parent.is_dir():
        print(f"sme2-client: cannot write {svg}: the directory {svg.parent}/ does not exist", file=sys.stderr)
        return 2
    client = connect(args)
    view = client.scaling(args.id, args.joined)
    if svg is not None:
        svg.write_text(client.scaling_chart(args.id, args.joined), encoding="utf-8")
        print(f"wrote the scaling chart to {svg}", file=sys.stderr)
    if args.json:
        json.dump(view.model_dump(mode="json"), sys.stdout, indent=2)
        print()
    else:
        print(scaling_text(view))
    return 0
