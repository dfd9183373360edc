"""Android phones over adb: adbutils talking to its bundled adb server.

    AndroidDriver(adb_port=None, *, connect=(), gate=None, remote_root="/data/local/tmp/sme2farm")

adb_port: the adb server's port (default $ANDROID_ADB_SERVER_PORT or 5037); the driver starts that
server (`adb -P PORT start-server`) when none answers, and never another one. connect: host:port
addresses to `adb connect` on every discover() (Wi-Fi / TCP devices). gate: hygiene.GateConfig.

On the phone, under remote_root:
    runners/<runner sha256>/runner (+ extra files such as libc++_shared.so)
        a cache: pushed once, checked with sha256sum on the device before every run
    runs/<run id>/model.pte, runner.log, trace.etdump
        one directory per run, removed in cleanup
Every command reaches the phone's shell as a string that shell parses, so each one is built from
an argv list with shlex.join / shlex.quote: no value from a spec is ever pasted in unquoted.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import adbutils
from adbutils.errors import AdbError

from sme2farm.agent.drivers import cpuinfo, hygiene
from sme2farm.agent.drivers.base import ETDUMP_NAME, INPUTS_NAME, KERNEL_LOG_NAME, LOG_NAME, Driver, DriverError, Job, require_runner, tail
from sme2farm.protocol import DeviceInfo
from sme2farm.runners.catalog import sha256_file

RUNNER_PLATFORM = "android-arm64-v9a"
RUNNER_NAME = "runner"
EXIT_MARK = "__SME2FARM_EXIT__"
PID_MARK = "__SME2FARM_PID__"
SEP = "__SME2FARM_SEP__"
XNN_LOG_LEVEL = "5"   # debug: XNNPACK logs every microkernel it picks ("Using ... microkernel")
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


@dataclass
class _Staged:
    run_dir: str
    runner_dir: str
    previous_settings: dict[str, str] = field(default_factory=dict)
    thermal_status: int | None = None


class AndroidDriver(Driver):
    platform = "android"

    def __init__(self, adb_port: int | None = None, *, connect: Sequence[str] = (),
                 gate: hygiene.GateConfig | None = None, remote_root: str = "/data/local/tmp/sme2farm",
                 adb_path: str | None = None, shell_timeout_s: float = 60.0,
                 pull_attempts: int = 3, pull_retry_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.port = adb_port or int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
        self.client = _Client(port=self.port)
        self.adb_path = adb_path or adbutils.adb_path()
        self.connect = list(connect)
        self.gate = gate or hygiene.GateConfig()
        self.remote_root = remote_root.rstrip("/")
        self.shell_timeout_s = shell_timeout_s
        self.pull_attempts, self.pull_retry_s = pull_attempts, pull_retry_s
        self.sleep = sleep
        self._staged: dict[tuple[str, int], _Staged] = {}

    # ---- adb plumbing ----------------------------------------------------------------------

    def _server_up(self) -> bool:
        try:
            self.client.server_version()
            return True
        except ADB_ERRORS:
            return False

    def ensure_server(self, timeout_s: float = 10.0) -> bool:
        """True when the adb server answers, starting it on our port if needed; never raises."""
        if self._server_up():
            return True
        try:
            subprocess.run([self.adb_path, "-P", str(self.port), "start-server"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError):
            return False
        return self._server_up()

    def _adb_state(self, serial: str) -> str | None:
        try:
            return {d.serial: d.state for d in self.client.list()}.get(serial)
        except ADB_ERRORS:
            return None

    def _failure(self, serial: str, reason: str) -> DriverError:
        """A failed adb call means either the device went away (offline it) or a plain error."""
        state = self._adb_state(serial)
        if state != "device":
            return DriverError(f"device {serial} disconnected ({state or 'gone'}): {reason}", device_lost=True)
        return DriverError(reason)

    def _shell(self, serial: str, script: str, timeout: float | None = None) -> tuple[int, str]:
        """Run a script on the phone; (exit status, output). The legacy shell service carries no
        exit status, so the script echoes it after a marker."""
        try:
            out = self.client.device(serial).shell(f"{script}; echo {EXIT_MARK}$?",
                                                   timeout=timeout or self.shell_timeout_s, rstrip=False)
        except ADB_ERRORS as e:
            raise self._failure(serial, f"adb shell failed: {e}") from None
        m = re.search(rf"{EXIT_MARK}(\d+)\s*$", out)
        if not m:
            raise self._failure(serial, f"adb shell ended early: {out[-300:]!r}")
        return int(m.group(1)), out[:m.start()]

    def _checked(self, serial: str, script: str, what: str) -> str:
        code, out = self._shell(serial, script)
        if code:
            raise DriverError(f"{what} failed on {serial} (exit {code}): {out.strip()[-500:]}")
        return out

    def _sha256s(self, serial: str, paths: list[str]) -> dict[str, str]:
        """sha256 of each remote file that exists (missing ones are simply absent)."""
        _, out = self._shell(serial, shlex.join(["sha256sum", "--", *paths]) + " 2>/dev/null")
        sums = {}
        for line in out.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
                sums[parts[1].strip()] = parts[0]
        return sums

    def _push(self, serial: str, local: Path, remote: str, mode: int) -> None:
        try:
            self.client.device(serial).sync.push(local, remote, mode=mode)
        except ADB_ERRORS as e:
            raise self._failure(serial, f"pushing {local.name} to {remote} failed: {e}") from None

    def _pull(self, serial: str, remote: str, local: Path) -> bool:
        """Pull if the file exists; retried because pulls can fail right after a run (ANDROID.md)."""
        sync = self.client.device(serial).sync
        for attempt in range(1, self.pull_attempts + 1):
            try:
                if sync.stat(remote).mode == 0:
                    return False
                sync.pull_file(remote, local)
                return True
            except ADB_ERRORS as e:
                error = self._failure(serial, f"pulling {remote} failed after {attempt} attempt(s): {e}")
                if error.device_lost or attempt == self.pull_attempts:
                    raise error from None
                self.sleep(self.pull_retry_s)
        return False

    # ---- discovery -------------------------------------------------------------------------

    def discover(self) -> list[DeviceInfo]:
        if not self.ensure_server():
            return []
        try:
            listed = {d.serial: d.state for d in self.client.list()}
            missing = [a for a in self.connect if listed.get(a) != "device"]
            for addr in missing:
                try:
                    self.client.connect(addr, timeout=5)
                except ADB_ERRORS:
                    pass   # unreachable now; it shows as offline or not at all, tried again next time
            if missing:
                listed = {d.serial: d.state for d in self.client.list()}
        except ADB_ERRORS:
            return []
        devices = []
        for serial, state in sorted(listed.items()):
            if state == "device":
                try:
                    devices.append(self._describe(serial))
                    continue
                except DriverError:
                    state = "offline"
            devices.append(DeviceInfo(serial=serial, platform="android",
                                      state="unhealthy" if state == "unauthorized" else "offline"))
        return devices

    def describe(self, serial: str) -> DeviceInfo:
        return self._describe(serial)

    def _describe(self, serial: str) -> DeviceInfo:
        _, out = self._shell(serial, f"getprop; echo {SEP}; cat /proc/cpuinfo")
        props_text, _, cpu = out.partition(f"{SEP}\n")
        props = dict(re.findall(r"^\[([^\]]+)\]: \[(.*)\]$", props_text, re.M))
        soc = " ".join(filter(None, (props.get("ro.soc.manufacturer"), props.get("ro.soc.model"))))
        abi = props.get("ro.product.cpu.abi", "")
        sme2 = cpuinfo.has_sme2(cpu)
        return DeviceInfo(
            serial=serial, platform="android", model=props.get("ro.product.model", ""),
            soc=soc or props.get("ro.board.platform", ""), cpu_cores=cpuinfo.core_count(cpu), abi=abi,
            os_version=f"Android {props['ro.build.version.release']}" if "ro.build.version.release" in props else "",
            sme2=sme2,
            sme2_evidence=f"/proc/cpuinfo features {'list' if sme2 else 'do not list'} sme2" if cpu.strip() else "",
            runner_platform=RUNNER_PLATFORM if abi == "arm64-v8a" else None, state="idle")

    def health(self, serial: str) -> dict[str, Any]:
        _, out = self._shell(serial, f"dumpsys thermalservice; echo {SEP}; dumpsys battery; echo {SEP}; "
                                     + hygiene.THERMAL_ZONES_SCRIPT)
        parts = out.split(f"{SEP}\n")
        if len(parts) != 3:
            raise DriverError(f"unreadable thermal/battery state from {serial}: {out[-300:]!r}")
        reading = hygiene.parse_thermalservice(parts[0])
        reading["battery"] = hygiene.parse_battery(parts[1])
        reading["zones_c"] = hygiene.parse_thermal_zones(parts[2])
        return reading

    # ---- a run -----------------------------------------------------------------------------

    def prepare(self, serial: str, job: Job) -> dict[str, Any]:
        require_runner(job, RUNNER_PLATFORM)
        runner = Path(job.runner.path)
        # Extra files (libc++_shared.so) are registered beside the runner binary (catalog paths are
        # relative to the manifest, which the agent resolved for the binary only): find them there.
        files = {RUNNER_NAME: runner, **{Path(e).name: Path(e) if Path(e).is_absolute() else runner.parent / Path(e).name
                                         for e in job.runner.extra_files}}
        for local in files.values():
            if not local.is_file():
                raise DriverError(f"runner file {local} is missing on the agent host")
        before: dict[str, Any] = {"reading": self.health(serial)}
        local_sums = {name: sha256_file(p) for name, p in files.items()}
        st = _Staged(run_dir=f"{self.remote_root}/runs/{int(job.run_id)}",
                     runner_dir=f"{self.remote_root}/runners/{local_sums[RUNNER_NAME]}",
                     thermal_status=before["reading"].get("thermal_status"))
        self._staged[(serial, job.run_id)] = st
        self._checked(serial, f"rm -rf {shlex.quote(st.run_dir)} && "
                              + shlex.join(["mkdir", "-p", st.run_dir, st.runner_dir]), "creating the run directory")

        t0 = time.monotonic()
        remote = {name: f"{st.runner_dir}/{name}" for name in files}
        present = self._sha256s(serial, list(remote.values()))
        stale = [name for name in files if present.get(remote[name]) != local_sums[name]]
        for name in stale:
            self._push(serial, files[name], remote[name], 0o755)
        run_files = {f"{st.run_dir}/{job.model_name}": job.model_path}
        if job.inputs_path is not None:
            run_files[f"{st.run_dir}/{INPUTS_NAME}"] = job.inputs_path
        for target, local in run_files.items():
            self._push(serial, local, target, 0o644)
        check = self._sha256s(serial, [remote[n] for n in stale] + list(run_files))
        wrong = [p for p, want in [*((remote[n], local_sums[n]) for n in stale),
                                   *((t, sha256_file(l)) for t, l in run_files.items())]
                 if check.get(p) != want]
        if wrong:
            raise DriverError(f"sha256 mismatch on {serial} after pushing {', '.join(wrong)}")
        before["staging"] = {"runner_dir": st.runner_dir, "pushed": stale, "reused": [n for n in files if n not in stale],
                             "seconds": round(time.monotonic() - t0, 3)}

        if job.power_profile != "none":
            keys = hygiene.profile_settings(job.power_profile)
            st.previous_settings = self._settings(serial, keys)
            self._checked(serial, "; ".join(shlex.join(c) for c in hygiene.POWER_PROFILES[job.power_profile]),
                          f"applying power profile {job.power_profile}")
            before["power_profile"] = {"name": job.power_profile, "previous": st.previous_settings,
                                       "applied": self._settings(serial, keys)}
        else:
            before["power_profile"] = {"name": "none"}

        if job.mode == "timing":
            try:
                before["gates"] = hygiene.wait_for_gates(lambda: self.health(serial), hygiene.android_gate_failures,
                                                         self.gate, sleep=self.sleep)
            except hygiene.GateFailed as e:
                before["gates"] = e.record
                raise DriverError(e.reason, state=before) from None
            st.thermal_status = before["gates"]["checks"][-1]["reading"].get("thermal_status")
        else:
            before["gates"] = {"skipped": "trace runs are for kernel evidence, not timing"}
            self._checked(serial, "logcat -c", "clearing logcat")
        return before

    def _settings(self, serial: str, keys: list[str]) -> dict[str, str]:
        out = self._checked(serial, "; ".join(shlex.join(["settings", "get", "global", k]) for k in keys),
                            "reading settings")
        values = out.splitlines()
        if len(values) != len(keys):
            raise DriverError(f"unexpected `settings get` output from {serial}: {out[-300:]!r}")
        return dict(zip(keys, (v.strip() for v in values)))

    def run(self, serial: str, job: Job) -> tuple[int, float]:
        st = self._staged[(serial, job.run_id)]
        argv = ["env", f"LD_LIBRARY_PATH={st.runner_dir}", *(f"{k}={v}" for k, v in sorted(job.runner.env.items()))]
        if job.mode == "trace":
            argv.append(f"XNN_LOG_LEVEL={XNN_LOG_LEVEL}")
        if job.core_mask:
            argv += ["taskset", job.core_mask]
        argv += job.runner_command(f"{st.runner_dir}/{RUNNER_NAME}")
        # `$!` is the runner's pid (env and taskset exec it): printed first so a timeout can kill it.
        script = (f"cd {shlex.quote(st.run_dir)} || exit; {shlex.join(argv)} >{LOG_NAME} 2>&1 & "
                  f"echo {PID_MARK}$!; wait $!; echo {EXIT_MARK}$?")
        t0 = time.monotonic()
        try:
            conn = self.client.device(serial).shell(script, stream=True)
        except ADB_ERRORS as e:
            raise self._failure(serial, f"could not start the runner: {e}") from None
        out = b""
        try:
            conn.conn.settimeout(0.2)   # short reads so cancellation and the deadline are checked
            while True:
                if job.cancel.is_set():
                    self._kill(serial, job, out, "cancelled while the runner was executing")
                if time.monotonic() - t0 > job.timeout_s:
                    self._kill(serial, job, out, f"runner timed out after {job.timeout_s:g} s")
                try:
                    chunk = conn.conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                out += chunk
        finally:
            conn.close()
        wall = time.monotonic() - t0
        m = re.search(rf"{EXIT_MARK}(\d+)\s*$", out.decode(errors="replace"))
        if m:
            return int(m.group(1)), wall
        raise self._failure(serial, f"the device shell ended before the runner finished: {out.decode(errors='replace')[-300:]!r}")

    def _kill(self, serial: str, job: Job, out: bytes, why: str) -> None:
        m = re.search(rf"{PID_MARK}(\d+)", out.decode(errors="replace"))
        if m:
            self._shell(serial, f"kill -9 {int(m.group(1))}")
            why += f"; killed pid {int(m.group(1))} on the device"
        self._pull(serial, f"{self._staged[(serial, job.run_id)].run_dir}/{LOG_NAME}", job.workdir / LOG_NAME)
        raise DriverError(f"{why}: {tail(job.workdir / LOG_NAME)}")

    def collect(self, serial: str, job: Job) -> None:
        st = self._staged[(serial, job.run_id)]
        for name in (ETDUMP_NAME, LOG_NAME):
            self._pull(serial, f"{st.run_dir}/{name}", job.workdir / name)
        if job.mode == "trace":
            out = self._checked(serial, "logcat -d -s XNNPACK", "reading the XNNPACK log")
            (job.workdir / KERNEL_LOG_NAME).write_text(out)

    def cleanup(self, serial: str, job: Job) -> dict[str, Any]:
        st = self._staged.pop((serial, job.run_id), None)
        after: dict[str, Any] = {}
        if st:
            self._checked(serial, shlex.join(["rm", "-rf", st.run_dir]), "removing the run directory")
            if st.previous_settings:
                self._checked(serial, "; ".join(shlex.join(c) for c in hygiene.restore_commands(st.previous_settings)),
                              "restoring settings")
                after["power_profile_restored"] = self._settings(serial, list(st.previous_settings))
        after["reading"] = self.health(serial)
        status = after["reading"].get("thermal_status")
        if st and st.thermal_status is not None and status is not None and status > st.thermal_status:
            # MEASUREMENT.md: a thermal status that rose during the session makes it suspect.
            after["suspect"] = f"thermal status rose from {st.thermal_status} to {status} during the run"
        return after
