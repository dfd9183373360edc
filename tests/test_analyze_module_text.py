"""sme2-client analyze's time-by-module text on a real attributed trace: its depth-1 rows and the
rest add up to E2E, the model's own operators (a top-level mean) included as '(top level)', as
report --by module shows them."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from _fixtures_attribution import attributed_model  # noqa: F401
from _fixtures_runtime import resolved_runner


def test_analyze_module_lines_add_up_to_e2e_with_the_models_own_operators(
        attributed_model, local_runner, tmp_path):  # noqa: F811
    pte, _ = attributed_model("dominant")  # forward calls x.mean itself: a portable kernel outside any submodule
    trace = tmp_path / "t.etdump"
    subprocess.run([resolved_runner(local_runner), f"--model_path={pte}", "--num_executions=10", "--warmup=1",
                    f"--etdump_path={trace}"], check=True, capture_output=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "sme2farm.client.main", "analyze", str(trace), "--model", str(pte),
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json

    e2e = json.loads(r.stdout)["e2e_ms"]["mean"]
    r = subprocess.run([sys.executable, "-m", "sme2farm.client.main", "analyze", str(trace), "--model", str(pte)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = r.stdout.split("time by module (", 1)[1].split("top call sites:", 1)[0]
    rows = [re.match(r"^( *)(\S.*?)\s+(\d+\.\d+)\s+\d+\.\d%", line) for line in text.splitlines()[1:]]
    depth1 = {m.group(2): float(m.group(3)) for m in rows if m and len(m.group(1)) == 2}
    assert "(top level)" in depth1 and depth1["(top level)"] > 0, text
    assert "not attributed" in depth1, text
    assert sum(depth1.values()) == pytest.approx(e2e, abs=0.002 * len(depth1)), text
