"""Doorbells: one farm process cuts another's wait short on this machine, without Redis.

The embedded farm (SQLite, the SQLite broker) has no Redis to carry news between its processes,
so its waits were polls: the worker looked at the broker's table every SME2_BROKER_POLL_S, a
waiting claim at the database every 50 ms (infra/wakeup.py POLL_S). A doorbell is a Unix
datagram socket that a waiting process binds in a folder next to the broker's database; `ring`
sends a datagram (a payload, or none) to every socket in that folder, and the waits return at
once instead of at their next poll (server/queue.py: a task sent; infra/wakeup.py: runs
assigned to an agent).

A bell only makes a wait shorter: every wait still ends at its poll interval, so a bell that
cannot be bound (no Unix sockets; a data dir whose path is too long for one, on macOS: Linux
names a deep folder through /proc/self/fd), a ring that is lost
or a process that does not ring costs the poll, as before. Production (PostgreSQL + Redis) rings
none: its news goes through Redis.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger(__name__)

# sockaddr_un.sun_path holds 108 bytes on Linux, 104 on macOS (with its terminating NUL)
MAX_PATH_BYTES = 100
_PROC_FD = Path("/proc/self/fd")
_SEQ = itertools.count(1)
_SQLITE = "sqlite:///"


def folder_of(broker_url: str | None, topic: str) -> Path | None:
    """Where the bells of `topic` ring for this broker: beside an embedded broker's SQLite file
    (sqla+sqlite:///PATH, or kombu's sqlite:///PATH once it has taken the prefix off), in
    PATH.bells/topic; None for any other broker (Redis carries the news there)."""
    if not broker_url:
        return None
    url = broker_url.removeprefix("sqla+")
    if not url.startswith(_SQLITE):
        return None
    path = url[len(_SQLITE):].split("?", 1)[0]
    if not path or path.startswith(":memory:") or not hasattr(socket, "AF_UNIX"):
        return None
    return Path(path + ".bells") / topic


@contextlib.contextmanager
def _addressed(folder: Path):
    """The folder as a socket's address names it: its own path, or where that is too long for
    sockaddr_un (a deep data dir, a test's temporary folder), on Linux /proc/self/fd/N of a
    descriptor opened on it, which the kernel resolves to the folder."""
    if len(os.fsencode(folder)) + 24 <= MAX_PATH_BYTES or not _PROC_FD.is_dir():
        yield str(folder)
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"{_PROC_FD}/{fd}"
    finally:
        os.close(fd)


class Doorbell:
    """A socket bound in `folder` that `ring(folder, ...)` reaches; `bound` is False when it
    could not be (the waits then poll, as without it)."""

    def __init__(self, folder: Path | None):
        self.path: Path | None = None
        self.sock: socket.socket | None = None
        if folder is None:
            return
        name = f"{os.getpid()}.{next(_SEQ)}"
        path = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                path.unlink(missing_ok=True)  # a dead process's with this pid
                with _addressed(folder) as where:
                    if len(os.fsencode(f"{where}/{name}")) > MAX_PATH_BYTES:
                        raise OSError(f"the path is longer than a Unix socket's {MAX_PATH_BYTES} bytes")
                    sock.bind(f"{where}/{name}")
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        except OSError as e:
            log.info("no doorbell in %s (%s): waits there poll", folder, e)
            return
        self.sock, self.path = sock, path

    @property
    def bound(self) -> bool:
        return self.sock is not None

    def fileno(self) -> int:
        assert self.sock is not None
        return self.sock.fileno()

    def read(self) -> list[bytes]:
        """The rings that arrived (their payloads), without waiting."""
        out: list[bytes] = []
        while self.sock is not None:
            try:
                out.append(self.sock.recv(65536))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
        return out

    def wait(self, timeout: float) -> list[bytes]:
        """Until a ring (its payloads, with any others waiting) or `timeout` seconds ([])."""
        if self.sock is None:
            time.sleep(max(timeout, 0.0))
            return []
        sock = self.sock
        try:  # a socket timeout (poll(2) underneath: no select() limit on the descriptor's number)
            sock.settimeout(max(timeout, 0.0))
            first = sock.recv(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return []
        except OSError:  # closed meanwhile
            return []
        finally:
            try:
                sock.setblocking(False)
            except OSError:
                pass
        return [first, *self.read()]

    def close(self) -> None:
        sock, path, self.sock, self.path = self.sock, self.path, None, None
        if sock is not None:
            sock.close()
        if path is not None:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass


def ring(folder: Path | None, payload: bytes = b"") -> int:
    """Ring every bell bound in `folder` (none: nothing); how many were rung. Never raises and
    never blocks: a bell whose queue is full has been rung already, and a socket nobody is bound
    to any more (its process died) is removed."""
    if folder is None:
        return 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    rung = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s, _addressed(folder) as where:
            s.setblocking(False)
            for name in names:
                path = folder / name
                try:
                    s.sendto(payload, f"{where}/{name}")
                    rung += 1
                except (BlockingIOError, InterruptedError):
                    rung += 1  # its queue is full of rings it has not read yet
                except ConnectionRefusedError:
                    try:
                        path.unlink(missing_ok=True)
                    except OSError:
                        pass
                except OSError as e:  # gone meanwhile, not a socket, ...: its waits poll
                    log.debug("could not ring %s: %s", path, e)
    except OSError as e:
        log.debug("could not ring the bells in %s: %s", folder, e)
    return rung
