"""Thread sweep of the runner itself, no farm: how one program's latency scales with the thread
count on a machine with more cores than the farm's CI VM.

`run` needs only the standard library, the runner and its shared libraries, so it runs on a bare
machine the farm is not installed on; `show` reads the traces back with the farm's own analysis
(analysis.report for each ETDump, analysis.scaling for the view the farm serves at
GET /experiments/{id}/scaling).

    python3 bench/thread_sweep.py run --runner R --out DIR --threads 1,2,4,8,16 --sessions 3 MODEL.pte ...
    python3 bench/thread_sweep.py run ... --llm 32,16 LLM.pte      # prefill 32 tokens, decode 16
    .venv/bin/python bench/thread_sweep.py show DIR

Sessions and thread counts are interleaved (session 1 at every count, then session 2, ...) so a
drift of the machine spreads over every count. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in args.threads.split(",")]
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {
        "machine": platform.machine(), "cpus": os.cpu_count(), "cpu_model": cpu_model(), "runs": []}
    for session in range(args.sessions):
        for model in args.models:
            for t in threads:
                stem = Path(model).stem
                trace = out / f"{stem}-t{t}-s{session}.etdump"
                argv = [args.runner, f"--model_path={model}", f"--cpu_threads={t}", f"--warmup={args.warmup}",
                        f"--num_executions={args.iterations}", f"--etdump_path={trace}"]
                if args.llm:
                    prompt, decode = args.llm.split(",")
                    argv += [f"--llm_prompt={prompt}", f"--llm_decode={decode}"]
                t0 = time.monotonic()
                done = subprocess.run(argv, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"{stem} at {t} threads failed: {done.stderr.strip()[-500:]}", file=sys.stderr)
                    return 1
                meta["runs"] = [r for r in meta["runs"] if r["trace"] != trace.name]   # a rerun replaces it
                meta["runs"].append({"model": stem, "threads": t, "session": session, "trace": trace.name,
                                     "llm": args.llm, "wall_s": round(time.monotonic() - t0, 3)})
                print(f"{stem}: {t} threads, session {session}: {time.monotonic() - t0:.2f} s", flush=True)
    meta_path.write_text(json.dumps(meta, indent=1))
    return 0


def show(args) -> int:
    import numpy as np

    from sme2farm.analysis import analyze
    from sme2farm.analysis.scaling import Point, rows, scaling
    from sme2farm.client.scaling_cmd import table

    folder = Path(args.dir)
    meta = json.loads((folder / "meta.json").read_text())
    print(f"machine: {meta['machine']}, {meta['cpus']} CPUs, {meta['cpu_model']}")
    by_model: dict[str, list[dict]] = {}
    for r in meta["runs"]:
        by_model.setdefault(r["model"], []).append(r)
    for model, runs in by_model.items():
        points: dict[int, Point] = {}
        llm: dict[int, dict[str, list[float]]] = {}
        for r in runs:
            report = analyze((folder / r["trace"]).read_bytes())
            points.setdefault(r["threads"], Point(sme2="off", threads=r["threads"])).sessions.append(
                report["iterations_ms"])
            if report.get("llm"):
                for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
                    llm.setdefault(r["threads"], {}).setdefault(key, []).extend(report["llm"]["samples"][key])
        view = scaling(list(points.values()))
        print(f"\n{model} ({len(runs)} runs)")
        for line in table(*rows(view)):   # as `sme2-client scaling` prints it
            print(f"  {line}")
        for sentence in view.get("sentences") or []:
            print(f"  {sentence}")
        for t, figures in sorted(llm.items()):
            print(f"  {t:>2} threads: TTFT {np.median(figures['ttft_ms']):.3f} ms, prefill "
                  f"{np.median(figures['prefill_tokens_per_s']):,.0f} tok/s, decode "
                  f"{np.median(figures['decode_tokens_per_s']):,.0f} tok/s (medians over generations)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the sweep, writing traces and meta.json to --out")
    r.add_argument("--runner", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--threads", default="1,2,4,8,16")
    r.add_argument("--sessions", type=int, default=3)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--iterations", type=int, default=30)
    r.add_argument("--llm", metavar="PROMPT,DECODE", help="LLM mode for these models")
    r.add_argument("models", nargs="+")
    s = sub.add_parser("show", help="the scaling view of a sweep's traces")
    s.add_argument("dir")
    args = p.parse_args()
    return run(args) if args.cmd == "run" else show(args)


if __name__ == "__main__":
    sys.exit(main())
