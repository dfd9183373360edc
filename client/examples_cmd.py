"""sme2-client examples [NAME [OUT.pte]]: the bundled example models (runners/examples.py), listed,
or one exported quietly to a .pte and, beside it, its ETRecord (OUT.pte.etrecord, which submit
takes). The exporter (torch, executorch, torchao) prints dozens of "Failed to load …so" lines and
FutureWarnings: it runs in a child process whose output goes to OUT.pte.log, and the user reads
one line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

# torch is imported only inside runners/examples's functions: listing needs no torch
from sme2farm.runners.examples import EXAMPLES, etrecord_path, has_etrecord

NEEDS = "exporting needs torch and executorch: pip install 'sme2-farm[export]'"
NEEDS_HF = ("pip install 'sme2-farm[hf]' and then optimum-executorch==1.1.0 with --no-deps (it declares "
            "transformers==5.0.0rc1; the farm is checked with transformers>=5.23)")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def add_parser(sub) -> None:
    ex = sub.add_parser("examples", help="list the bundled example models, or export one to a .pte",
                        description="With no NAME: list the bundled models. With NAME: export it to OUT "
                                    "(default NAME.pte here) and its ETRecord to OUT.etrecord (the models built "
                                    "here; the LLMs' own exports write none); the exporter's messages go to OUT.log.")
    ex.add_argument("name", nargs="?", help="an example's name (see the list)")
    ex.add_argument("out", nargs="?", help="where to write the .pte (default NAME.pte)")
    ex.set_defaults(fn=run)


def run(args) -> int:
    if args.name is None:
        for name, ex in EXAMPLES.items():
            print(f"{name:<16} {ex.description}")
        print("export one: sme2-client examples NAME [OUT.pte]; then: sme2-client submit OUT.pte --wait")
        return 0
    if args.name not in EXAMPLES:
        print(f"sme2-client: no bundled example {args.name!r}: choose one of {', '.join(EXAMPLES)}", file=sys.stderr)
        return 2
    if any(importlib.util.find_spec(m) is None for m in ("torch", "executorch")):
        print(f"sme2-client: {NEEDS}", file=sys.stderr)
        return 1
    missing = [m for m in EXAMPLES[args.name].needs if not _importable(m)]
    if missing:
        print(f"sme2-client: exporting {args.name} needs {', '.join(missing)}: {NEEDS_HF}", file=sys.stderr)
        return 1
    out = Path(args.out or f"{args.name}.pte")
    log = out.with_name(out.name + ".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "sme2farm.runners.examples", args.name, str(out)],
                              stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not out.is_file():
        print(f"sme2-client: exporting {args.name} failed (exit {done.returncode}); its messages are in {log}",
              file=sys.stderr)
        return 1
    etrecord = etrecord_path(out)
    if has_etrecord(args.name) and not etrecord.is_file():
        print(f"sme2-client: exporting {args.name} wrote no ETRecord at {etrecord}; its messages are in {log}",
              file=sys.stderr)
        return 1
    beside = f" and its ETRecord {etrecord}" if has_etrecord(args.name) else " (its own export writes no ETRecord)"
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB, {args.name}: {EXAMPLES[args.name].description}){beside}; "
          f"exporter messages in {log}; next: sme2-client submit {out} --wait")
    return 0
