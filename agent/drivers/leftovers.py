"""Runners a killed agent left behind, found and killed by the next agent on this host.

A runner can outlive its agent: on a phone it runs on the device, and on macOS nothing kills a child
whose parent died (on Linux, PR_SET_PDEATHSIG does: see local.run_subprocess). So a driver records
each runner as it starts, in the agent's work dir

    <work dir>/pids/<kind>-<run id>-<agent pid>.json     (0600; kind "process" or "adb")

and removes the record once the runner has ended. A record whose owner (the agent process, known
by pid and start time) is no longer alive is a leftover: the driver that wrote it kills the runner
if it is still the same process (pids are reused: its start time must match, or on a phone its
command line and directory), removes its files, then the record. Records of a live agent, this
one or another sharing the work dir, are never touched.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_identity(pid: int) -> str | None:
    """A name for one process over its lifetime (boot + start time), or None when no live process
    has this pid. Start times tell a reused pid apart from the process that had it before."""
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if Path("/proc/self/stat").exists():
            return None   # Linux, and no such process
        return _ps_identity(pid)
    fields = stat.rsplit(")", 1)[1].split()   # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None       # dead, waiting to be reaped
    return f"{_boot_id()}:{fields[19]}"       # field 22: start time in clock ticks since boot


def _ps_identity(pid: int) -> str | None:
    """Where there is no /proc (macOS): the start time `ps` reports (1 s resolution)."""
    try:
        r = subprocess.run(["ps", "-o", "lstart=", "-p", str(int(pid))], capture_output=True, text=True, timeout=10,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def _alive(owner: dict[str, Any]) -> bool:
    pid = int(owner["pid"])
    if pid <= 0:
        return False      # abandoned by its agent (PidRecords.abandon)
    if owner.get("start"):
        return process_identity(pid) == owner["start"]
    try:              # no start time was recorded: the pid alone has to do
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PidRecords:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.owner = {"pid": os.getpid(), "start": process_identity(os.getpid())}

    def add(self, kind: str, run_id: int, **fields: Any) -> str:
        """Record a runner that just started; returns the key to remove() once it has ended."""
        key = f"{kind}-{int(run_id)}-{os.getpid()}"
        self._write(key, {"kind": kind, "run_id": int(run_id), "owner": self.owner, **fields})
        return key

    def _write(self, key: str, record: dict[str, Any]) -> None:
        tmp = self.dir / f".{key}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.dir / f"{key}.json")   # a reader never sees half a record

    def remove(self, key: str) -> None:
        (self.dir / f"{key}.json").unlink(missing_ok=True)

    def abandon(self, key: str) -> None:
        """The agent lost track of this runner (a phone's shell broke off mid-run): make it a
        leftover now, so it is dealt with when the device is found again, even by this agent."""
        path = self.dir / f"{key}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        self._write(key, {**record, "owner": {"pid": 0, "start": None}})

    def leftovers(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        """(key, record) of every `kind` runner whose agent is gone."""
        found = []
        for path in sorted(self.dir.glob(f"{kind}-*.json")):
            try:
                record = json.loads(path.read_text())
                alive = _alive(record["owner"])
                int(record["pid"]), int(record["run_id"])
            except FileNotFoundError:
                continue      # another driver sharing these records dealt with it
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("dropping unreadable runner record %s: %s", path.name, e)
                path.unlink(missing_ok=True)
                continue
            if not alive:
                found.append((path.stem, record))
        return found

    def done(self, key: str, record: dict[str, Any]) -> None:
        """A leftover dealt with: remove the host run directory it names (only one of this agent's
        work dir) and the record."""
        workdir = record.get("workdir")
        if workdir and Path(workdir).resolve().parent == self.dir.parent.resolve():
            shutil.rmtree(workdir, ignore_errors=True)
        self.remove(key)


def kill_leftover_processes(pids: PidRecords) -> list[str]:
    """Kill host runners (kind "process") whose agent is gone; what was done, one line each."""
    done = []
    for key, record in pids.leftovers("process"):
        pid, start = int(record["pid"]), record.get("start")
        if start and process_identity(pid) == start:
            try:
                os.killpg(pid, signal.SIGKILL)   # the runner leads its own session (start_new_session)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            done.append(f"killed runner pid {pid} left running by run {record['run_id']}")
        pids.done(key, record)
    return done
