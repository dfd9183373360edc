"""adb plumbing for the Android driver: one adb server on one port, and the calls the driver makes
through it (a shell with an exit status, push/pull with retries, sha256 on the device), each
failure classified as "the device went away" or a plain error.

    Adb(port=None, *, adb_path=None, shell_timeout_s=60.0, pull_attempts=3, pull_retry_s=1.0, sleep=time.sleep)

port: the adb server's port (default $ANDROID_ADB_SERVER_PORT or 5037). ensure_server() starts that
server (`adb -P PORT start-server`) when none answers, and never another one. Scripts reach the
phone's shell as strings that shell parses: callers build them with shlex.join / shlex.quote.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Callable

import adbutils
from adbutils.errors import AdbError

from sme2farm.agent.drivers.base import DriverError

EXIT_MARK = "__SME2FARM_EXIT__"
ADB_ERRORS = (AdbError, OSError, EOFError)


class _Connection(adbutils.AdbConnection):
    def _safe_connect(self):
        # adbutils would run `adb start-server` on the *default* port when the connection fails;
        # this driver owns exactly one server (its port) and starts it itself.
        return self._create_socket()


class _Client(adbutils.AdbClient):
    def make_connection(self, timeout: float | None = None) -> adbutils.AdbConnection:
        conn = _Connection(self.host, self.port)
        if timeout:
            conn.conn.settimeout(timeout)
        return conn


class Adb:
    def __init__(self, port: int | None = None, *, adb_path: str | None = None, shell_timeout_s: float = 60.0,
                 pull_attempts: int = 3, pull_retry_s: float = 1.0, sleep: Callable[[float], None] = time.sleep):
        self.port = port or int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
        self.client = _Client(port=self.port)
        self.adb_path = adb_path or adbutils.adb_path()
        self.shell_timeout_s = shell_timeout_s
        self.pull_attempts, self.pull_retry_s = pull_attempts, pull_retry_s
        self.sleep = sleep

    # ---- the server ------------------------------------------------------------------------

    def server_up(self) -> bool:
        try:
            self.client.server_version()
            return True
        except ADB_ERRORS:
            return False

    def ensure_server(self, timeout_s: float = 10.0) -> bool:
        """True when the adb server answers, starting it on our port if needed; never raises."""
        if self.server_up():
            return True
        try:
            subprocess.run([self.adb_path, "-P", str(self.port), "start-server"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError):
            return False
        return self.server_up()

    def devices(self) -> dict[str, str]:
        """serial -> adb state ("device", "offline", "unauthorized", ...); raises ADB_ERRORS."""
        return {d.serial: d.state for d in self.client.list()}

    def connect(self, addr: str, timeout: float = 5) -> None:
        self.client.connect(addr, timeout=timeout)

    def state(self, serial: str) -> str | None:
        try:
            return self.devices().get(serial)
        except ADB_ERRORS:
            return None

    def failure(self, serial: str, reason: str) -> DriverError:
        """A failed adb call means either the device went away (offline it) or a plain error."""
        state = self.state(serial)
        if state != "device":
            return DriverError(f"device {serial} disconnected ({state or 'gone'}): {reason}", device_lost=True)
        return DriverError(reason)

    # ---- calls on a device -----------------------------------------------------------------

    def shell(self, serial: str, script: str, timeout: float | None = None) -> tuple[int, str]:
        """Run a script on the phone; (exit status, output). The legacy shell service carries no
        exit status, so the script echoes it after a marker."""
        try:
            out = self.client.device(serial).shell(f"{script}; echo {EXIT_MARK}$?",
                                                   timeout=timeout or self.shell_timeout_s, rstrip=False)
        except ADB_ERRORS as e:
            raise self.failure(serial, f"adb shell failed: {e}") from None
        m = re.search(rf"{EXIT_MARK}(\d+)\s*$", out)
        if not m:
            raise self.failure(serial, f"adb shell ended early: {out[-300:]!r}")
        return int(m.group(1)), out[:m.start()]

    def checked(self, serial: str, script: str, what: str) -> str:
        code, out = self.shell(serial, script)
        if code:
            raise DriverError(f"{what} failed on {serial} (exit {code}): {out.strip()[-500:]}")
        return out

    def stream(self, serial: str, script: str):
        """A shell whose output the caller reads as it comes (adbutils' AdbConnection)."""
        try:
            return self.client.device(serial).shell(script, stream=True)
        except ADB_ERRORS as e:
            raise self.failure(serial, f"could not start the runner: {e}") from None

    def sha256s(self, serial: str, paths: list[str]) -> dict[str, str]:
        """sha256 of each remote file that exists (missing ones are simply absent)."""
        _, out = self.shell(serial, shlex.join(["sha256sum", "--", *paths]) + " 2>/dev/null")
        sums = {}
        for line in out.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                sums[parts[1].strip()] = parts[0]
        return sums

    def push(self, serial: str, local: Path, remote: str, mode: int) -> None:
        try:
            self.client.device(serial).sync.push(local, remote, mode=mode)
        except ADB_ERRORS as e:
            raise self.failure(serial, f"pushing {local.name} to {remote} failed: {e}") from None

    def pull(self, serial: str, remote: str, local: Path) -> bool:
        """Pull if the file exists; retried because pulls can fail right after a run (docs/design.md,
        "Android over adb")."""
        sync = self.client.device(serial).sync
        for attempt in range(1, self.pull_attempts + 1):
            try:
                if sync.stat(remote).mode == 0:
                    return False
                sync.pull_file(remote, local)
                return True
            except ADB_ERRORS as e:
                error = self.failure(serial, f"pulling {remote} failed after {attempt} attempt(s): {e}")
                if error.device_lost or attempt == self.pull_attempts:
                    raise error from None
                self.sleep(self.pull_retry_s)
        return False
