"""Prebuilt arm64 runners: runners/runner.cpp cross-compiled against PyPI's aarch64 executorch
wheel with Debian's aarch64 toolchain, and registered for both SME2 arms.

    linux-arm64          the runner with the wheel's libraries beside it (RUNPATH $ORIGIN): copy
                         the folder to an arm64 Linux host (glibc >= the recorded minimum) and run.
    android-arm64-v9a    the same binary plus glibc's loader and every library it needs, run as
                         `<dir>/ld-linux-aarch64.so.1 --library-path <dir> <dir>/runner ...`, so a
                         phone's bionic is never involved (no NDK).

One binary serves both arms: "on" runs as the hardware is; "off" sets SME2FARM_HIDE_SME2=1, which
makes the runner's exported getauxval() clear HWCAP2_SME/SME2 before XNNPACK's cpuinfo reads them
(the facts, and where that is and is not the kit's two-build comparison: docs/design.md,
"arm64 runners from the PyPI wheel" and "One runner binary, both arms").

Steps, each skipped when its result is already there:
  1. `pip download executorch==<installed version> --platform manylinux_2_28_aarch64` into
     runners/build/wheels/ (the file's sha256 is recorded; a present file that matches is reused
     without calling pip);
  2. unzip the parts a build needs (headers, libraries, CMake package) once per wheel sha256;
  3. cmake with a generated toolchain file (stamped on sources + wheel + toolchain, like build.py);
  4. stage the output folders, then register on/off for each platform asked for.

CLI: python -m sme2farm.runners.cross [--platform linux-arm64|android-arm64] [--manifest PATH] [--force]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from sme2farm.runners.build import BINARY_NAME, SOURCES, BuildError, _cmake, _run, executorch_package
from sme2farm.runners.catalog import RUNNERS_DIR, Catalog, RunnerBuild, sha256_file
from sme2farm.runners.elf import EM_AARCH64, ElfInfo, read_elf

TRIPLE = "aarch64-linux-gnu"
SYSROOT = Path("/usr") / TRIPLE
WHEEL_PLATFORM = "manylinux_2_28_aarch64"
WHEEL_PYTHON = "3.11"            # any cp3x wheel carries the same C++ libraries; pinned for a stable file
LOADER = "ld-linux-aarch64.so.1"
ORIGIN = "wheel-cross"
HIDE_ENV = {"SME2FARM_HIDE_SME2": "1"}
# What a build needs from the wheel (73 MB unpacked in full; these parts are ~14 MB).
WHEEL_PARTS = ("executorch/include/", "executorch/lib/", "executorch/share/", "executorch/version.py")

# CLI spelling -> catalog platform. "android-arm64" is what people type; the catalog (and the
# Android driver) say android-arm64-v9a.
PLATFORMS = {"linux-arm64": "linux-arm64", "android-arm64": "android-arm64-v9a",
             "android-arm64-v9a": "android-arm64-v9a"}


def canonical_platform(name: str) -> str:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise BuildError(f"no cross build for platform {name!r}; choose one of {', '.join(PLATFORMS)}") from None


# ---- ELF edits (the reader is runners/elf.py) ---------------------------------------------------

def set_runpath_origin(path: Path) -> None:
    """Rewrite the runner's RUNPATH to exactly "$ORIGIN" in place (what `chrpath -r` does).

    The wheel's CMake targets add `$ORIGIN:$ORIGIN/../lib:<absolute unpacked wheel>/lib`: the
    absolute build-host path means nothing on a device, and on this host it would let a test pass
    even if a library were missing beside the runner. The new string is shorter, so it is written
    over the old one; refused if any other name shares the overwritten bytes (linker tail-merging)."""
    info = read_elf(path)
    if info.runpath_ref < 0:
        raise BuildError(f"{path} has no RUNPATH to rewrite")
    new, old_len = b"$ORIGIN", len(info.runpath.encode())
    if info.runpath == "$ORIGIN":
        return
    if old_len < len(new):
        raise BuildError(f"{path}: RUNPATH {info.runpath!r} is shorter than $ORIGIN")
    lo = info.runpath_ref
    if any(lo < r < lo + old_len for r in info.string_refs):
        raise BuildError(f"{path}: RUNPATH bytes are shared with other names; cannot rewrite in place")
    with open(path, "r+b") as f:
        f.seek(info.strtab_offset + lo)
        f.write(new + b"\0" * (old_len - len(new)))
    if read_elf(path).runpath != "$ORIGIN":
        raise BuildError(f"{path}: RUNPATH rewrite did not take")


def min_versions(info: ElfInfo) -> dict[str, str]:
    """Highest symbol version needed per prefix (GLIBC, GLIBCXX, CXXABI, GCC): the oldest target
    system the linux-arm64 folder runs on."""
    best: dict[str, tuple[int, ...]] = {}
    for names in info.version_needs.values():
        for n in names:
            m = re.fullmatch(r"([A-Z]+)_([0-9.]+)", n)
            if m:
                v = tuple(int(x) for x in m.group(2).split("."))
                best[m.group(1)] = max(best.get(m.group(1), v), v)
    return {k: ".".join(map(str, v)) for k, v in sorted(best.items())}


# ---- the wheel --------------------------------------------------------------------------------

@dataclass
class Wheel:
    path: Path
    sha256: str
    version: str       # the pip pin (public version, no local label)


def pinned_version() -> str:
    """The installed executorch's public version (1.5.1 for 1.5.1+cpu): the wheel must match the
    exporter that writes the programs, so the pin follows the install."""
    _, version, _ = executorch_package()
    return version.split("+", 1)[0]


def fetch_wheel(version: str, cache: Path) -> Wheel:
    """The aarch64 wheel in `cache`, downloaded by pip unless a file whose sha256 matches the
    record is already there. A file that no longer matches its record is fetched again; a fresh
    download that differs from the record is refused (the pin is the recorded sha256)."""
    cache.mkdir(parents=True, exist_ok=True)
    record_file = cache / "wheels.json"
    records = json.loads(record_file.read_text()) if record_file.exists() else {}
    key = f"executorch=={version} {WHEEL_PLATFORM} cp{WHEEL_PYTHON.replace('.', '')}"
    rec = records.get(key)
    if rec and (cache / rec["file"]).is_file():
        if sha256_file(cache / rec["file"]) == rec["sha256"]:
            return Wheel(cache / rec["file"], rec["sha256"], version)
        (cache / rec["file"]).unlink()          # damaged or replaced: fetch it again
    argv = [sys.executable, "-m", "pip", "download", f"executorch=={version}", "--platform", WHEEL_PLATFORM,
            "--python-version", WHEEL_PYTHON, "--only-binary=:all:", "--no-deps", "--disable-pip-version-check",
            "-d", str(cache)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"pip download of the aarch64 executorch=={version} wheel failed:\n{r.stdout[-800:]}{r.stderr[-800:]}")
    found = sorted(cache.glob(f"executorch-{version}*-{WHEEL_PLATFORM}.whl"))
    found = [p for p in found if f"-cp{WHEEL_PYTHON.replace('.', '')}-" in p.name] or found
    if not found:
        raise BuildError(f"pip reported success but no executorch-{version}*{WHEEL_PLATFORM}.whl is in {cache}")
    wheel = found[-1]
    sha = sha256_file(wheel)
    if rec and rec["sha256"] != sha:
        raise BuildError(f"{wheel.name} has sha256 {sha}, but {rec['sha256']} was recorded in {record_file}; "
                         "remove that entry to accept the new file")
    records[key] = {"file": wheel.name, "sha256": sha}
    tmp = record_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    tmp.replace(record_file)
    return Wheel(wheel, sha, version)


def unpack_wheel(wheel: Wheel, cache: Path) -> Path:
    """<cache>/<sha16>/executorch: the wheel's headers, libraries and CMake package (once per sha)."""
    root = cache / wheel.sha256[:16]
    if (root / ".complete").exists():
        return root / "executorch"
    tmp = cache / f".{wheel.sha256[:16]}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel.path) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith(WHEEL_PARTS)])
    (tmp / ".complete").write_text(wheel.sha256 + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root / "executorch"


def wheel_git_commit(et_dir: Path) -> str:
    m = re.search(r"git_version[^=]*=\s*'([0-9a-f]+)'", (et_dir / "version.py").read_text())
    return m.group(1) if m else ""


def wheel_version(et_dir: Path) -> str:
    m = re.search(r"__version__\s*=\s*\"([^\"]+)\"", (et_dir / "version.py").read_text())
    return m.group(1) if m else ""


# ---- toolchain and build ----------------------------------------------------------------------

def _tool(name: str) -> str:
    path = shutil.which(f"{TRIPLE}-{name}")
    if not path:
        raise BuildError(f"{TRIPLE}-{name} not found: apt-get install g++-{TRIPLE} (listed in .ci/apt-packages.txt)")
    return path


def toolchain_version() -> str:
    return subprocess.run([_tool("g++"), "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def write_toolchain_file(path: Path, et_dir: Path) -> None:
    # Package mode BOTH: CMAKE_PREFIX_PATH names the unpacked wheel by its host path, which the
    # ONLY mode would re-root under the sysroot and not find. Libraries and headers stay ONLY so
    # nothing from the x86 host leaks into an aarch64 link.
    path.write_text(f"""# Generated by sme2farm.runners.cross: aarch64 Linux with Debian's cross toolchain.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER {shutil.which(f"{TRIPLE}-gcc") or _tool("g++")})
set(CMAKE_CXX_COMPILER {_tool("g++")})
set(CMAKE_FIND_ROOT_PATH {SYSROOT} {et_dir})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
""")


def _stamp(wheel_sha: str, toolchain: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((RUNNERS_DIR / name).read_bytes())
    h.update(f"{wheel_sha}\0{toolchain}\0{TRIPLE}\0runpath=$ORIGIN".encode())
    return h.hexdigest()


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _resolve_needed(name: str, search: list[Path]) -> Path:
    for d in search:
        if (d / name).is_file():
            return d / name
    raise BuildError(f"no {name} (needed by the runner or its libraries) in {', '.join(map(str, search))}")


def needed_closure(binary: Path, search: list[Path]) -> dict[str, Path]:
    """Every library the binary needs, recursively (DT_NEEDED), name -> file (libc.so.6 brings
    the loader in by name). The binary itself is not included."""
    out: dict[str, Path] = {}
    todo = list(read_elf(binary).needed)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = _resolve_needed(name, search)
        todo.extend(read_elf(out[name]).needed)
    return out


def _stage(dest: Path, binary: Path, libs: dict[str, Path]) -> None:
    """Make `dest` hold exactly the binary and `libs` (by their NEEDED names, symlinks resolved:
    adb push and zip keep no links), copying only what differs."""
    dest.mkdir(parents=True, exist_ok=True)
    want = {BINARY_NAME: binary, **libs}
    for old in dest.iterdir():
        if old.name not in want and not old.name.startswith("."):
            old.unlink() if old.is_file() or old.is_symlink() else shutil.rmtree(old)
    for name, src in want.items():
        target = dest / name
        if target.is_file() and not target.is_symlink() and target.stat().st_size == src.stat().st_size \
                and sha256_file(target) == sha256_file(src):
            continue
        tmp = dest / f".{name}.tmp"
        shutil.copyfile(src.resolve(), tmp)
        os.chmod(tmp, 0o755)
        tmp.replace(target)


@dataclass
class CrossBuild:
    binary: Path          # the built runner (RUNPATH $ORIGIN), in the cmake tree's out/ folder
    sha256: str
    wheel: Wheel
    et_dir: Path
    toolchain: str
    build_s: float        # seconds the compile that made this binary took (from the stamp when up to date)


def build_cross(build_root: Path | None = None, force: bool = False) -> CrossBuild:
    """Fetch, unpack, configure and build (each step skipped when up to date)."""
    root = Path(build_root) if build_root else RUNNERS_DIR / "build"
    with _locked(root / ".cross-aarch64.lock"):
        return _build_cross(root, force)


def _build_cross(root: Path, force: bool) -> CrossBuild:
    cache = root / "wheels"
    tree = root / "cross-aarch64"
    wheel = fetch_wheel(pinned_version(), cache)
    et_dir = unpack_wheel(wheel, cache)
    toolchain = toolchain_version()
    tree.mkdir(parents=True, exist_ok=True)
    out = tree / "out" / BINARY_NAME
    stamp_file = tree / "stamp.json"
    stamp = _stamp(wheel.sha256, toolchain)
    current = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
    if force or current.get("stamp") != stamp or not out.is_file():
        log = tree / "build.log"
        log.write_text("")
        t0 = time.monotonic()
        tc = tree / "aarch64-toolchain.cmake"
        write_toolchain_file(tc, et_dir)
        # A different wheel means a different toolchain file and prefix: start the cache afresh.
        fresh = ["--fresh"] if current.get("wheel_sha256") != wheel.sha256 else []
        _run([_cmake(), "-S", str(RUNNERS_DIR), "-B", str(tree), *fresh, f"-DCMAKE_TOOLCHAIN_FILE={tc}",
              f"-DCMAKE_PREFIX_PATH={et_dir}", "-DCMAKE_BUILD_TYPE=Release",
              # PyPI's cmake does not find make by itself under a cross toolchain file.
              f"-DCMAKE_MAKE_PROGRAM={shutil.which('make') or '/usr/bin/make'}"], log)
        _run([_cmake(), "--build", str(tree), "--target", BINARY_NAME, "-j", str(os.cpu_count() or 1)]
             + (["--clean-first"] if force else []), log)
        built = tree / BINARY_NAME
        if not built.is_file():
            raise BuildError(f"the build finished but {built} is missing; log {log}")
        out.parent.mkdir(exist_ok=True)
        tmp = out.with_suffix(".tmp")
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        set_runpath_origin(tmp)
        tmp.replace(out)
        build_s = round(time.monotonic() - t0, 2)
        stamp_file.write_text(json.dumps({"stamp": stamp, "wheel_sha256": wheel.sha256,
                                          "build_s": build_s}) + "\n")
    else:
        build_s = float(current.get("build_s", 0.0))
    if read_elf(out).machine != EM_AARCH64:
        raise BuildError(f"{out} is not an aarch64 executable")
    return CrossBuild(binary=out, sha256=sha256_file(out), wheel=wheel, et_dir=et_dir,
                      toolchain=toolchain, build_s=build_s)


def _glibc_search() -> list[Path]:
    """Where the cross toolchain's target libraries are: the sysroot's glibc, then libstdc++ and
    libgcc_s as the compiler reports them (Debian keeps them in the sysroot too)."""
    dirs = [SYSROOT / "lib"]
    for name in ("libstdc++.so.6", "libgcc_s.so.1"):
        p = subprocess.run([_tool("g++"), f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
        if p and Path(p).is_file() and Path(p).resolve().parent not in dirs:
            dirs.append(Path(p).resolve().parent)
    return dirs


def build_platform(platform: str, manifest: Path | None = None, build_root: Path | None = None,
                   force: bool = False) -> list[RunnerBuild]:
    """Build (unless up to date), stage the platform's folder and register both SME2 arms."""
    plat = canonical_platform(platform)
    root = Path(build_root) if build_root else RUNNERS_DIR / "build"
    dest = root / f"wheel-{plat}"
    # One lock over build, staging and registration: a concurrent build (runner.cpp edited
    # meanwhile) must not swap the binary in between, or the registered sha256 would not be the
    # staged file's.
    with _locked(root / ".cross-aarch64.lock"):
        cb = _build_cross(root, force)
        wheel_lib = cb.et_dir / "lib"
        closure = needed_closure(cb.binary, [wheel_lib, *_glibc_search()])
        if plat == "linux-arm64":
            # Only the wheel's libraries travel: glibc, libstdc++ and libgcc_s are the host's own.
            libs = {n: p for n, p in closure.items() if p.parent == wheel_lib}
        else:
            # Everything, loader included (libc.so.6 names it, so the closure has it already).
            libs = {**closure, LOADER: closure.get(LOADER) or _resolve_needed(LOADER, [SYSROOT / "lib"])}
        _stage(dest, cb.binary, libs)
        binary = dest / BINARY_NAME
        files = sorted(libs)
        info = read_elf(binary)
        # What the target system must provide: for linux-arm64 the host's glibc/libstdc++ serve the
        # runner and the wheel's libraries (manylinux_2_28), so take the highest over all of them.
        for n in files:
            info.version_needs.update({f"{n}:{k}": v for k, v in read_elf(dest / n).version_needs.items()})
        provenance = {
            "toolchain": cb.toolchain, "sysroot": str(SYSROOT), "cmake_toolchain_file": "generated by runners/cross.py",
            "wheel": cb.wheel.path.name, "wheel_sha256": cb.wheel.sha256, "build_s": cb.build_s,
            "runpath": info.runpath,
            # The Android bundle brings its own glibc, so only the Linux folder asks anything of its host.
            **({"requires": min_versions(info)} if plat == "linux-arm64" else {}),
            "bundle_files": len(files) + 1,
            "bundle_bytes": sum((dest / n).stat().st_size for n in [BINARY_NAME, *files]),
        }
        sha = sha256_file(binary)
        catalog_path = Path(manifest) if manifest else None
        with _locked((catalog_path or Catalog.load().manifest).with_suffix(".lock")):
            catalog = Catalog.load(catalog_path)
            try:
                path = str(binary.resolve().relative_to(catalog.manifest.parent.resolve()))
            except ValueError:
                path = str(binary.resolve())
            builds = []
            for arm, env in (("on", {}), ("off", dict(HIDE_ENV))):
                b = RunnerBuild(id=f"wheel-{plat}-sme2{arm}-timing-{sha[:8]}", platform=plat, sme2=arm,
                                flavour="timing", path=path, sha256=sha,
                                executorch_version=wheel_version(cb.et_dir) or cb.wheel.version,
                                executorch_commit=wheel_git_commit(cb.et_dir), extra_files=files,
                                origin=ORIGIN, env=env, loader=LOADER if plat != "linux-arm64" else "",
                                supports_outputs=True,
                                provenance=dict(provenance))
                catalog.register(b)
                builds.append(b)
            catalog.save()
    return builds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sme2farm.runners.cross",
                                description="Cross-build the arm64 runner from the PyPI wheel and register both SME2 arms.")
    p.add_argument("--platform", action="append", choices=sorted(PLATFORMS),
                   help="linux-arm64 and/or android-arm64 (repeatable; default both)")
    p.add_argument("--manifest", type=Path)
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    a = p.parse_args(argv)
    try:
        for plat in a.platform or ["linux-arm64", "android-arm64"]:
            for b in build_platform(plat, a.manifest, force=a.force):
                print(json.dumps(asdict(b)))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
