"""Prebuilt arm64 runners: runners/runner.cpp cross-compiled against PyPI's aarch64 executorch
wheel with Debian's aarch64 toolchain, and registered for both SME2 arms.

    linux-arm64          the runner with the wheel's libraries beside it (RUNPATH $ORIGIN): copy
                         the folder to an arm64 Linux host (glibc >= the recorded minimum) and run.
    android-arm64-v9a    the same binary plus glibc's loader and every library it needs, run as
                         `<dir>/ld-linux-aarch64.so.1 --library-path <dir> <dir>/runner ...`, so a
                         phone's bionic is never involved (no NDK).

One binary serves both arms: "on" runs as the hardware is; "off" sets SME2FARM_HIDE_SME2=1, which
makes libsme2farm_hide (runners/sme2_hide.c, the runner's LAST DT_NEEDED so glibc initialises it
before the XNNPACK backend; checked here in the built ELF) clear cpuinfo_isa's SME fields after
checking them against getauxval(AT_HWCAP2), and the runner's exported getauxval() clear
HWCAP2_SME/SME2 for every other caller (the facts, and where that is and is not the kit's
two-build comparison: docs/design.md, "arm64 runners from the PyPI wheel" and "One runner
binary, both arms").

Steps, each skipped when its result is already there:
  1. `pip download executorch==<installed version> --platform manylinux_2_28_aarch64` into
     runners/build/wheels/ (the file's sha256 is recorded; a present file that matches is reused
     without calling pip);
  2. unzip the parts a build needs (headers, libraries, CMake package) once per wheel sha256;
  3. cmake with a generated toolchain file (stamped on sources + wheel + toolchain, like build.py);
  4. stage the output folders, then register on/off for each platform asked for.

Here: the build and the registration. The wheel is runners/wheel.py, the toolchain
runners/toolchain.py, the staged folder runners/bundle.py, the ELF facts and edits runners/elf.py.

CLI: python -m sme2farm.runners.cross [--platform linux-arm64|android-arm64] [--manifest PATH] [--force]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from sme2farm.runners.bundle import needed_closure, resolve_needed, stage
from sme2farm.runners.catalog import RUNNERS_DIR, Catalog, RunnerBuild, sha256_file
from sme2farm.runners.elf import EM_AARCH64, min_versions, read_elf, set_runpath_origin
from sme2farm.runners.toolchain import SYSROOT, TRIPLE, target_library_dirs, toolchain_version, write_toolchain_file
from sme2farm.runners.tools import BINARY_NAME, SOURCES, BuildError, cmake_binary, run_logged
from sme2farm.runners.wheel import Wheel, fetch_wheel, pinned_version, unpack_wheel, wheel_git_commit, wheel_version

LOADER = "ld-linux-aarch64.so.1"
ORIGIN = "wheel-cross"
HIDE_ENV = {"SME2FARM_HIDE_SME2": "1"}
HIDE_LIBRARY = "libsme2farm_hide.so"


def check_hide_order(needed: list[str], hide_deps: set[str], binary: Path) -> None:
    """glibc runs initialisers in reverse DT_NEEDED order, each object after its own dependencies:
    libsme2farm_hide must come after every library of the runner that is not one of its own
    dependencies (`hide_deps`, which glibc initialises before it whatever their place), or its
    constructor could run after the XNNPACK backend's has read cpuinfo_isa, and the off arm would
    rest on the getauxval layer alone."""
    if HIDE_LIBRARY not in needed:
        raise BuildError(f"{binary} does not need {HIDE_LIBRARY}: the SME2-off arm could not hide SME2 through cpuinfo")
    after = [n for n in needed[needed.index(HIDE_LIBRARY) + 1:] if n not in hide_deps]
    if after:
        raise BuildError(f"{binary}: {HIDE_LIBRARY} comes before {', '.join(after)} in DT_NEEDED, so glibc would "
                         "initialise it after them (the XNNPACK backend among them, or a library it could reach); "
                         "it must be the last DT_NEEDED but for its own dependencies")


# CLI spelling -> catalog platform. "android-arm64" is what people type; the catalog (and the
# Android driver) say android-arm64-v9a.
PLATFORMS = {"linux-arm64": "linux-arm64", "android-arm64": "android-arm64-v9a",
             "android-arm64-v9a": "android-arm64-v9a"}


def canonical_platform(name: str) -> str:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise BuildError(f"no cross build for platform {name!r}; choose one of {', '.join(PLATFORMS)}") from None


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


@dataclass
class CrossBuild:
    binary: Path          # the built runner (RUNPATH $ORIGIN), in the cmake tree's out/ folder
    sha256: str
    wheel: Wheel
    et_dir: Path
    toolchain: str
    build_s: float        # seconds the compile that made this binary took (from the stamp when up to date)


def _build(root: Path, force: bool) -> CrossBuild:
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
        run_logged([cmake_binary(), "-S", str(RUNNERS_DIR), "-B", str(tree), *fresh, f"-DCMAKE_TOOLCHAIN_FILE={tc}",
              f"-DCMAKE_PREFIX_PATH={et_dir}", "-DCMAKE_BUILD_TYPE=Release",
              # PyPI's cmake does not find make by itself under a cross toolchain file.
              f"-DCMAKE_MAKE_PROGRAM={shutil.which('make') or '/usr/bin/make'}"], log)
        run_logged([cmake_binary(), "--build", str(tree), "--target", BINARY_NAME, "-j", str(os.cpu_count() or 1)]
             + (["--clean-first"] if force else []), log)
        built = tree / BINARY_NAME
        if not built.is_file():
            raise BuildError(f"the build finished but {built} is missing; log {log}")
        out.parent.mkdir(exist_ok=True)
        for src, dst in ((tree / HIDE_LIBRARY, out.parent / HIDE_LIBRARY), (built, out)):
            if not src.is_file():
                raise BuildError(f"the build finished but {src} is missing; log {log}")
            tmp = dst.with_suffix(".tmp")
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o755)
            set_runpath_origin(tmp)
            tmp.replace(dst)
        build_s = round(time.monotonic() - t0, 2)
        stamp_file.write_text(json.dumps({"stamp": stamp, "wheel_sha256": wheel.sha256,
                                          "build_s": build_s}) + "\n")
    else:
        build_s = float(current.get("build_s", 0.0))
    info = read_elf(out)
    if info.machine != EM_AARCH64:
        raise BuildError(f"{out} is not an aarch64 executable")
    hide_deps = set(needed_closure(out.parent / HIDE_LIBRARY, [et_dir / "lib", *target_library_dirs()]))
    check_hide_order(info.needed, hide_deps, out)
    return CrossBuild(binary=out, sha256=sha256_file(out), wheel=wheel, et_dir=et_dir,
                      toolchain=toolchain, build_s=build_s)


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
        cb = _build(root, force)
        wheel_lib = cb.et_dir / "lib"
        closure = needed_closure(cb.binary, [cb.binary.parent, wheel_lib, *target_library_dirs()])
        if plat == "linux-arm64":
            # Only the wheel's libraries and libsme2farm_hide travel: glibc, libstdc++ and libgcc_s
            # are the host's own.
            libs = {n: p for n, p in closure.items() if p.parent in (wheel_lib, cb.binary.parent)}
        else:
            # Everything, loader included (libc.so.6 names it, so the closure has it already).
            libs = {**closure, LOADER: closure.get(LOADER) or resolve_needed(LOADER, [SYSROOT / "lib"])}
        stage(dest, cb.binary, libs)
        binary = dest / BINARY_NAME
        files = sorted(libs)
        info = read_elf(binary)
        # What the target system must provide: for linux-arm64 the host's glibc/libstdc++ serve the
        # runner and the wheel's libraries (manylinux_2_28), so take the highest over all of them.
        for n in files:
            info.version_needs.update({f"{n}:{k}": v for k, v in read_elf(dest / n).version_needs.items()})
        provenance = {
            "toolchain": cb.toolchain, "sysroot": str(SYSROOT), "cmake_toolchain_file": "generated by runners/toolchain.py",
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
                                supports_outputs=True, supports_memory=True, supports_llm=True,
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
