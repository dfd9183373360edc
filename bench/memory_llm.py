"""What memory recording costs a run, and what an LLM run of the tiny Llama costs on this host.

Memory: the local runner runs the same model alternately with and without --memory_file (the
recording is two getrusage calls, a few additions per allocation the runtime asks for, and a
~400-byte file written at exit); each process's wall time is taken from outside, and the medians
and their difference are printed, with the runner's own per-iteration time for scale.

LLM: tiny_llama (fp32 and fp16) prefills a prompt and decodes, --iterations generations; printed
are the runner's wall time, the analysis of its trace (TTFT, prefill and decode tokens/s with
their intervals) and how long analyze() took.

    python bench/memory_llm.py [--model cnn_blocks] [--runs 30] [--prompt 32 --decode 16 --iterations 10]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sme2farm.analysis import analyze
from sme2farm.runners.build import build_local
from sme2farm.runners.catalog import Catalog
from sme2farm.runners.examples import export_example


def wall(argv: list[str], cwd: Path) -> float:
    return timed(argv, cwd)[0]


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    """(process wall seconds, its stdout)."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, done.stdout


def memory_cost(runner: str, model: Path, runs: int, iterations: int, work: Path) -> None:
    base = [runner, f"--model_path={model}", f"--num_executions={iterations}", "--cpu_threads=1"]
    wall(base, work)  # page cache, first load
    off, on, inside = [], [], []
    for _ in range(runs):  # alternated, so drift in the machine's load hits both alike
        off.append(wall(base, work))
        seconds, out = timed(base + ["--memory_file=memory.json"], work)
        on.append(seconds)
        inside.append(float(re.search(r"recording took ([0-9.]+) us", out).group(1)))
    m_off, m_on = statistics.median(off), statistics.median(on)
    p10 = runs // 10
    print(f"memory recording, {model.name}, {iterations} iterations, {runs} runs each (process wall time):")
    print(f"  without --memory_file  median {m_off * 1e3:8.2f} ms  (p10 {sorted(off)[p10] * 1e3:.2f})")
    print(f"  with    --memory_file  median {m_on * 1e3:8.2f} ms  (p10 {sorted(on)[p10] * 1e3:.2f})")
    print(f"  difference of medians  {(m_on - m_off) * 1e3:+8.2f} ms, of p10s "
          f"{(sorted(on)[p10] - sorted(off)[p10]) * 1e3:+.2f} ms (the process start's spread on a shared machine)")
    print(f"  the runner's own timing of the recording (two RSS reads, the file): median "
          f"{statistics.median(inside):.1f} us, max {max(inside):.1f} us")
    print(f"  memory.json: {(work / 'memory.json').read_text().strip()}")


def llm_cost(runner: str, work: Path, prompt: int, decode: int, iterations: int) -> None:
    for name in ("tiny_llama", "tiny_llama_fp16"):
        model = export_example(name, work / f"{name}.pte")
        argv = [runner, f"--model_path={model}", f"--llm_prompt={prompt}", f"--llm_decode={decode}",
                f"--num_executions={iterations}", "--warmup=1", "--cpu_threads=1", "--etdump_path=llm.etdump",
                "--memory_file=memory.json"]
        seconds = wall(argv, work)
        trace = (work / "llm.etdump").read_bytes()
        t0 = time.perf_counter()
        report = analyze(trace)
        analysis_s = time.perf_counter() - t0
        llm = report["llm"]

        def fig(key: str, unit: str, digits: int) -> str:
            v = llm[key]
            return f"{v['median']:.{digits}f} {unit} (95% CI {v['ci_low']:.{digits}f}-{v['ci_high']:.{digits}f})"

        print(f"{name}: prompt {prompt}, decode {decode}, {iterations} generations + 1 warm-up, 1 thread")
        print(f"  runner wall {seconds:.2f} s; trace {len(trace) / 1e3:.0f} kB, {report['n_events']} events, "
              f"analyze() {analysis_s * 1e3:.0f} ms")
        print(f"  TTFT {fig('ttft_ms', 'ms', 3)}; prefill {fig('prefill_tokens_per_s', 'tok/s', 0)}; "
              f"decode {fig('decode_tokens_per_s', 'tok/s', 0)}")
        print(f"  peak RSS {report.get('memory') or (work / 'memory.json').read_text().strip()}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn_blocks")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--decode", type=int, default=16)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sme2-bench-memory-"))
    build = build_local(work / "manifest.json")
    runner = str(Catalog.load(work / "manifest.json").resolve(build))
    model = export_example(args.model, work / f"{args.model}.pte")
    memory_cost(runner, model, args.runs, args.iterations, work)
    llm_cost(runner, work, args.prompt, args.decode, args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
