"""Android phones over adb: the driver (discovery, describe, health, prepare/run/collect/cleanup);
the adb calls themselves are adb.py's.

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

A runner keeps running on the phone when the agent is killed. While it runs, its pid on the phone
is recorded in the agent's work dir (leftovers.py); the next agent on this host, when it finds the
phone, kills it if /proc/<pid> on the phone is still that runner, and removes its run directory.
"""

from __future__ import annotations

import logging
import re
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sme2farm.agent.drivers import hygiene
from sme2farm.agent.drivers.adb import ADB_ERRORS, EXIT_MARK, Adb
from sme2farm.agent.drivers.base import (ETDUMP_NAME, INPUTS_NAME, KERNEL_LOG_NAME, LOG_NAME, MEMORY_NAME, OUTPUTS_NAME,
                                         Driver, DriverError, Job, require_runner, tail)
from sme2farm.protocol import DeviceInfo
from sme2farm.runners import cpuinfo
from sme2farm.runners.catalog import sha256_file

RUNNER_PLATFORM = "android-arm64-v9a"
RUNNER_NAME = "runner"
PID_MARK = "__SME2FARM_PID__"
SEP = "__SME2FARM_SEP__"
XNN_LOG_LEVEL = "5"   # debug: XNNPACK logs every microkernel it picks ("Using ... microkernel")

log = logging.getLogger(__name__)


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
        self.adb = Adb(adb_port, adb_path=adb_path, shell_timeout_s=shell_timeout_s,
                       pull_attempts=pull_attempts, pull_retry_s=pull_retry_s, sleep=sleep)
        self.connect = list(connect)
        self.gate = gate or hygiene.GateConfig()
        self.remote_root = remote_root.rstrip("/")
        self.sleep = sleep
        self._staged: dict[tuple[str, int], _Staged] = {}

    # ---- discovery -------------------------------------------------------------------------

    def discover(self) -> list[DeviceInfo]:
        if not self.adb.ensure_server():
            return []
        try:
            listed = self.adb.devices()
            missing = [a for a in self.connect if listed.get(a) != "device"]
            for addr in missing:
                try:
                    self.adb.connect(addr, timeout=5)
                except ADB_ERRORS:
                    pass   # unreachable now; it shows as offline or not at all, tried again next time
            if missing:
                listed = self.adb.devices()
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
        _, out = self.adb.shell(serial, f"getprop; echo {SEP}; cat /proc/cpuinfo")
        props_text, _, cpu = out.partition(f"{SEP}\n")
        props = dict(re.findall(r"^\[([^\]]+)\]: \[(.*)\]$", props_text, re.M))
        soc = " ".join(filter(None, (props.get("ro.soc.manufacturer"), props.get("ro.soc.model"))))
        abi = props.get("ro.product.cpu.abi", "")
        sme2 = cpuinfo.has_sme2(cpu)
        # Android's emulators (goldfish/ranchu) set these; an emulated phone proves kernels and
        # outputs, never speed, so the device says what it is.
        marks = [f"{k}={props[k]}" for k in ("ro.kernel.qemu", "ro.boot.qemu") if props.get(k) == "1"]
        if marks and props.get("ro.hardware"):
            marks.append(f"ro.hardware={props['ro.hardware']}")
        return DeviceInfo(
            serial=serial, platform="android", model=props.get("ro.product.model", ""),
            soc=soc or props.get("ro.board.platform", ""), cpu_cores=cpuinfo.core_count(cpu), abi=abi,
            clusters=cpuinfo.clusters(cpu),
            os_version=f"Android {props['ro.build.version.release']}" if "ro.build.version.release" in props else "",
            sme2=sme2, sme=cpuinfo.has_sme(cpu) or sme2 if cpu.strip() else None, sme2_evidence=cpuinfo.sme_evidence(cpu),
            runner_platform=RUNNER_PLATFORM if abi == "arm64-v8a" else None, state="idle",
            tags=["emulated"] if marks else [], emulator=f"Android emulator ({', '.join(marks)})" if marks else None)

    def health(self, serial: str) -> dict[str, Any]:
        _, out = self.adb.shell(serial, f"dumpsys thermalservice; echo {SEP}; dumpsys battery; echo {SEP}; "
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
        self.adb.checked(serial, f"rm -rf {shlex.quote(st.run_dir)} && "
                              + shlex.join(["mkdir", "-p", st.run_dir, st.runner_dir]), "creating the run directory")

        t0 = time.monotonic()
        remote = {name: f"{st.runner_dir}/{name}" for name in files}
        present = self.adb.sha256s(serial, list(remote.values()))
        stale = [name for name in files if present.get(remote[name]) != local_sums[name]]
        for name in stale:
            self.adb.push(serial, files[name], remote[name], 0o755)
        run_files = {f"{st.run_dir}/{job.model_name}": job.model_path}
        if job.inputs_path is not None:
            run_files[f"{st.run_dir}/{INPUTS_NAME}"] = job.inputs_path
        for target, local in run_files.items():
            self.adb.push(serial, local, target, 0o644)
        check = self.adb.sha256s(serial, [remote[n] for n in stale] + list(run_files))
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
            self.adb.checked(serial, "; ".join(shlex.join(c) for c in hygiene.POWER_PROFILES[job.power_profile]),
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
            self.adb.checked(serial, "logcat -c", "clearing logcat")
        return before

    def _settings(self, serial: str, keys: list[str]) -> dict[str, str]:
        out = self.adb.checked(serial, "; ".join(shlex.join(["settings", "get", "global", k]) for k in keys),
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
        conn = self.adb.stream(serial, script)
        out, pid, key, ended = b"", None, None, False
        try:
            conn.conn.settimeout(0.2)   # short reads so cancellation and the deadline are checked
            while True:
                why = ("cancelled while the runner was executing" if job.cancel.is_set() else
                       f"runner timed out after {job.timeout_s:g} s" if time.monotonic() - t0 > job.timeout_s else "")
                if why:
                    if pid is not None:
                        self.adb.shell(serial, f"kill -9 {pid}")
                        ended = True
                        why += f"; killed pid {pid} on the device"
                    self.adb.pull(serial, f"{st.run_dir}/{LOG_NAME}", job.workdir / LOG_NAME)
                    raise DriverError(f"{why}: {tail(job.workdir / LOG_NAME)}")
                try:
                    chunk = conn.conn.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                out += chunk
                if pid is None and (m := re.search(rf"{PID_MARK}(\d+)\s", out.decode(errors="replace"))):
                    pid = int(m.group(1))
                    if self.pids is not None:   # from here on a killed agent leaves a runner behind
                        key = self.pids.add("adb", job.run_id, serial=serial, pid=pid, run_dir=st.run_dir,
                                            workdir=str(job.workdir))
        finally:
            conn.close()
            if key is not None:
                if ended or re.search(rf"{EXIT_MARK}\d+\s*$", out.decode(errors="replace")):
                    self.pids.remove(key)
                else:   # the shell broke off (device gone?): the runner may still be running there
                    self.pids.abandon(key)
        wall = time.monotonic() - t0
        m = re.search(rf"{EXIT_MARK}(\d+)\s*$", out.decode(errors="replace"))
        if m:
            return int(m.group(1)), wall
        raise self.adb.failure(serial, f"the device shell ended before the runner finished: {out.decode(errors='replace')[-300:]!r}")

    def reap_leftovers(self, online: set[str]) -> list[str]:
        """Runners a dead agent of this host left on these phones: killed if /proc/<pid> is still
        one of our runners started in that run's directory, and the run directory removed."""
        if self.pids is None:
            return []
        done = []
        for key, record in self.pids.leftovers("adb"):
            serial, pid, run_dir = record.get("serial"), int(record["pid"]), str(record.get("run_dir", ""))
            if serial not in online:
                continue   # not attached now: dealt with when it is found again
            if not re.fullmatch(rf"{re.escape(self.remote_root)}/runs/\d+", run_dir):
                self.pids.done(key, record)   # not one of this driver's run directories: touch nothing there
                continue
            try:
                _, out = self.adb.shell(serial, f"cat /proc/{pid}/cmdline 2>/dev/null; echo; echo {SEP}; "
                                                f"readlink /proc/{pid}/cwd 2>/dev/null")
                cmdline, _, cwd = out.partition(SEP)
                # The pid may have been reused since: only our runner binary, in that run's directory
                # (when the directory is readable), is killed.
                ours = f"{self.remote_root}/runners/" in cmdline and cwd.strip() in ("", run_dir)
                if ours:
                    self.adb.shell(serial, f"kill -9 {pid}")
                self.adb.checked(serial, shlex.join(["rm", "-rf", run_dir]), "removing a leftover run directory")
            except DriverError as e:
                log.warning("leftover runner of run %s on %s not dealt with yet: %s", record["run_id"], serial, e)
                continue
            done.append(f"{'killed' if ours else 'found no'} runner pid {pid} left on {serial} by run "
                        f"{record['run_id']}; removed {run_dir}")
            self.pids.done(key, record)
        return done

    def collect(self, serial: str, job: Job) -> None:
        st = self._staged[(serial, job.run_id)]
        # pull() skips a file the runner did not write: outputs.bin exists only from builds that write it
        for name in (ETDUMP_NAME, LOG_NAME, OUTPUTS_NAME, MEMORY_NAME):
            self.adb.pull(serial, f"{st.run_dir}/{name}", job.workdir / name)
        if job.mode == "trace":
            out = self.adb.checked(serial, "logcat -d -s XNNPACK", "reading the XNNPACK log")
            (job.workdir / KERNEL_LOG_NAME).write_text(out)

    def cleanup(self, serial: str, job: Job) -> dict[str, Any]:
        st = self._staged.pop((serial, job.run_id), None)
        after: dict[str, Any] = {}
        if st:
            self.adb.checked(serial, shlex.join(["rm", "-rf", st.run_dir]), "removing the run directory")
            if st.previous_settings:
                self.adb.checked(serial, "; ".join(shlex.join(c) for c in hygiene.restore_commands(st.previous_settings)),
                              "restoring settings")
                after["power_profile_restored"] = self._settings(serial, list(st.previous_settings))
        after["reading"] = self.health(serial)
        status = after["reading"].get("thermal_status")
        if st and st.thermal_status is not None and status is not None and status > st.thermal_status:
            # docs/design.md, "Measurement": a thermal status that rose during the session makes it suspect.
            after["suspect"] = f"thermal status rose from {st.thermal_status} to {status} during the run"
        return after
