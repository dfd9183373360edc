"""Survey: does every zoo architecture x dtype run in the farm's runner? (printed, not asserted)

For each model in runners/zoo.py and each dtype (fp32, fp16, int8): export it (cached in
--out), run it through the local C++ runner (all-ones inputs, warm-up, 3 traced executions)
and through ExecuTorch's Python bindings (the independent reference for "does it run"), compare
the first output's values between the two, and check the farm's analysis of the runner's
ETDump against ExecuTorch's flatcc deserializer (E2E, every category, delegate events per
iteration). Prints one line per case with the exact error of anything that failed.

    python bench/zoo_survey.py [--out DIR] [--models bert,vit] [--dtypes fp16,int8]

Exports take seconds to minutes each (MobileNetV2 and MobileViT are the slow ones); a second
run reuses the exported files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in its own process per program so a crash in the bindings costs one line, not the survey.
PYBIND = r"""
import json, sys, torch
from executorch.extension.pybindings.portable_lib import _load_for_executorch
DT = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
      6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
m = _load_for_executorch(sys.argv[1])
meta = m.method_meta("forward")
ins = [torch.ones(tuple(meta.input_tensor_meta(i).sizes()), dtype=DT[int(meta.input_tensor_meta(i).dtype())])
       for i in range(meta.num_inputs())]
out = m.forward(ins)[0]
print(json.dumps(out.flatten().float()[:1000].tolist()))
"""


def first_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error")]
    return (errors[0] if errors else lines[-1] if lines else "")[:300]


def flatcc_matches(etdump: bytes) -> str:
    """'ok' when the farm's report of this trace equals a plain reading of ExecuTorch's flatcc
    deserializer (the computation tests/test_real_models.py asserts), else what differs."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_real_models import flatcc_figures, mean

    from sme2farm.analysis.categories import CATEGORIES
    from sme2farm.analysis.report import analyze

    rep = analyze(etdump)
    its = flatcc_figures(etdump)["iterations"]
    diffs = [c for c in CATEGORIES if abs(rep["categories_ms"][c] - mean(i["categories"][c] for i in its)) > 1e-9]
    if abs(rep["e2e_ms"]["mean"] - mean(i["e2e"] for i in its)) > 1e-9:
        diffs.append("E2E")
    delegated = sum(op["count"] for op in rep["operators"] if op["delegated"])
    if {i["delegate_events"] for i in its} != {delegated}:
        diffs.append("delegate event count")
    return "ok" if not diffs else "MISMATCH " + ", ".join(diffs)


def main() -> int:
    from sme2farm.runners.build import build_local
    from sme2farm.runners.zoo import DTYPES, ZOO, export_zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(".farm/zoo"))
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runner = build_local(a.out / "manifest.json").path
    print(f"runner: {runner}")
    for name in a.models.split(","):
        for dtype in a.dtypes.split(","):
            case = f"{name}/{dtype}"
            pte = a.out / f"{name}-{dtype}.pte"
            if not pte.exists():
                try:
                    export_zoo(name, dtype, pte)
                except Exception as e:  # noqa: BLE001 - the survey reports every failure and goes on
                    print(f"{case:24} export FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
            etdump = pte.with_suffix(".etdump")
            run = subprocess.run([str(runner), "--model_path", str(pte), "--warmup", "1", "--num_executions", "3",
                                  "--etdump_path", str(etdump), "--print_output"],
                                 capture_output=True, text=True, timeout=600)
            ours = "ok" if run.returncode == 0 else f"FAILED (exit {run.returncode}): {first_error(run.stderr + run.stdout)}"
            ref = subprocess.run([sys.executable, "-c", PYBIND, str(pte)], capture_output=True, text=True, timeout=600)
            theirs = "ok" if ref.returncode == 0 else f"FAILED: {first_error(ref.stderr)}"
            extra = ""
            if run.returncode == 0 and ref.returncode == 0:
                line = next(ln for ln in run.stdout.splitlines() if ln.startswith("Output 0:"))
                values = [float(x) for x in line.split("]", 1)[1].split() if x != "..."]
                expected = json.loads(ref.stdout.strip().splitlines()[-1])[: len(values)]
                diff = max((abs(x - y) for x, y in zip(values, expected)), default=0.0)
                extra = f"  outputs max|diff| {diff:.1e}  flatcc: {flatcc_matches(etdump.read_bytes())}"
            print(f"{case:24} runner {ours}  bindings {theirs}{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
