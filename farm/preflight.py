"""What the farm checks and prepares before anything starts, each problem told in one line: the
settings for a data dir, the data dir (writable, private), the port, the C++ compiler."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
from pathlib import Path

from sme2farm.server.config import Settings

log = logging.getLogger("sme2-farm")


def settings_for(data_dir: str | None) -> Settings:
    """The farm's settings, with --data-dir over SME2_DATA_DIR when given. Settings that break
    each other (server/config.py) are one line each, not a traceback."""
    from pydantic import ValidationError

    try:
        return Settings(**({"data_dir": Path(data_dir)} if data_dir else {}))
    except ValidationError as e:
        raise SystemExit("sme2-farm: " + "; ".join(
            (f"SME2_{'_'.join(map(str, err['loc'])).upper()}: " if err["loc"] else "")
            + err["msg"].removeprefix("Value error, ") for err in e.errors()))


def secure_data_dir(path: Path) -> None:
    """umask 077 for this process and its children (every file the farm writes is the user's
    alone), and the data dir itself 0700: it holds the token, the database and everyone's models."""
    os.umask(0o077)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        log.info("data dir %s was readable by others; now 0700", path)
        path.chmod(0o700)


def port_problem(host: str, port: int) -> str | None:
    """Whether uvicorn could listen on host:port, told before anything starts (not as the server
    process's exit code, its cause only inside a JSON log line). SO_REUSEADDR as uvicorn sets it,
    so a port in TIME_WAIT from a farm just stopped is not "taken"."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on {host}: the host name does not resolve ({e.strerror}); pass --host 127.0.0.1"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except PermissionError:
            return (f"port {port} on {host} needs privileges to listen on: pick a port above 1023 with --port "
                    f"(make demo PORT=8001)")
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is already in use (another farm or server?): stop it, or pick "
                        f"another port with --port {port + 1} (make demo PORT={port + 1})")
            return f"cannot listen on {host}:{port} ({e.strerror}): pick another --host or --port"
    return None


def data_dir_problem(path: Path) -> str | None:
    """Whether the farm can keep its database, token and models in `path`: created if missing, then
    a file written and removed, so an unwritable or unreadable directory is one line, not a traceback."""
    where = path.resolve()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)  # as secure_data_dir makes it
        os.listdir(where)
        probe = where / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        what = "is not a directory" if isinstance(e, (NotADirectoryError, FileExistsError)) else \
            f"cannot be read and written ({e.strerror})"
        return (f"the data dir {where} {what}: pick another with --data-dir DIR "
                f"(make demo DATA_DIR=DIR), or fix its permissions")
    return None


def compiler() -> str | None:
    """The C++ compiler CMake would find: $CXX, else c++, g++ or clang++ on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)
