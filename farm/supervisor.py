"""A small process supervisor: what keeps `sme2-farm up` up.

- Starts each child (server, worker, beat, local agent) in its own session, output to
  <data dir>/logs/<name>.log.
- Restarts a child that exits, after a backoff that doubles from `backoff_s` up to
  `backoff_max_s` and starts again from `backoff_s` once a child has run `healthy_s` without
  exiting. Each exit and restart is logged.
- A crash loop is named, not only retried: a child that exits `crash_loop_exits` times in a row,
  each time within `healthy_s` of starting, is marked `crash_loop` in the status file with the
  count, since when, and its last exit ("killed by SIGBUS"), and /ready fails
  `supervisor.<child>` saying so until the child has run `healthy_s` again. One error line is
  logged when the loop begins, not one per restart only.
- stop(): SIGTERM to every child's process group (last started first), SIGKILL to any still
  running after `grace_s`, or at once on a second Ctrl-C.
- Children die with the supervisor even when it is killed with SIGKILL: on Linux each child asks
  the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), then checks its parent is
  still the supervisor, in case the supervisor died between fork and prctl. The kernel ties this
  to the *thread* that forked, so children are only ever started from the supervisor's main thread
  (poll() is called from there). Elsewhere (macOS) there is no such call: stop() still stops
  them, SIGKILL of the supervisor does not.
- Writes each child's state to a JSON status file (atomically, 0600 under the farm's umask)
  whenever it changes and every `status_every_s`, for /ready and /metrics; into blocks allocated
  once, so a full disk does not stop it (_write_status).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sme2farm.server.store.artifacts import allocate

log = logging.getLogger("sme2farm.supervisor")

PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child
    except OSError:
        _libc = None


def die_with_parent(parent_pid: int):
    """preexec_fn for a child: SIGKILL it when `parent_pid` dies. Runs between fork and exec, so
    it only calls async-signal-safe functions (prctl, getppid, kill)."""

    def setup() -> None:
        if _libc is None:
            return
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    state: str = "new"  # new | running | backoff | stopped
    restarts: int = 0
    last_exit: int | None = None
    started: float = 0.0  # monotonic
    started_wall: float = 0.0
    next_start: float = 0.0  # monotonic, while in backoff
    delay: float = 0.0  # the next backoff
    exits: list[float] = field(default_factory=list)
    quick_exits: int = 0  # exits in a row, each within healthy_s of starting
    quick_since: float = 0.0  # wall time of the first of them
    crash_loop: bool = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.state == "running" else None


class Supervisor:
    def __init__(self, logs_dir: Path, status_path: Path | None = None, *, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0, healthy_s: float = 60.0, grace_s: float = 10.0,
                 status_every_s: float = 2.0, crash_loop_exits: int = 3):
        self.logs_dir, self.status_path = logs_dir, status_path
        self.backoff_s, self.backoff_max_s, self.healthy_s, self.grace_s = backoff_s, backoff_max_s, healthy_s, grace_s
        self.crash_loop_exits = crash_loop_exits
        self.status_every_s = status_every_s
        self.children: dict[str, Child] = {}
        self.pid = os.getpid()
        self._status_written = 0.0
        self._hurry = False

    # ---- starting ---------------------------------------------------------------------------
    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Child:
        child = Child(name, argv, env, delay=self.backoff_s)
        self.children[name] = child
        self._spawn(child)
        return child

    def _spawn(self, child: Child) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.logs_dir / f"{child.name}.log", "ab") as out:
            child.proc = subprocess.Popen(child.argv, env=child.env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=die_with_parent(self.pid))
        child.state, child.started, child.started_wall = "running", time.monotonic(), time.time()
        self.write_status()

    # ---- watching ---------------------------------------------------------------------------
    def exited(self) -> list[Child]:
        """Children that have exited since they were last started (not yet restarted)."""
        out = []
        for child in self.children.values():
            if child.state == "running" and child.proc.poll() is not None:
                out.append(child)
        return out

    def poll(self) -> None:
        """Reap exited children and schedule their restart; restart those whose backoff is over.
        Call it often (every ~0.2 s) from the main thread."""
        now = time.monotonic()
        changed = False
        for child in self.exited():
            code = child.proc.returncode
            ran = now - child.started
            if ran >= self.healthy_s:  # it had been fine for a while: this is a fresh failure
                child.delay = self.backoff_s
                child.quick_exits, child.crash_loop = 0, False
            child.state, child.last_exit, child.next_start = "backoff", code, now + child.delay
            child.exits.append(time.time())
            del child.exits[:-20]  # a long crash loop must not grow the supervisor
            if ran < self.healthy_s:
                if child.quick_exits == 0:
                    child.quick_since = child.exits[-1]
                child.quick_exits += 1
                if child.quick_exits >= self.crash_loop_exits and not child.crash_loop:
                    child.crash_loop = True
                    log.error("%s is in a crash loop: %d exits in a row in %.0f s, each within %g s of starting; "
                              "the last %s; restarts back off up to %g s (see %s)", child.name, child.quick_exits,
                              child.exits[-1] - child.quick_since, self.healthy_s, describe_exit(code),
                              self.backoff_max_s, self.logs_dir / f"{child.name}.log", extra={"child": child.name})
            # Whatever it left in its process group (a killed agent's runner) goes with it.
            _signal_group(child.proc, signal.SIGKILL)
            log.warning("%s (pid %d) %s after %.1f s; restarting in %g s (restart #%d; see %s)",
                        child.name, child.proc.pid, describe_exit(code), ran, child.delay, child.restarts + 1,
                        self.logs_dir / f"{child.name}.log", extra={"child": child.name})
            child.delay = min(child.delay * 2, self.backoff_max_s)
            changed = True
        for child in self.children.values():
            if child.state == "running" and child.crash_loop and now - child.started >= self.healthy_s:
                log.warning("%s has run %g s since its last restart: out of its crash loop", child.name,
                            self.healthy_s, extra={"child": child.name})
                child.quick_exits, child.crash_loop, child.delay = 0, False, self.backoff_s
                changed = True
            if child.state == "backoff" and now >= child.next_start:
                child.restarts += 1
                try:
                    self._spawn(child)
                except OSError as e:  # e.g. out of file descriptors: try again after the next backoff
                    child.next_start = now + child.delay
                    log.error("could not restart %s: %s", child.name, e, extra={"child": child.name})
                    continue
                log.warning("%s restarted as pid %d (restart #%d)", child.name, child.proc.pid, child.restarts,
                            extra={"child": child.name})
                changed = True
        if changed or time.monotonic() - self._status_written >= self.status_every_s:
            self.write_status()

    def status(self) -> dict:
        wall, now = time.time(), time.monotonic()
        return {
            "pid": self.pid,
            "updated": wall,
            "healthy_s": self.healthy_s,
            "children": {
                c.name: {"state": c.state, "pid": c.pid, "restarts": c.restarts, "last_exit": c.last_exit,
                         "last_exit_reason": None if c.last_exit is None else describe_exit(c.last_exit),
                         "last_exit_at": c.exits[-1] if c.exits else None,
                         "quick_exits": c.quick_exits, "quick_since": c.quick_since or None,
                         "crash_loop": c.crash_loop,
                         "next_start": wall + max(0.0, c.next_start - now) if c.state == "backoff" else None,
                         "since": c.started_wall, "argv0": Path(c.argv[0]).name}
                for c in self.children.values()
            },
        }

    def write_status(self) -> None:
        self._status_written = time.monotonic()
        if self.status_path is None:
            return
        try:
            _write_status(self.status_path, json.dumps(self.status()).encode())
        except OSError:
            log.exception("could not write %s", self.status_path)

    # ---- stopping ---------------------------------------------------------------------------
    def stop(self) -> None:
        """TERM every running child's process group, last started first; KILL what is left after
        the grace period, or at once if SIGINT/SIGTERM arrives again meanwhile."""

        def hurry(*_):
            self._hurry = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, hurry)
        running = [c for c in reversed(list(self.children.values())) if c.state == "running"]
        for child in running:
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for child in running:
            while child.proc.poll() is None and time.monotonic() < deadline and not self._hurry:
                time.sleep(0.05)
            if child.proc.poll() is None:
                log.warning("%s did not stop within %g s; killing it", child.name, self.grace_s, extra={"child": child.name})
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait()
            # A child's own children (its process group) go too, should any outlive it.
            _signal_group(child.proc, signal.SIGKILL)
        for child in self.children.values():
            child.state = "stopped"
        self.write_status()


STATUS_BYTES = 64 << 10  # the status file's fixed, allocated size (a few children take ~2 KiB)


def _write_status(path: Path, body: bytes) -> None:
    """Replace the status file atomically (readers never see half a file) without needing a free
    block, so /ready stays right on a full disk: two files of STATUS_BYTES allocated once, `path`
    and `path.spare`, trade places. The body goes into the spare, padded with spaces (JSON allows
    trailing white space); the current file keeps its blocks under a second name while the spare
    takes its place, then becomes the spare. Renames and links need no data blocks."""
    if len(body) > STATUS_BYTES:
        raise OSError(errno.EFBIG, f"status of {len(body)} bytes is over {STATUS_BYTES}")
    spare, old = path.with_name(path.name + ".spare"), path.with_name(path.name + ".old")
    fd = os.open(spare, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        allocate(fd, STATUS_BYTES)  # nothing to do once allocated; on a full disk, only the first time fails
        os.pwrite(fd, body.ljust(STATUS_BYTES), 0)
    finally:
        os.close(fd)
    try:
        os.unlink(old)
    except FileNotFoundError:
        pass
    try:
        os.link(path, old)
    except OSError:  # no status file yet (or no hard links here): the spare is made again next time
        os.replace(spare, path)
        return
    os.replace(spare, path)
    os.replace(old, spare)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
