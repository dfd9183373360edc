"""A new user's first hour (issue 15): what stops a farm from starting is one plain line from
`sme2-farm up`/`demo` (a taken port, an unusable data dir), `make demo` takes PORT= and
DATA_DIR=, and experiments are named after their model file. Real processes throughout."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _farm(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sme2farm.server.farm", *argv], capture_output=True, text=True,
                          timeout=timeout)


def test_a_taken_port_is_one_line_from_up_and_demo(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for cmd in ("up", "demo"):
            done = _farm(cmd, "--port", str(port), "--data-dir", str(tmp_path / "data"), "--ready-timeout", "5")
            assert done.returncode == 1, done
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert f"port {port} on 127.0.0.1 is already in use" in lines[0]
            assert f"--port {port + 1}" in lines[0] and "PORT=" in lines[0]
            assert "Traceback" not in done.stdout + done.stderr
        # nothing was started: no child's log, no database
        assert not (tmp_path / "data" / "logs").exists()


def test_an_unusable_data_dir_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for data_dir in (blocker, blocker / "sub"):
        done = _farm("up", "--port", "1", "--data-dir", str(data_dir))  # the data dir is checked first
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"the data dir {data_dir} is not a directory" in lines[0] and "--data-dir" in lines[0]


def test_port_and_data_dir_checks_pass_a_free_port_and_a_new_dir(tmp_path):
    from sme2farm.server.farm import data_dir_problem, port_problem

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert port_problem("127.0.0.1", port) is None
    assert data_dir_problem(tmp_path / "new" / "dir") is None
    assert (tmp_path / "new" / "dir").is_dir() and not list((tmp_path / "new" / "dir").iterdir())  # the probe is gone


def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    from sme2farm.server import farm

    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    monkeypatch.delenv("CXX", raising=False)
    assert farm._compiler() is None
    monkeypatch.setenv("CXX", sys.executable)  # any executable named by $CXX counts
    assert farm._compiler() == sys.executable


def test_make_demo_passes_port_and_data_dir():
    done = subprocess.run(["make", "-n", "-C", str(REPO), "demo", "PORT=8123", "DATA_DIR=/tmp/farm2"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "sme2-farm demo --port 8123 --data-dir /tmp/farm2" in done.stdout
    done = subprocess.run(["make", "-n", "-C", str(REPO), "up"], capture_output=True, text=True, timeout=30)
    # unset DATA_DIR leaves the farm's own default (SME2_DATA_DIR, else .farm)
    assert "sme2-farm up --port 8000" in done.stdout and "--data-dir" not in done.stdout
