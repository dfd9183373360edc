"""A loopback Android device for tests: the adbd side of the adb wire protocol on a local TCP port.

The real adb server (adbutils' bundled binary) reaches it with `adb connect 127.0.0.1:PORT`, so the
Android driver is exercised through the same server, sockets and services as with a phone:
CNXN handshake (no AUTH), OPEN/OKAY/WRTE/CLSE streams, the legacy `shell:` service and `sync:`
(STAT/LIST/SEND/RECV/QUIT). The device announces no features, so the host uses exactly those.

Behind it a sandbox directory stands in for the phone's file system: /data/local/tmp,
/proc/cpuinfo and /sys/class/thermal are mapped into it. Shell commands run under the real
/bin/sh after that path mapping (a real phone's shell interprets the same string, so quoting
mistakes in the driver show up here too). `getprop`, `settings`, `svc`, `dumpsys`, `logcat` and
`log` are small scripts on PATH, backed by state files the test can change (thermal status,
temperatures, battery). Executables pushed to the device are host binaries: that is the fake at
the hardware boundary. An emulated arm64 phone (emulated_arm64_phone) instead runs the real
aarch64 runner bundle a phone would run, under the qemu-aarch64 the farm's emulated devices use
(the installed SME2 emulator, else the system's); its /proc/cpuinfo is what Linux would print for
that emulated CPU, and it carries the properties that mark a real Android emulator.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sme2farm.agent import emulator
from sme2farm.runners import emulator as installer

A_SYNC, A_CNXN, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_AUTH = (
    0x434E5953, 0x4E584E43, 0x4E45504F, 0x59414B4F, 0x45534C43, 0x45545257, 0x48545541)
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3   # adb's AUTH packet types (arg0)
TOKEN_SIZE = 20
VERSION = 0x01000000   # no delayed acks: every WRTE waits for the peer's OKAY
MAX_PAYLOAD = 256 * 1024
SYNC_DATA_MAX = 64 * 1024
DEVICE_ROOTS = ("/data/local/tmp", "/proc/cpuinfo", "/sys/class/thermal")

_FEATURES_BASE = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                  "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm "
                  "ssbs sb paca pacg dcpodp sve sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 "
                  "frint svei8mm svebf16 i8mm bf16 dgh bti")
_FEATURES_SME2 = " sme smei16i64 smef64f64 smei8i32 smef16f32 smeb16f32 smef32f32 smefa64 sme2 smei16i32 smebi32i32"


def cpuinfo_text(cores: int, sme2: bool, sme2_cores: set[int] | None = None) -> str:
    """An arm64 /proc/cpuinfo; SME2 may be on only some cores (sme2_cores), as on big.LITTLE parts."""
    blocks = []
    for i in range(cores):
        on = sme2 and (sme2_cores is None or i in sme2_cores)
        blocks.append(f"processor\t: {i}\nBogoMIPS\t: 26.00\n"
                      f"Features\t: {_FEATURES_BASE}{_FEATURES_SME2 if on else ''}\n"
                      f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
                      f"CPU part\t: {'0xd85' if on else '0xd05'}\nCPU revision\t: 1\n")
    return "\n".join(blocks)


@dataclass
class DeviceProfile:
    props: dict[str, str]
    cpuinfo: str
    thermal_status: int = 0
    temps_c: dict[str, float] = field(default_factory=lambda: {"cpu-big": 31.0, "soc": 30.0, "battery": 28.0})
    battery_level: int = 80
    battery_temp_c: float = 28.0
    usb_powered: bool = True
    # The phone's CPU is aarch64, emulated by this qemu-aarch64: aarch64 executables started
    # through the device's `env`/`taskset` toolbox commands run under it (see _ARM64_TOOLS).
    qemu: str | None = None
    # False: the phone has not accepted this computer's key ("Allow USB debugging?" unanswered).
    # It answers the host's CNXN with an AUTH token and every signature with another token, as
    # adbd does for an unknown key, and never connects: adb lists it as "unauthorized".
    authorized: bool = True


def sme2_phone() -> DeviceProfile:
    return DeviceProfile(
        props={"ro.product.model": "V2405A", "ro.product.name": "loop_sme2", "ro.product.device": "loop",
               "ro.soc.manufacturer": "Mediatek", "ro.soc.model": "MT6991", "ro.board.platform": "mt6991",
               "ro.product.cpu.abi": "arm64-v8a", "ro.build.version.release": "15",
               "ro.build.version.sdk": "35"},
        cpuinfo=cpuinfo_text(8, sme2=True, sme2_cores={4, 5, 6, 7}))


def emulated_cpuinfo(cpu: installer.CpuProbe, cores: int) -> str:
    """/proc/cpuinfo as arm64 Linux prints it (arch/arm64/kernel/cpuinfo.c) for the emulated CPU:
    the Features line from its HWCAP/HWCAP2 words. The MIDR fields are those of QEMU's `-cpu max`
    (implementer 0, "reserved for software use", part 0x51 'Q'), which no HWCAP carries."""
    features = " ".join(cpu.features())
    return "\n".join(f"processor\t: {i}\nBogoMIPS\t: 100.00\nFeatures\t: {features}\nCPU implementer\t: 0x00\n"
                     f"CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0x051\nCPU revision\t: 0\n"
                     for i in range(cores))


def emulated_arm64_phone(qemu: str | None = None) -> DeviceProfile:
    """A phone whose CPU is qemu-aarch64's `-cpu max` (default: the one the farm's emulated devices
    use). Its cpuinfo comes from asking that CPU, so it lists sme2 exactly when the emulator has
    SME2. Like a real Android emulator it sets ro.kernel.qemu / ro.boot.qemu."""
    qemu = qemu or emulator.choose_qemu()
    cpu = installer.probe(shutil.which(qemu) or qemu)   # absolute: the device's shell has its own PATH
    return DeviceProfile(
        props={"ro.product.model": "QEMU arm64", "ro.product.name": "loop_qemu", "ro.product.device": "qemu",
               "ro.soc.manufacturer": "QEMU", "ro.soc.model": "max", "ro.board.platform": "qemu",
               "ro.hardware": "ranchu", "ro.kernel.qemu": "1", "ro.boot.qemu": "1",
               "ro.product.cpu.abi": "arm64-v8a", "ro.build.version.release": "15",
               "ro.build.version.sdk": "35"},
        cpuinfo=emulated_cpuinfo(cpu, 4), qemu=cpu.qemu)


def plain_phone() -> DeviceProfile:
    return DeviceProfile(
        props={"ro.product.model": "Pixel 8", "ro.product.name": "loop_plain", "ro.product.device": "shiba",
               "ro.soc.manufacturer": "Google", "ro.soc.model": "Tensor G3", "ro.board.platform": "zuma",
               "ro.product.cpu.abi": "arm64-v8a", "ro.build.version.release": "14",
               "ro.build.version.sdk": "34"},
        cpuinfo=cpuinfo_text(9, sme2=False))


# Android command-line tools, reduced to what the farm uses, over files under $LOOPBACK_STATE.
_TOOLS = {
    "getprop": r'''d="$LOOPBACK_STATE/props"
if [ $# -eq 0 ]; then for f in "$d"/*; do printf '[%s]: [%s]\n' "${f##*/}" "$(cat "$f")"; done
else cat "$d/$1" 2>/dev/null; echo; fi''',
    "settings": r'''d="$LOOPBACK_STATE/settings/$2"; mkdir -p "$d"
case "$1" in
  get) if [ -f "$d/$3" ]; then cat "$d/$3"; echo; else echo null; fi ;;
  put) printf %s "$4" > "$d/$3" ;;
  delete) rm -f "$d/$3"; echo "Deleted 1 rows" ;;
  *) echo "settings: unknown command $1" >&2; exit 1 ;;
esac''',
    # As on Android 13+, `svc power stayon true|false` writes stay_on_while_plugged_in (15|0).
    "svc": r'''[ "$1 $2" = "power stayon" ] || { echo "svc: unsupported $*" >&2; exit 1; }
mkdir -p "$LOOPBACK_STATE/settings/global"
if [ "$3" = true ]; then v=15; else v=0; fi
printf %s "$v" > "$LOOPBACK_STATE/settings/global/stay_on_while_plugged_in"''',
    "dumpsys": r'''f="$LOOPBACK_STATE/dumpsys/$1"
if [ -f "$f" ]; then cat "$f"; else echo "Can't find service: $1"; fi''',
    "log": r'''[ "$1" = -t ] || { echo "usage: log -t TAG MESSAGE" >&2; exit 1; }
printf '01-01 00:00:00.000  %5d  %5d I %s: %s\n' $$ $$ "$2" "$3" >> "$LOOPBACK_STATE/logcat"''',
    "logcat": r'''f="$LOOPBACK_STATE/logcat"; touch "$f"
case "$1" in
  -c) : > "$f" ;;
  -d) if [ "$2" = -s ]; then grep " I $3: " "$f"; else cat "$f"; fi; exit 0 ;;
  *) echo "logcat: only -c and -d are supported" >&2; exit 1 ;;
esac''',
}


# On an emulated arm64 phone: the toolbox commands that start programs hand aarch64 ELF files
# (e_machine 183 at offset 18) to the profile's qemu-aarch64 ($LOOPBACK_QEMU), standing in for
# the phone's CPU. Everything else (host tools such as sh, cat, sha256sum) runs as it is.
_ARM64_TOOLS = {
    "arm64-exec": r'''if [ "$(od -An -tx1 -j18 -N2 "$1" 2>/dev/null | tr -d ' \n')" = "b700" ]; then
  exec "$LOOPBACK_QEMU" -cpu max "$@"
fi
exec "$@"''',
    "env": r'''while [ $# -gt 0 ]; do case "$1" in *=*) export "$1"; shift ;; *) break ;; esac; done
exec arm64-exec "$@"''',
    "taskset": r'''mask=$1; shift
exec /usr/bin/taskset "$mask" "$(command -v arm64-exec)" "$@"''',
}


class LoopbackDevice:
    """One fake phone on 127.0.0.1:port, file system and state under `root`."""

    def __init__(self, root: Path, profile: DeviceProfile, port: int = 0):
        self.root = Path(root).resolve()
        if not re.fullmatch(r"[A-Za-z0-9_./-]+", str(self.root)):
            raise ValueError(f"sandbox path {self.root} must not need shell quoting (it is spliced into commands)")
        self.profile = profile
        self.state = self.root / "state"
        self._sock = socket.create_server(("127.0.0.1", port))
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._stopped = False
        self.shell_commands: list[str] = []   # every shell: command as the device received it
        self._install()
        threading.Thread(target=self._accept, daemon=True, name=f"loopback-{self.port}").start()

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- device state the test controls -----------------------------------------------------

    def _install(self) -> None:
        (self.root / "data/local/tmp").mkdir(parents=True, exist_ok=True)
        (self.root / "proc").mkdir(exist_ok=True)
        (self.root / "proc/cpuinfo").write_text(self.profile.cpuinfo)
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        for name, body in {**_TOOLS, **(_ARM64_TOOLS if self.profile.qemu else {})}.items():
            (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
            (bin_dir / name).chmod(0o755)
        props = self.state / "props"
        props.mkdir(parents=True, exist_ok=True)
        for k, v in self.profile.props.items():
            (props / k).write_text(v)
        (self.state / "settings/global").mkdir(parents=True, exist_ok=True)
        self.set_thermal()
        self.set_battery()

    def set_thermal(self, status: int | None = None, temps_c: dict[str, float] | None = None) -> None:
        p = self.profile
        p.thermal_status = p.thermal_status if status is None else status
        p.temps_c = p.temps_c if temps_c is None else temps_c
        hal_type = {"battery": 2, "skin": 3}
        temps = "".join(f"\tTemperature{{mValue={t}, mType={hal_type.get(n, 0)}, mName={n}, mStatus={p.thermal_status}}}\n"
                        for n, t in p.temps_c.items())
        self._write_state("dumpsys/thermalservice",
                          "IsStatusOverride: false\nThermalEventListeners:\n\tcallbacks: 1\n\tkilled: false\n"
                          f"Thermal Status: {p.thermal_status}\nCached temperatures:\n{temps}HAL Ready: true\n"
                          f"HAL connection:\n\tThermalHAL 2.0 connected: yes\nCurrent temperatures from HAL:\n{temps}"
                          "Current cooling devices from HAL:\n")
        zones = self.root / "sys/class/thermal"
        shutil.rmtree(zones, ignore_errors=True)
        for i, (name, t) in enumerate(p.temps_c.items()):
            z = zones / f"thermal_zone{i}"
            z.mkdir(parents=True)
            (z / "type").write_text(name + "\n")
            (z / "temp").write_text(f"{round(t * 1000)}\n")

    def set_battery(self, level: int | None = None, temp_c: float | None = None, usb_powered: bool | None = None) -> None:
        p = self.profile
        p.battery_level = p.battery_level if level is None else level
        p.battery_temp_c = p.battery_temp_c if temp_c is None else temp_c
        p.usb_powered = p.usb_powered if usb_powered is None else usb_powered
        self._write_state("dumpsys/battery",
                          "Current Battery Service state:\n  AC powered: false\n"
                          f"  USB powered: {str(p.usb_powered).lower()}\n  Wireless powered: false\n"
                          f"  status: {2 if p.usb_powered else 3}\n  health: 2\n  present: true\n"
                          f"  level: {p.battery_level}\n  scale: 100\n  voltage: 4200\n"
                          f"  temperature: {round(p.battery_temp_c * 10)}\n  technology: Li-ion\n")

    def settings(self, namespace: str = "global") -> dict[str, str]:
        d = self.state / "settings" / namespace
        return {f.name: f.read_text() for f in d.iterdir()} if d.is_dir() else {}

    def put_setting(self, key: str, value: str, namespace: str = "global") -> None:
        (self.state / "settings" / namespace / key).write_text(value)

    def log(self, tag: str, message: str) -> None:
        with open(self.state / "logcat", "a") as f:
            f.write(f"01-01 00:00:00.000  1000  1000 I {tag}: {message}\n")

    def device_path(self, path: str) -> Path:
        """The sandbox file behind a device path."""
        return Path(self.map_in(path))

    def _write_state(self, rel: str, text: str) -> None:
        f = self.state / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)

    # ---- path mapping -----------------------------------------------------------------------

    def map_in(self, text: str) -> str:
        for r in DEVICE_ROOTS:
            text = re.sub(rf"(?<![\w./-]){re.escape(r)}", lambda _m, r=r: f"{self.root}{r}", text)
        return text

    def map_out(self, data: bytes) -> bytes:
        return data.replace(str(self.root).encode(), b"")

    # ---- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """The phone vanishes: the port closes, every connection drops, its processes die."""
        self._stopped = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns, procs = list(self._conns), list(self._procs)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._stopped:
                conn.close()
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small packets, no Nagle stalls
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=_Connection(self, conn).serve, daemon=True).start()

    # ---- services ---------------------------------------------------------------------------

    def shell(self, stream: "_Stream", command: str) -> None:
        self.shell_commands.append(command)
        env = {"PATH": f"{self.root}/bin:/usr/bin:/bin", "LOOPBACK_STATE": str(self.state),
               "HOME": f"{self.root}/data/local/tmp", "TMPDIR": f"{self.root}/data/local/tmp",
               **({"LOOPBACK_QEMU": self.profile.qemu} if self.profile.qemu else {})}
        proc = subprocess.Popen(["/bin/sh", "-c", self.map_in(command)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/", env=env,
                                start_new_session=True)
        with self._lock:
            self._procs.append(proc)
        pending = b""
        try:
            # Forward whole lines so a sandbox path is never split across two writes before mapping.
            while chunk := proc.stdout.read1(65536):
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if cut:
                    stream.write(self.map_out(pending[:cut]))
                    pending = pending[cut:]
            if pending:
                stream.write(self.map_out(pending))
            proc.wait()
        except (ConnectionError, OSError):
            pass   # the host hung up: like adbd, drop our end and let the processes run on
        finally:
            proc.stdout.close()
            stream.close()

    def sync(self, stream: "_Stream") -> None:
        try:
            while True:
                head = stream.read_exact(8)
                cmd, n = head[:4], struct.unpack("<I", head[4:])[0]
                path = stream.read_exact(n).decode()
                if cmd == b"STAT":
                    try:
                        st = os.stat(self.map_in(path))
                        stream.write(b"STAT" + struct.pack("<III", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime)))
                    except OSError:
                        stream.write(b"STAT" + bytes(12))
                elif cmd == b"LIST":
                    self._list(stream, path)
                elif cmd == b"SEND":
                    self._receive_file(stream, path)
                elif cmd == b"RECV":
                    self._send_file(stream, path)
                else:   # QUIT or anything unknown ends the session
                    break
        except (ConnectionError, EOFError):
            pass
        finally:
            stream.close()

    def _list(self, stream: "_Stream", path: str) -> None:
        host = self.map_in(path)
        names = sorted(os.listdir(host)) if os.path.isdir(host) else []
        for name in [".", "..", *names]:
            st = os.stat(os.path.join(host, name))
            raw = name.encode()
            stream.write(b"DENT" + struct.pack("<IIII", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), len(raw)) + raw)
        stream.write(b"DONE" + bytes(16))

    def _receive_file(self, stream: "_Stream", spec: str) -> None:
        path, _, mode = spec.rpartition(",")
        host = Path(self.map_in(path))
        error = ""
        try:
            host.parent.mkdir(parents=True, exist_ok=True)   # adbd's fixed_push_mkdir behaviour
            out = open(host, "wb")
        except OSError as e:
            out, error = None, f"open failed: {e.strerror}"
        try:
            while True:   # always drain the DATA chunks, even after a failure, to keep the stream in step
                head = stream.read_exact(8)
                kind, n = head[:4], struct.unpack("<I", head[4:])[0]
                if kind == b"DONE":
                    break
                if kind != b"DATA":
                    raise EOFError(f"unexpected sync chunk {kind!r}")
                data = stream.read_exact(n)
                if out:
                    out.write(data)
        finally:
            if out:
                out.close()
        if error:
            msg = error.encode()
            stream.write(b"FAIL" + struct.pack("<I", len(msg)) + msg)
            return
        os.chmod(host, stat.S_IMODE(int(mode)) if mode else 0o644)
        stream.write(b"OKAY" + bytes(4))

    def _send_file(self, stream: "_Stream", path: str) -> None:
        try:
            f = open(self.map_in(path), "rb")
        except OSError as e:
            msg = f"open failed: {e.strerror}".encode()
            stream.write(b"FAIL" + struct.pack("<I", len(msg)) + msg)
            return
        with f:
            while chunk := f.read(SYNC_DATA_MAX):
                stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        stream.write(b"DONE" + bytes(4))


class _Stream:
    """One OPENed service stream: buffered input, flow-controlled output (wait OKAY after each WRTE)."""

    def __init__(self, conn: "_Connection", local_id: int, remote_id: int):
        self.conn, self.local_id, self.remote_id = conn, local_id, remote_id
        self.cond = threading.Condition()
        self.inbox = bytearray()
        self.ready = True          # may send one WRTE; cleared until the host's OKAY
        self.closed = False        # the host closed, or the connection dropped
        self.sent_close = False

    def feed(self, data: bytes) -> None:
        with self.cond:
            self.inbox += data
            self.cond.notify_all()

    def okay(self) -> None:
        with self.cond:
            self.ready = True
            self.cond.notify_all()

    def hangup(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def read_exact(self, n: int) -> bytes:
        with self.cond:
            while len(self.inbox) < n:
                if self.closed:
                    raise EOFError("stream closed")
                self.cond.wait()
            data = bytes(self.inbox[:n])
            del self.inbox[:n]
            return data

    def write(self, data: bytes) -> None:
        step = min(self.conn.max_payload, MAX_PAYLOAD)
        for i in range(0, len(data), step):
            with self.cond:
                while not self.ready and not self.closed:
                    self.cond.wait()
                if self.closed:
                    raise ConnectionError("stream closed by host")
                self.ready = False
            self.conn.send(A_WRTE, self.local_id, self.remote_id, data[i:i + step])

    def close(self) -> None:
        with self.cond:
            if self.sent_close:
                return
            self.sent_close = True
        if not self.closed:
            try:
                self.conn.send(A_CLSE, self.local_id, self.remote_id)
            except OSError:
                pass
        self.conn.drop(self.local_id)


class _Connection:
    def __init__(self, device: LoopbackDevice, sock: socket.socket):
        self.device, self.sock = device, sock
        self.max_payload = 4096
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.send_lock = threading.Lock()
        self.lock = threading.Lock()

    def send(self, cmd: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = struct.pack("<6I", cmd, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, cmd ^ 0xFFFFFFFF)
        with self.send_lock:
            self.sock.sendall(header + data)

    def drop(self, local_id: int) -> None:
        with self.lock:
            self.streams.pop(local_id, None)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    def serve(self) -> None:
        try:
            while True:
                cmd, arg0, arg1, length, _check, magic = struct.unpack("<6I", self._recv_exact(24))
                if magic != cmd ^ 0xFFFFFFFF:
                    raise EOFError("bad packet magic")
                data = self._recv_exact(length) if length else b""
                self._dispatch(cmd, arg0, arg1, data)
        except (EOFError, OSError):
            pass
        finally:
            with self.lock:
                streams = list(self.streams.values())
                self.streams.clear()
            for s in streams:
                s.hangup()
            self.sock.close()

    def _dispatch(self, cmd: int, arg0: int, arg1: int, data: bytes) -> None:
        if not self.device.profile.authorized:
            # adbd with an unknown host key: a token to sign; a signature it cannot verify gets a
            # fresh token; the host's public key waits for the user's answer, which never comes.
            if cmd == A_CNXN or (cmd == A_AUTH and arg0 == AUTH_SIGNATURE):
                self.send(A_AUTH, AUTH_TOKEN, 0, os.urandom(TOKEN_SIZE))
            return
        if cmd == A_CNXN:
            self.max_payload = arg1
            p = self.device.profile.props
            banner = (f"device::ro.product.name={p.get('ro.product.name', '')};"
                      f"ro.product.model={p.get('ro.product.model', '')};"
                      f"ro.product.device={p.get('ro.product.device', '')};features=")
            self.send(A_CNXN, VERSION, MAX_PAYLOAD, banner.encode())
        elif cmd == A_OPEN:
            service = data.rstrip(b"\0").decode()
            with self.lock:
                local_id, self.next_id = self.next_id, self.next_id + 1
                stream = self.streams[local_id] = _Stream(self, local_id, arg0)
            if service.startswith("shell:"):
                target, args = self.device.shell, (stream, service[len("shell:"):])
            elif service == "sync:":
                target, args = self.device.sync, (stream,)
            else:
                self.drop(local_id)
                self.send(A_CLSE, 0, arg0)   # unknown service: refuse the OPEN
                return
            self.send(A_OKAY, local_id, arg0)
            threading.Thread(target=target, args=args, daemon=True).start()
        elif cmd in (A_OKAY, A_WRTE, A_CLSE):
            with self.lock:
                stream = self.streams.get(arg1)
            if stream is None:
                return
            if cmd == A_OKAY:
                stream.okay()
            elif cmd == A_WRTE:
                stream.feed(data)
                self.send(A_OKAY, arg1, arg0)
            else:
                self.drop(arg1)
                stream.hangup()
