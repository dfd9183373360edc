"""Attribution on real architectures: how much of each zoo model's time its ETRecord attributes
(printed, not asserted; the figures go in docs/benchmarks.md).

For each model of runners/zoo.py and each dtype: export it with its ETRecord (cached in --out),
run it in the local C++ runner (20 traced iterations), analyze the trace with the ETRecord and
print the status, the attributed share of operator time and of delegated time, the rows left
ambiguous, whether every Convolution row names a convolution module and every GEMM row a
Linear, a 1x1 convolution or a matmul, the time to read the ETRecord, and analyze() without and with it
(20 iterations: the share of a 1000-iteration trace is bench/ingest.py's).

    python bench/attribution.py [--out DIR] [--models bert,vit] [--dtypes fp32,int8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONV_CLASSES = {"Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d"}
# GEMM: a Linear (HF GPT-style Conv1D is one), a 1x1 convolution, or a matmul in a module's forward
GEMM_ATEN = ("linear", "mm", "addmm", "bmm", "matmul", "baddbmm", "convolution")


def gemm_ok(row: dict) -> bool:
    return row["module_class"] in {"Linear", "Conv1D"} | CONV_CLASSES or any(
        a.split(".")[-2] in GEMM_ATEN for a in row["aten"])


def conv_ok(row: dict) -> bool:
    return row["module_class"] in CONV_CLASSES or any(a.split(".")[-2] == "convolution" for a in row["aten"])


def survey(name: str, dtype: str, out: Path, runner: str) -> dict:
    from sme2farm.analysis.etrecord import read_etrecord
    from sme2farm.analysis.report import analyze
    from sme2farm.runners.examples import write_xnnpack_pte
    from sme2farm.runners.zoo import build

    pte = out / f"{name}-{dtype}.pte"
    record = out / f"{name}-{dtype}.pte.etrecord"
    if not (pte.exists() and record.exists()):
        model, inputs = build(name, dtype)
        write_xnnpack_pte(model, inputs, pte, etrecord=record)
    trace = out / f"{name}-{dtype}.etdump"
    subprocess.run([runner, f"--model_path={pte}", "--num_executions=20", "--warmup=2",
                    f"--etdump_path={trace}"], check=True, capture_output=True, timeout=600)
    data, program = trace.read_bytes(), pte.read_bytes()
    t = time.perf_counter()
    et = read_etrecord(record.read_bytes())
    t_read = time.perf_counter() - t
    t_plain = t_attr = float("inf")
    for _ in range(3):  # best of 3: the 20-iteration traces take milliseconds
        t = time.perf_counter()
        plain = analyze(data)
        t_plain = min(t_plain, time.perf_counter() - t)
        t = time.perf_counter()
        r = analyze(data, etrecord=et, program=program)
        t_attr = min(t_attr, time.perf_counter() - t)
    rows = r["by_source"]
    deleg = sum(x["ms"] for x in rows if x["delegated"])
    deleg_attr = sum(x["ms"] for x in rows if x["delegated"] and x["module"] is not None)
    convs = [x for x in rows if x["category"] == "Convolution"]
    gemms = [x for x in rows if x["category"] == "GEMM" and x["delegated"]]
    assert plain["e2e_ms"]["n"] == r["e2e_ms"]["n"]
    return {"status": r["attribution"]["status"], "share": r["attribution"]["attributed_share"],
            "delegated_share": deleg_attr / deleg if deleg else 1.0, "rows": len(rows),
            "ambiguous": sum(1 for x in rows if x["ambiguous"]),
            "conv_ok": f"{sum(map(conv_ok, convs))}/{len(convs)}", "gemm_ok": f"{sum(map(gemm_ok, gemms))}/{len(gemms)}",
            "bad": [(x["operator"], x["module"], x["module_class"]) for x in convs if not conv_ok(x)]
            + [(x["operator"], x["module"], x["module_class"]) for x in gemms if not gemm_ok(x)],
            "read_ms": t_read * 1e3, "plain_ms": t_plain * 1e3, "attr_ms": t_attr * 1e3}


def main(argv: list[str] | None = None) -> int:
    from sme2farm.runners.zoo import DTYPES, ZOO

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/sme2farm-attribution"))
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--runner", default=str(REPO / "runners/build/linux-x86_64/sme2farm_runner"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"{'model':18} {'dtype':5} {'status':10} {'attributed':>10} {'delegated':>9} {'rows':>5} {'ambig':>5} "
          f"{'conv ok':>8} {'gemm ok':>8} {'read ms':>8} {'analyze ms w/o, with':>21}")
    for name in a.models.split(","):
        for dtype in a.dtypes.split(","):
            try:
                s = survey(name, dtype, a.out, a.runner)
            except Exception as e:  # one line per failing case, the survey goes on
                print(f"{name:18} {dtype:5} failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}")
                continue
            print(f"{name:18} {dtype:5} {s['status']:10} {s['share']:>10.1%} {s['delegated_share']:>9.1%} "
                  f"{s['rows']:>5} {s['ambiguous']:>5} {s['conv_ok']:>8} {s['gemm_ok']:>8} {s['read_ms']:>8.1f} "
                  f"{s['plain_ms']:>10.1f} {s['attr_ms']:>10.1f}" + (f"  not ok: {s['bad'][:3]}" if s["bad"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
