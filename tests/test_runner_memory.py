"""The runner's memory figures (runner --memory_file -> memory.json -> the run report's `memory`).

The peak RSS the runner reports is held against what /proc says of the same process from outside
while it runs, started by a large parent (whose RSS a getrusage figure would carry); the planned
buffers against the program's own declaration read by ExecuTorch's deserializer; the file's
reader against hostile content; and a run on the farm must carry the figures into its report.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pytest

from sme2farm.agent.drivers.base import MEMORY_NAME, Job
from sme2farm.analysis.runner_memory import MemoryFileError, read_memory

from _fixtures_runtime import resolved_runner

pytestmark = pytest.mark.models



def _vm_hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def test_peak_rss_is_the_runners_own_and_matches_proc_from_outside(local_runner, example_pte, tmp_path):
    """The runner is started by a parent holding 300 MB (as a Python agent with torch loaded
    would): Linux carries ru_maxrss across execve, so a getrusage figure would say >= 300 MB.
    The reported peak is the runner's own (VmHWM), equal to what /proc/<pid>/status said of it
    from outside while it ran; the planned buffers are what the program declares."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    ballast = b"\x01" * (300 << 20)  # resident in this process
    pte = example_pte("cnn_blocks", blocks=8)
    out = tmp_path / "memory.json"
    proc = subprocess.Popen([resolved_runner(local_runner), f"--model_path={pte}", "--num_executions=3000",
                             f"--memory_file={out}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    readings = []
    while proc.poll() is None:
        if (hwm := _vm_hwm(proc.pid)) is not None:
            readings.append(hwm)
        time.sleep(0.002)
    assert proc.returncode == 0 and readings
    del ballast
    memory = read_memory(out.read_bytes())
    assert memory["rss_source"] == "/proc/self/status VmHWM"
    # The kernel's RSS counters are per CPU and summed approximately, so VmHWM is not exact (read
    # from outside, it can even go down between two reads, and differ by most of a MB from the
    # runner's own reading). Equal within that slack, and nowhere near the parent's 300 MB.
    seen = max(readings)
    assert abs(memory["peak_rss_bytes"] - seen) <= max(1 << 20, seen // 10) and seen < 150 << 20
    assert 1 << 20 < memory["peak_rss_after_load_bytes"] <= memory["peak_rss_bytes"]
    assert memory["execution_rss_growth_bytes"] == memory["peak_rss_bytes"] - memory["peak_rss_after_load_bytes"]
    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    assert memory["planned_buffers_bytes"] == list(plan.non_const_buffer_sizes[1:])  # 0 is reserved
    assert memory["planned_bytes"] == sum(plan.non_const_buffer_sizes[1:]) > 0
    assert memory["method_allocator_bytes"] > 0 and memory["method_allocator_allocations"] > 0
    assert memory["runtime_allocated_bytes"] == (memory["planned_bytes"] + memory["method_allocator_bytes"]
                                                 + memory["temp_allocator_peak_bytes"])


def test_a_bigger_model_takes_more_memory(local_runner, example_pte, tmp_path):
    """20 conv blocks of 64 channels hold MBs more weights than 2 of 16 (the heavy model the
    device-lost test exports too): the runner reads them and XNNPACK packs them (its own mallocs,
    outside the runtime's allocators), so the peak RSS grows by at least the weights' size."""
    figures, sizes = [], []
    for name, kw in (("small", {"blocks": 2}), ("big", {"blocks": 20, "channels": 64, "size": 32})):
        out, pte = tmp_path / f"{name}.json", example_pte("cnn_blocks", **kw)
        subprocess.run([resolved_runner(local_runner), f"--model_path={pte}", f"--memory_file={out}"],
                       capture_output=True, check=True)
        figures.append(read_memory(out.read_bytes()))
        sizes.append(pte.stat().st_size)
    small, big = figures
    assert big["peak_rss_bytes"] - small["peak_rss_bytes"] >= sizes[1] - sizes[0] > 500_000


def test_local_driver_hands_back_the_memory_file(local_runner, example_pte, tmp_path):
    from sme2farm.agent.drivers.local import LocalDriver

    catalog, build = local_runner
    assert build.supports_memory
    build = dataclasses.replace(build, path=str(catalog.resolve(build)))
    job = Job(run_id=1, model_path=example_pte("toy_cnn"), runner=build, threads=1, iterations=1, warmup=0,
              timeout_s=60, workdir=tmp_path)
    assert f"--memory_file={MEMORY_NAME}" in job.runner_args
    [dev] = LocalDriver().discover()
    result = LocalDriver().execute(dev.serial, job)
    assert result.ok, result.reason
    assert result.memory_path == tmp_path / MEMORY_NAME
    assert read_memory(result.memory_path.read_bytes())["peak_rss_bytes"] > 0
    # a build registered without the field (an older manifest, upstream executor_runner) gets no flag
    old = dataclasses.replace(build, supports_memory=False)
    assert not any(a.startswith("--memory_file") for a in dataclasses.replace(job, runner=old).runner_args)


@pytest.mark.parametrize("data,why", [
    (b"[1, 2]", "not a JSON object"),
    (b"{not json", "not JSON"),
    (b'{"peak_rss_bytes": -5}', "peak_rss_bytes must be a non-negative integer"),
    (b'{"peak_rss_bytes": 1.5}', "peak_rss_bytes must be a non-negative integer"),
    (b'{"peak_rss_bytes": true}', "peak_rss_bytes must be a non-negative integer"),
    (b'{"planned_buffers_bytes": "x"}', "planned_buffers_bytes must be a list"),
    (b" " * (65 << 10), "over"),
])
def test_memory_file_reader_refuses_what_the_runner_does_not_write(data, why):
    with pytest.raises(MemoryFileError, match=why):
        read_memory(data)


def test_memory_file_reader_keeps_known_keys_and_nulls():
    memory = read_memory(json.dumps({"peak_rss_bytes": 10, "runtime_allocated_bytes": None, "extra": "x" * 50,
                                     "rss_source": "y" * 500}).encode())
    assert memory["peak_rss_bytes"] == 10 and memory["runtime_allocated_bytes"] is None
    assert "extra" not in memory and len(memory["rss_source"]) == 100
    assert memory["execution_rss_growth_bytes"] is None and memory["planned_buffers_bytes"] == []


@pytest.mark.e2e
def test_farm_run_reports_its_memory(farm, example_pte):
    done = farm.cli("submit", str(example_pte("toy_cnn")), "--sme2", "off", "--iterations", "2", "--warmup", "0",
                    "--wait", "--json")
    assert done.returncode == 0, done.stderr + farm.log("agent")
    [run] = json.loads(done.stdout)["runs"]
    assert run["status"] == "succeeded", run["reason"]
    assert "memory.json" in run["artifacts"]
    memory = run["memory"]
    assert memory["peak_rss_bytes"] > 1 << 20 and memory["planned_bytes"] > 0
    assert memory["runtime_allocated_bytes"] >= memory["planned_bytes"]
    shown = farm.cli("status", str(json.loads(done.stdout)["id"]))
    assert "memory: peak RSS " in shown.stdout, shown.stdout
