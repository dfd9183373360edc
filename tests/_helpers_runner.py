"""Running the locally built runner by hand, as the tests that check its command line do: its
output read back (the tokens LLM mode fed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _fixtures_runtime import resolved_runner

def run_local_runner(local_runner, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """local_runner's executor_runner with `args`, in `cwd`; its exit status and output, whatever they are."""
    return subprocess.run([resolved_runner(local_runner), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def fed_tokens(stdout: str) -> list[int]:
    """The tokens the runner's last generation decoded (greedy), from the one line its output gives them on."""
    [line] = [x for x in stdout.splitlines() if x.startswith("Decode fed (greedy, the last generation):")]
    return [int(t) for t in line.split(":", 1)[1].split()]
