"""Ingest benchmark: sme2farm.analysis vs executorch's Inspector on the same ETDump.

Generates (once, cached) a 1000-iteration ETDump of the ~200-op `cnn_blocks` example model
with the ExecuTorch Python bindings, then in one process times

* Inspector(etdump_path=...) + to_dataframe()   (the usual devtools route), and
* read_etdump + analyze()                        (this package),

prints both, the ratio, and our peak Python memory (tracemalloc) next to the trace size; then what
attribution from an ETRecord adds to analyze() on the same model's 1000 iterations (--no-attribution
skips it; goal: at most 10% of analyze's time). Then, as
whole processes (what a user waits for, start-up included): `sme2-client analyze --help`,
`sme2-client analyze TRACE --json`, and a Python process that imports Inspector and builds its
dataframe; medians of --processes runs (Inspector's once).

    .venv/bin/python bench/ingest.py [--iterations 1000] [--blocks 50] [--cache DIR] [--repeat 3]
                                     [--processes 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path


def _cache_dir(arg: str | None) -> Path:
    d = Path(arg or os.environ.get("SME2FARM_BENCH_CACHE")
             or Path(tempfile.gettempdir()) / "sme2farm-bench-cache")
    d.mkdir(parents=True, exist_ok=True)
    return d


def make_trace(cache: Path, iterations: int, blocks: int) -> Path:
    """Export cnn_blocks(blocks) and run it `iterations` times with ETDump on (cached)."""
    import executorch
    ver = getattr(executorch, "__version__", "x")
    pte = cache / f"cnn_blocks_{blocks}_{ver}.pte"
    out = cache / f"cnn_blocks_{blocks}_{iterations}it_{ver}.etdump"
    if out.exists() and out.stat().st_size > 0:
        return out
    import torch
    from sme2farm.runners.examples import EXAMPLES, export_example
    if not pte.exists():
        export_example("cnn_blocks", pte, blocks=blocks)
    _, inputs = EXAMPLES["cnn_blocks"].build(blocks=blocks)
    _record(pte, inputs, iterations, out)
    return out


def time_ours(path: Path, repeat: int) -> tuple[float, dict, int]:
    from sme2farm.analysis import analyze
    best = float("inf")
    report = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        report = analyze(path.read_bytes())
        best = min(best, time.perf_counter() - t0)
    gc.collect()
    tracemalloc.start()
    analyze(path.read_bytes())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, report, peak


def time_inspector(path: Path):
    t0 = time.perf_counter()
    from executorch.devtools import Inspector
    t_import = time.perf_counter() - t0
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        insp = Inspector(etdump_path=str(path))
        df = insp.to_dataframe()
        t = time.perf_counter() - t0
    return t, t_import, insp, df


def make_attributed(cache: Path, iterations: int, blocks: int) -> tuple[Path, Path, Path]:
    """cnn_blocks(blocks) exported with its ETRecord and traced `iterations` times (cached):
    (pte, etrecord, etdump)."""
    import executorch
    ver = getattr(executorch, "__version__", "x")
    pte = cache / f"cnn_blocks_{blocks}_{ver}_attr.pte"
    record = Path(f"{pte}.etrecord")
    out = cache / f"cnn_blocks_{blocks}_{iterations}it_{ver}_attr.etdump"
    if out.exists() and record.exists():
        return pte, record, out
    import torch
    from sme2farm.runners.examples import EXAMPLES, write_xnnpack_pte
    torch.manual_seed(0)
    model, inputs = EXAMPLES["cnn_blocks"].build(blocks=blocks)
    write_xnnpack_pte(model, inputs, pte, etrecord=record)
    _record(pte, inputs, iterations, out)
    return pte, record, out


def _record(pte: Path, inputs, iterations: int, out: Path) -> None:
    """Run `pte` `iterations` times in ExecuTorch's runtime and write its ETDump to `out` (via a temp name)."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    m = _load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
    with torch.no_grad():
        for _ in range(iterations):
            m.forward(inputs)
    tmp = out.with_suffix(".tmp")
    m.write_etdump_result_to_file(str(tmp))
    tmp.replace(out)


def time_attribution(cache: Path, iterations: int, blocks: int, repeat: int) -> None:
    """What attribution adds to analyze() on one trace, timed around the attribution step itself
    (a difference of two whole analyze() times drowns in a loaded machine's noise): the model's
    first trace (its check and alignment made) and the next ones (kept for the same model)."""
    import sme2farm.analysis.report as report_mod
    from sme2farm.analysis import analyze, attribution, read_etrecord
    pte, record, trace = make_attributed(cache, iterations, blocks)
    data, program = trace.read_bytes(), pte.read_bytes()
    t0 = time.perf_counter()
    et = read_etrecord(record.read_bytes())
    t_read = time.perf_counter() - t0
    spent: list[float] = []
    plain = report_mod.attribute

    def timed(*args, **kw):
        t = time.perf_counter()
        out = plain(*args, **kw)
        spent.append(time.perf_counter() - t)
        return out

    attribution._CHECKED.clear()
    attribution._PLANS.clear()
    totals = []
    report_mod.attribute = timed
    try:
        for _ in range(repeat + 1):
            gc.collect()
            t0 = time.perf_counter()
            report = analyze(data, etrecord=et, program=program)
            totals.append(time.perf_counter() - t0)
    finally:
        report_mod.attribute = plain
    a = report["attribution"]
    later = min(s / t for s, t in zip(spent[1:], totals[1:]))
    print(f"attribution ({report['n_iterations']} iterations, {len(report['by_source'])} call sites, {a['status']}, "
          f"{a['attributed_share']:.1%} of operator time):")
    print(f"  the model's first trace      : {spent[0] * 1000:9.1f} ms of analyze's {totals[0] * 1000:.1f} ms "
          f"({spent[0] / totals[0]:.1%}; goal <= 10%): the check and the alignment")
    print(f"  its next traces              : {min(spent[1:]) * 1000:9.1f} ms (best of {repeat}; {later:.1%} of analyze)")
    print(f"  read_etrecord                : {t_read * 1000:9.1f} ms ({record.stat().st_size / 1e6:.2f} MB), once per model")


def time_process(argv: list[str], runs: int) -> float:
    """The median wall time of `argv` as a whole process, output discarded."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


INSPECTOR_PROCESS = (
    "import sys, warnings; warnings.simplefilter('ignore')\n"
    "from executorch.devtools import Inspector\n"
    "Inspector(etdump_path=sys.argv[1]).to_dataframe()\n")


def whole_processes(path: Path, runs: int) -> None:
    client = Path(sys.executable).with_name("sme2-client")
    helptime = time_process([str(client), "analyze", "--help"], runs)
    ours = time_process([str(client), "analyze", str(path), "--json"], runs)
    theirs = time_process([sys.executable, "-c", INSPECTOR_PROCESS, str(path)], 1)
    print(f"whole process, median of {runs} (Inspector once):")
    print(f"  sme2-client analyze --help   : {helptime * 1000:9.1f} ms (goal < 300 ms)")
    print(f"  sme2-client analyze --json   : {ours * 1000:9.1f} ms")
    print(f"  Inspector process            : {theirs * 1000:9.1f} ms (import included)")
    print(f"  ratio Inspector / ours       : {theirs / ours:9.1f}x (goal >= 50x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--blocks", type=int, default=50)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for our reader")
    ap.add_argument("--trace", default=None, help="use this ETDump instead of generating one")
    ap.add_argument("--processes", type=int, default=5, help="runs of each whole-process timing (0: skip them)")
    ap.add_argument("--no-attribution", action="store_true", help="skip the attribution timing")
    ap.add_argument("--attribution-only", action="store_true", help="only the attribution timing (no Inspector)")
    a = ap.parse_args(argv)

    if a.attribution_only:
        time_attribution(_cache_dir(a.cache), a.iterations, a.blocks, a.repeat)
        return 0
    path = Path(a.trace) if a.trace else make_trace(_cache_dir(a.cache), a.iterations, a.blocks)
    size = path.stat().st_size
    ours, report, peak = time_ours(path, a.repeat)
    print(f"trace: {path} ({size / 1e6:.1f} MB, {report['n_events']} events, "
          f"{report['n_iterations']} iterations, {len(report['operators'])} operator types, "
          f"{sum(o['count'] for o in report['operators']):.0f} ops/iteration)")
    print(f"sme2farm.analysis read+analyze : {ours * 1000:9.1f} ms (best of {a.repeat})")
    print(f"  peak traced memory           : {peak / 1e6:9.1f} MB ({peak / size:.1f}x the trace)")
    t_insp, t_imp, insp, df = time_inspector(path)
    print(f"Inspector + to_dataframe()     : {t_insp * 1000:9.1f} ms (import {t_imp:.1f} s, not counted)")
    print(f"ratio Inspector / ours         : {t_insp / ours:9.1f}x")
    # sanity: the two agree on mean E2E
    try:
        blk = [b for b in insp.event_blocks if b.name == "Execute"][0]
        ex = [e for e in blk.events if e.name == "Method::execute"][0]
        import numpy as np
        print(f"mean E2E: ours {report['e2e_ms']['mean']:.6f} ms, Inspector "
              f"{float(np.mean(ex.perf_data.raw)):.6f} ms")
    except Exception as exc:  # the bench's purpose is the timing; report but do not fail
        print(f"(E2E cross-check skipped: {exc})")
    if not a.no_attribution:
        time_attribution(_cache_dir(a.cache), a.iterations, a.blocks, a.repeat)
    if a.processes > 0:
        whole_processes(path, a.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
