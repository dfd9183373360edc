"""The real trace every simulated run uploads: the local runner on the toy_cnn example.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from scale_bench.common import PY


def make_trace(work: Path) -> tuple[bytes, bytes]:
    """Build the local runner, export toy_cnn and run it once: a real ETDump and runner log.
    In child processes, so torch and executorch stay out of this one."""
    manifest = work / "manifest.json"
    subprocess.run([PY, "-m", "sme2farm.runners.build", "--manifest", str(manifest)], check=True,
                   stdout=subprocess.DEVNULL)
    path = Path(json.loads(manifest.read_text())["builds"][0]["path"])
    if not path.is_absolute():
        path = (manifest.parent / path).resolve()
    model = work / "model.pte"
    subprocess.run([PY, "-m", "sme2farm.runners.examples", "toy_cnn", str(model)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = work / "trace"
    run_dir.mkdir()
    (run_dir / "model.pte").write_bytes(model.read_bytes())
    with open(run_dir / "runner.log", "wb") as log:
        subprocess.run([str(path), "--model_path=model.pte", "--num_executions=20", "--warmup=2", "--cpu_threads=1",
                        "--etdump_path=trace.etdump"], cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, check=True)
    return (run_dir / "trace.etdump").read_bytes(), (run_dir / "runner.log").read_bytes()
