"""The farm's SME2-capable emulator: Debian's qemu-aarch64 from the first suite whose `-cpu max`
has SME2, installed into the farm's cache (`sme2-farm emulator install|status`).

Why Debian's package: its qemu-aarch64 is a static-pie binary, so one taken from a newer suite
runs on an older Debian as it is (11.1.3 from trixie-backports runs on Debian 12, whose own QEMU
7.2 has SME but no SME2). It is fetched with apt-get alone, without touching the machine's apt
configuration: a private sources file, lists and archive directories in a temporary directory,
the mirror and its keyring read from the machine's own apt sources. The package is never
installed; only usr/bin/qemu-aarch64 is taken from the .deb. Nothing here needs root.

Whether an emulator has SME2 is never assumed from its version: the emulated CPU is asked, by
running the aarch64 glibc loader's `--list-diagnostics` under it (it prints the HWCAP/HWCAP2
words the emulated kernel hands out; HWCAP2 bit 37 is SME2).

The installer lives here, with the farm's build tools; the agent only runs what it installed
(agent/emulator.py chooses the directory: SME2_EMULATOR_DIR, else default_dir()). Cache layout:
    qemu-aarch64      the binary
    manifest.json     package, version, suite, sha256 of the binary and of the .deb, install
                      time, the probed HWCAP/HWCAP2 and SME2
The binary is used only while its sha256 matches the manifest.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sme2farm.runners.catalog import sha256_file
from sme2farm.runners.cpuinfo import HWCAP2_SME2

# Suites tried in order. trixie-backports carries 11.1.3 (SME2) today; testing and unstable
# follow QEMU upstream. A suite whose qemu lacks SME2 (trixie's 10.0, bookworm's 7.2) is skipped.
SUITES = ("trixie-backports", "testing", "unstable")
PACKAGE = "qemu-user"
BINARY = "qemu-aarch64"
MANIFEST = "manifest.json"
SYSTEM_QEMU = "qemu-aarch64"       # the one on PATH (Debian 12: 7.2, SME without SME2)
SYSROOT = Path("/usr/aarch64-linux-gnu")   # Debian's aarch64 glibc (libc6-arm64-cross)
LOADER = "lib/ld-linux-aarch64.so.1"
APT_DIR = Path("/etc/apt")

# /proc/cpuinfo feature names by HWCAP / HWCAP2 bit: the Linux kernel's hwcap_str table
# (arch/arm64/kernel/cpuinfo.c), indexed by the uapi bit (arch/arm64/include/uapi/asm/hwcap.h).
HWCAP_NAMES = (
    "fp", "asimd", "evtstrm", "aes", "pmull", "sha1", "sha2", "crc32", "atomics", "fphp", "asimdhp",
    "cpuid", "asimdrdm", "jscvt", "fcma", "lrcpc", "dcpop", "sha3", "sm3", "sm4", "asimddp", "sha512",
    "sve", "asimdfhm", "dit", "uscat", "ilrcpc", "flagm", "ssbs", "sb", "paca", "pacg",
    "gcs", "cmpbr", "fprcvt", "f8mm8", "f8mm4", "svef16mm", "sveeltperm", "sveaes2", "svebfscale",
    "sve2p2", "sme2p2", "smesbitperm", "smeaes", "smesfexpa", "smestmop", "smesmop4",
)
HWCAP2_NAMES = (
    "dcpodp", "sve2", "sveaes", "svepmull", "svebitperm", "svesha3", "svesm4", "flagm2", "frint",
    "svei8mm", "svef32mm", "svef64mm", "svebf16", "i8mm", "bf16", "dgh", "rng", "bti", "mte", "ecv",
    "afp", "rpres", "mte3", "sme", "smei16i64", "smef64f64", "smei8i32", "smef16f32", "smeb16f32",
    "smef32f32", "smefa64", "wfxt", "ebf16", "sveebf16", "cssc", "rprfm", "sve2p1", "sme2", "sme2p1",
    "smei16i32", "smebi32i32", "smeb16b16", "smef16f16", "mops", "hbc", "sveb16b16", "lrcpc3",
    "lse128", "fpmr", "lut", "faminmax", "f8cvt", "f8fma", "f8dp4", "f8dp2", "f8e4m3", "f8e5m2",
    "smelutv2", "smef8f16", "smef8f32", "smesf8fma", "smesf8dp4", "smesf8dp2", "poe",
)


class EmulatorError(Exception):
    """The emulator cannot be installed or probed; the message says why and what to do."""


def default_dir() -> Path:
    """$XDG_CACHE_HOME/sme2farm/emulator, else ~/.cache/sme2farm/emulator."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sme2farm" / "emulator"


def manual_steps(directory: Path) -> str:
    return (f"To install it by hand: add a temporary apt source entry for {SUITES[0]} on this machine's "
            f"Debian mirror (`deb <mirror> {SUITES[0]} main` in /etc/apt/sources.list.d/), run "
            f"`apt-get update && apt-get download {PACKAGE}/{SUITES[0]}`, remove the entry and run "
            f"`apt-get update` again; `dpkg-deb -x {PACKAGE}_*.deb x` and copy x/usr/bin/{BINARY} to "
            f"{directory}/{BINARY}; then `sme2-farm emulator install` checks its CPU and records it (or put "
            f"that {BINARY} first on PATH).")


# ---- the emulated CPU ------------------------------------------------------------------------

@dataclass(frozen=True)
class CpuProbe:
    """What an emulator's `-cpu` hands a program: the HWCAP words the emulated kernel sets."""

    qemu: str
    version: str      # "11.1.3"
    cpu: str
    hwcap: int
    hwcap2: int

    @property
    def sme2(self) -> bool:
        return bool(self.hwcap2 & HWCAP2_SME2)

    def features(self) -> list[str]:
        """The Features line Linux would print for this CPU, in the kernel's order."""
        return ([n for bit, n in enumerate(HWCAP_NAMES) if self.hwcap >> bit & 1]
                + [n for bit, n in enumerate(HWCAP2_NAMES) if self.hwcap2 >> bit & 1])

    def describe(self) -> str:
        return f"qemu-aarch64 {self.version} -cpu {self.cpu} (user mode)"

    def as_json(self) -> dict:
        return {"qemu": self.qemu, "version": self.version, "cpu": self.cpu, "emulator": self.describe(),
                "hwcap": f"{self.hwcap:#x}", "hwcap2": f"{self.hwcap2:#x}", "sme2": self.sme2}


def qemu_version(qemu: str) -> str:
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else ""


def probe(qemu: str, cpu: str = "max", sysroot: Path = SYSROOT) -> CpuProbe:
    """Ask the emulated CPU: the loader's --list-diagnostics prints dl_hwcap / dl_hwcap2."""
    sysroot = Path(sysroot)
    if not (sysroot / LOADER).exists():
        raise EmulatorError(f"{sysroot / LOADER} is missing: the aarch64 glibc loader (Debian: libc6-arm64-cross) "
                            f"is how the farm asks the emulated CPU for its HWCAPs")
    try:
        diag = subprocess.run([qemu, "-cpu", cpu, "-L", str(sysroot), str(sysroot / LOADER), "--list-diagnostics"],
                              capture_output=True, text=True, timeout=60)
        version = qemu_version(qemu)
    except (OSError, subprocess.SubprocessError) as e:
        raise EmulatorError(f"{qemu} could not be run: {e}") from None
    words = dict(re.findall(r"^dl_(hwcap2?)=(0x[0-9a-f]+)$", diag.stdout, re.M))
    if "hwcap2" not in words:
        raise EmulatorError(f"{qemu} -cpu {cpu}: no HWCAP2 in the loader's diagnostics "
                            f"(exit {diag.returncode}): {(diag.stderr or diag.stdout)[-300:].strip()}")
    return CpuProbe(qemu=qemu, version=version, cpu=cpu, hwcap=int(words.get("hwcap", "0x0"), 16),
                    hwcap2=int(words["hwcap2"], 16))


# ---- what is installed -----------------------------------------------------------------------

def _manifest(directory: Path) -> dict | None:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("sha256"), str) else None


def installed(directory: Path | None = None) -> Path | None:
    """The installed binary, only if its sha256 is the one its manifest recorded."""
    directory = Path(directory) if directory else default_dir()
    manifest, binary = _manifest(directory), directory / BINARY
    if manifest is None or not binary.is_file():
        return None
    return binary if sha256_file(binary) == manifest["sha256"] else None


def choose_qemu(directory: Path | None = None) -> str:
    """The qemu-aarch64 the farm's emulated devices use: the installed emulator, else the system's."""
    binary = installed(directory)
    return str(binary) if binary else SYSTEM_QEMU


# ---- the machine's apt configuration ---------------------------------------------------------

@dataclass(frozen=True)
class Mirror:
    uri: str
    signed_by: str | None   # a keyring path, or an inline key block (deb822), as configured


def _deb822_paragraphs(text: str) -> list[dict[str, str]]:
    out, cur, key = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                out.append(cur)
            cur, key = {}, None
        elif line[0] in " \t" and key:
            cur[key] += "\n" + line.strip()
        else:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            cur[key] = value.strip()
    if cur:
        out.append(cur)
    return out


def _is_security(suites: list[str]) -> bool:
    # Debian's security archive holds only <codename>-security: no backports, testing or unstable.
    return bool(suites) and all(s.endswith("-security") or s.endswith("/updates") for s in suites)


def apt_mirrors(apt_dir: Path = APT_DIR) -> list[Mirror]:
    """The Debian archive mirrors this machine's apt uses (deb822 .sources and one-line .list)."""
    mirrors: list[Mirror] = []
    apt_dir = Path(apt_dir)
    for f in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for p in _deb822_paragraphs(f.read_text(errors="replace")):
            if p.get("enabled", "yes").lower() == "no" or "deb" not in p.get("types", "").split():
                continue
            if _is_security(p.get("suites", "").split()):
                continue
            for uri in p.get("uris", "").split():
                mirrors.append(Mirror(uri, p.get("signed-by") or None))
    for f in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
            if m is None or _is_security([m.group(3)]):
                continue
            opts = dict(o.split("=", 1) for o in (m.group(1) or "").split() if "=" in o)
            mirrors.append(Mirror(m.group(2), opts.get("signed-by")))
    seen, unique = set(), []
    for mirror in mirrors:
        if mirror not in seen and not mirror.uri.startswith("cdrom:"):
            seen.add(mirror)
            unique.append(mirror)
    return unique


def _sources_file(mirrors: list[Mirror], suite: str) -> str:
    paragraphs = []
    for m in mirrors:
        lines = ["Types: deb", f"URIs: {m.uri}", f"Suites: {suite}", "Components: main"]
        if m.signed_by:
            # An inline key keeps its deb822 continuation lines (" ." for a blank line).
            key_lines = m.signed_by.split("\n")
            lines.append("Signed-By: " + key_lines[0] + "".join(f"\n {k}" for k in key_lines[1:]))
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs) + "\n"


def _apt_options(root: Path) -> list[str]:
    """apt-get options that keep every file apt reads or writes under `root`, except its keyrings."""
    opts = {"Dir::Etc::SourceList": "/dev/null", "Dir::Etc::SourceParts": root / "sources.list.d",
            "Dir::State::Lists": root / "lists", "Dir::Cache": root / "cache",
            "Dir::Cache::Archives": root / "archives", "Acquire::Languages": "none", "Acquire::Retries": "1",
            "Acquire::http::Timeout": "20", "Acquire::https::Timeout": "20"}
    return [a for k, v in opts.items() for a in ("-o", f"{k}={v}")]


def _problems(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if re.match(r"^(E|W|Err):", ln.strip())]
    return "; ".join(lines)[-600:] or output.strip()[-600:]


def _download(root: Path, mirrors: list[Mirror], suite: str) -> Path:
    for sub in ("sources.list.d", "lists/partial", "cache", "archives/partial", "download"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "sources.list.d" / "sme2farm.sources").write_text(_sources_file(mirrors, suite))
    if os.geteuid() == 0:
        # As root apt fetches as its sandbox user _apt, which must be able to write the target.
        try:
            os.chown(root / "download", pwd.getpwnam("_apt").pw_uid, -1)
        except KeyError:
            pass
    opts = _apt_options(root)
    env = {**os.environ, "LC_ALL": "C"}
    # One unreachable mirror among several only warns: whether the package came is what counts, and
    # when it did not, update's complaints (unreachable, no such suite) are the reason.
    update = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=300, env=env)
    got = subprocess.run(["apt-get", *opts, "download", f"{PACKAGE}/{suite}"], capture_output=True, text=True,
                         timeout=600, cwd=root / "download", env=env)
    debs = sorted((root / "download").glob(f"{PACKAGE}_*.deb"))
    if got.returncode != 0 or len(debs) != 1:
        said = update.stdout + update.stderr
        upd = _problems(said) if update.returncode or "Failed to fetch" in said else ""
        raise EmulatorError((f"apt-get update: {upd}; " if upd else "")
                            + f"apt-get download {PACKAGE}/{suite}: {_problems(got.stdout + got.stderr)}")
    return debs[0]


def _unpack(deb: Path, target: Path) -> Path:
    """usr/bin/qemu-aarch64 out of the .deb's file system tar (what `dpkg-deb -x` unpacks), read as a
    stream: the package's other ~40 emulators (450 MB) are never written."""
    found, problem = False, ""
    with tempfile.TemporaryFile() as errors:
        # Its own process group: dpkg-deb runs the decompressor as a child, and both are stopped
        # once the binary is out (the rest of the stream is not needed).
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE, stderr=errors,
                                start_new_session=True)
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    if member.isfile() and member.name.lstrip("./") == f"usr/bin/{BINARY}":
                        with tar.extractfile(member) as src, open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst)
                        found = True
                        break
        except tarfile.TarError as e:
            problem = str(e)
        finally:
            proc.stdout.close()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        errors.seek(0)
        err = errors.read().decode(errors="replace").strip()
    if not found:
        raise EmulatorError(f"no usr/bin/{BINARY} in {deb.name}: " + "; ".join(filter(None, (problem, err[-300:]))))
    target.chmod(0o755)
    return target


# ---- install and status ----------------------------------------------------------------------

def _record(directory: Path, cpu: CpuProbe, package_version: str, suite: str, deb: str | None,
            deb_sha256: str | None) -> dict:
    manifest = {"package": PACKAGE, "package_version": package_version, "suite": suite, "qemu_version": cpu.version,
                "binary": BINARY, "sha256": sha256_file(directory / BINARY), "deb": deb, "deb_sha256": deb_sha256,
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "cpu": cpu.cpu, "hwcap": f"{cpu.hwcap:#x}", "hwcap2": f"{cpu.hwcap2:#x}", "sme2": cpu.sme2}
    part = directory / f".{MANIFEST}.{os.getpid()}.part"   # per process: two installs never share one
    part.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(part, directory / MANIFEST)
    return manifest


def _adopt(directory: Path) -> dict | None:
    """A qemu-aarch64 copied into the cache by hand (the manual steps) and no manifest yet: recorded
    as it is when its emulated CPU has SME2 (suite "by hand", the package version its --version
    names), so the farm uses it; None when it has no SME2 or does not run."""
    try:
        cpu = probe(str(directory / BINARY))
        out = subprocess.run([str(directory / BINARY), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (EmulatorError, OSError, subprocess.SubprocessError):
        return None
    if not cpu.sme2:
        return None
    m = re.search(r"\(Debian ([^)]+)\)", out)
    return _record(directory, cpu, m.group(1) if m else cpu.version, "by hand", None, None)


def install(directory: Path | None = None, *, suites: tuple[str, ...] = SUITES, apt_dir: Path = APT_DIR,
            say=lambda _msg: None) -> tuple[dict, bool]:
    """Install the emulator; (manifest, True) when it was installed now, (manifest, False) when a
    valid one was already there. Raises EmulatorError with the manual steps on failure."""
    directory = Path(directory) if directory else default_dir()
    if installed(directory) is not None:
        return _manifest(directory), False
    if (directory / BINARY).is_file() and _manifest(directory) is None:
        adopted = _adopt(directory)
        if adopted is not None:
            return adopted, True
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise EmulatorError(f"{tool} is not on PATH: the emulator comes from Debian's {PACKAGE} package. "
                                + manual_steps(directory))
    if not (SYSROOT / LOADER).exists():
        raise EmulatorError(f"{SYSROOT / LOADER} is missing (Debian: apt-get install libc6-arm64-cross): without it "
                            f"the emulated CPU cannot be asked whether it has SME2.")
    mirrors = apt_mirrors(apt_dir)
    if not mirrors:
        raise EmulatorError(f"no Debian mirror in {apt_dir}/sources.list or {apt_dir}/sources.list.d. "
                            + manual_steps(directory))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise EmulatorError(f"cannot write the emulator cache {directory} ({e.strerror}): set SME2_EMULATOR_DIR "
                            f"to a writable directory. " + manual_steps(directory)) from None
    tried = []
    with tempfile.TemporaryDirectory(prefix="sme2farm-emulator-") as tmp:
        os.chmod(tmp, 0o755)   # apt's sandbox user reaches the private lists and download dirs
        for suite in suites:
            root = Path(tmp) / suite
            try:
                say(f"{suite}: fetching {PACKAGE} from {', '.join(m.uri for m in mirrors)}")
                deb = _download(root, mirrors, suite)
                binary = _unpack(deb, root / BINARY)
                cpu = probe(str(binary))
            except (EmulatorError, subprocess.SubprocessError, OSError) as e:
                tried.append(f"{suite}: {e}")
                say(tried[-1])
                continue
            if not cpu.sme2:
                tried.append(f"{suite}: {cpu.describe()} has HWCAP2 {cpu.hwcap2:#x}, bit 37 (SME2) clear")
                say(tried[-1])
                continue
            version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                                     timeout=60).stdout.strip()
            part = directory / f".{BINARY}.{os.getpid()}.part"
            shutil.copyfile(binary, part)
            part.chmod(0o755)
            os.replace(part, directory / BINARY)
            return _record(directory, cpu, version, suite, deb.name, sha256_file(deb)), True
    raise EmulatorError("no suite's qemu-aarch64 emulates SME2 here: " + "; ".join(tried) + ". "
                        + manual_steps(directory))


def _probe_json(qemu: str) -> dict:
    try:
        return probe(qemu).as_json()
    except EmulatorError as e:
        return {"qemu": qemu, "error": str(e)}


def status(directory: Path | None = None) -> dict:
    """What is installed (verified against its manifest), what its CPU has, and the system qemu."""
    directory = Path(directory) if directory else default_dir()
    manifest, binary = _manifest(directory), directory / BINARY
    inst = None
    if manifest is not None or binary.exists():
        sha = sha256_file(binary) if binary.is_file() else None
        inst = {"path": str(binary), "manifest": manifest, "sha256": sha,
                "sha256_verified": bool(manifest and sha == manifest["sha256"]),
                "cpu": _probe_json(str(binary)) if sha else None}
    system_path = shutil.which(SYSTEM_QEMU)
    system = {"path": system_path, "cpu": _probe_json(system_path)} if system_path else None
    if inst and inst["sha256_verified"]:
        used, cpu = "installed", inst["cpu"]
    elif system:
        used, cpu = "system", system["cpu"]
    else:
        used, cpu = None, None
    return {"cache_dir": str(directory), "installed": inst, "system": system, "uses": used,
            "emulator": cpu.get("emulator") if cpu else None, "sme2": bool(cpu and cpu.get("sme2"))}


def render_status(st: dict) -> str:
    def cpu_line(cpu: dict | None) -> str:
        if not cpu:
            return "not probed"
        if "error" in cpu:
            return f"probe failed: {cpu['error']}"
        return f"{cpu['emulator']}: HWCAP2 {cpu['hwcap2']}, SME2 {'yes' if cpu['sme2'] else 'no'}"

    lines = [f"cache: {st['cache_dir']}"]
    inst = st["installed"]
    if inst is None:
        lines.append("installed: none (`sme2-farm emulator install`)")
    elif inst["manifest"] is None:
        lines.append(f"installed: {inst['path']} without a manifest: not used until `sme2-farm emulator install` "
                     f"checks its CPU and records it")
    else:
        m = inst["manifest"]
        sha = "verified" if inst["sha256_verified"] else "DOES NOT MATCH the manifest: not used"
        lines.append(f"installed: {inst['path']} ({m.get('package', PACKAGE)} {m.get('package_version', '?')} from "
                     f"{m.get('suite', '?')}; sha256 {sha})")
        lines.append(f"  cpu: {cpu_line(inst['cpu'])}")
    if st["system"] is None:
        lines.append(f"system: no {SYSTEM_QEMU} on PATH")
    else:
        lines.append(f"system: {st['system']['path']}")
        lines.append(f"  cpu: {cpu_line(st['system']['cpu'])}")
    lines.append(f"emulated devices use: {st['uses'] or 'nothing (no qemu-aarch64)'}"
                 + (f", {st['emulator']}, SME2 {'yes' if st['sme2'] else 'no'}" if st["emulator"] else ""))
    return "\n".join(lines)
