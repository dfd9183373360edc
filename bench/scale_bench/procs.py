"""The farm's processes (server, worker, beat) and the CPU they and PostgreSQL's backends use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class Procs:
    def __init__(self, logs: Path, env: dict):
        self.logs, self.env, self.procs = logs, env, {}
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=self.logs)

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def cpu_ticks(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes and all their descendants, from /proc."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    hz = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(d))
        stats[int(d)] = (int(fields[11]) + int(fields[12])) / hz
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += stats.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


def postgres_backends(db_name: str) -> list[int]:
    """The PostgreSQL backends serving this database (their process title names it)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"postgres:") and f" {db_name} ".encode() in cmd:
                out.append(int(d))
    return out


def pg_cpu(db_name: str, since: dict | None = None):
    """Per-backend CPU seconds now, or (given an earlier reading) the CPU used since it: backends
    opened in between count whole, ones closed in between are missed (pools keep theirs)."""
    now = {pid: cpu_ticks([pid]) for pid in postgres_backends(db_name)}
    return now if since is None else sum(v - since.get(pid, 0.0) for pid, v in now.items())
