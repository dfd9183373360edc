"""Build the local runner (runners/runner.cpp) against the installed executorch wheel and
register it in the runner catalog: on Linux and on an Apple Silicon Mac, with no ExecuTorch
checkout.

The build goes to runners/build/<platform>/ with the pip `cmake` (the wheel's imported targets
need CMake >= 3.28) and is skipped when the runner sources, CMakeLists and the executorch version
are unchanged. On macOS it uses the system's clang (/usr/bin/clang, the Xcode Command Line Tools)
and links @rpath to the wheel's dylibs (the wheel's CMake package adds its lib folder as an
LC_RPATH): the runner runs in place. plan_host_build() writes the command lines once; a real
build runs them and `--dry-run` prints them (for macos-arm64 on any host: off a Mac the real
macOS wheel, fetched by pip, stands in for the installed one, and its Mach-O facts are checked).

SME2 honesty: the wheel's XNNPACK is ONE build, so this produces one binary.
 * x86-64 host: registered as sme2 "off" only; it cannot run SME2 code.
 * arm64 host (linux-arm64, macos-arm64) whose wheel's XNNPACK carries SME2 microkernels (their
   `__neonsme2` names are in the library): BOTH arms are registered from the one binary, "on" as
   the hardware is and "off" with SME2FARM_HIDE_SME2=1, which libsme2farm_hide
   (runners/sme2_hide.c, built beside the runner) turns into cleared SME fields in cpuinfo_isa
   before XNNPACK reads them, checked against the OS first (docs/design.md, "One runner binary,
   both arms"). Whether the "on" arm can run on a device is the device's SME2, decided at
   scheduling. A wheel whose XNNPACK has no SME2 kernels gives "off" only.
The kit's two-build pair (XNNPACK_ENABLE_ARM_SME2=OFF) and the xnnlog flavour come from
sme2farm.runners.recipe.

CLI: python -m sme2farm.runners.build [--manifest PATH] [--force] [--platform macos-arm64 --dry-run]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sme2farm.runners.catalog import DEFAULT_MANIFEST, RUNNERS_DIR, Catalog, RunnerBuild, sha256_file
from sme2farm.runners.cpuinfo import host_hwcap2_sme2
from sme2farm.runners.tools import BINARY_NAME, SOURCES, BuildError, cmake_binary, executorch_package, run_logged

SME2_KERNEL_MARKER = b"__neonsme2"  # suffix of XNNPACK's SME2 microkernel names
HIDE_ENV = {"SME2FARM_HIDE_SME2": "1"}
ARM64_HOSTS = ("linux-arm64", "macos-arm64")
MAC_CLANG = "/usr/bin/clang"        # the system's clang (the Xcode Command Line Tools' shim)


def host_platform() -> str:
    system, machine = platform.system(), platform.machine().lower()
    if system == "Linux" and machine in ("x86_64", "amd64"):
        return "linux-x86_64"
    if system == "Linux" and machine in ("aarch64", "arm64"):
        return "linux-arm64"
    if system == "Darwin" and machine == "arm64":
        return "macos-arm64"
    raise BuildError(f"no local runner platform for {system} {machine}")


def host_has_sme2() -> bool:
    if platform.system() == "Darwin":
        r = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_SME2"], capture_output=True, text=True)
        return r.stdout.strip() == "1"
    return bool(host_hwcap2_sme2())


def sme2_mode(host_sme2: bool, xnnpack_lib: Path) -> str:
    """'on' or 'off' for the wheel's single build used as it is on this host (see the module
    docstring): the arm a host without libsme2farm_hide (x86-64) registers."""
    if not host_sme2:
        return "off"
    return "on" if SME2_KERNEL_MARKER in xnnpack_lib.read_bytes() else "off"


def library_suffix(plat: str) -> str:
    return ".dylib" if plat.startswith("macos") else ".so"


def host_arms(plat: str, xnnpack_lib: Path, host_sme2: bool) -> list[tuple[str, dict[str, str]]]:
    """(sme2, env) for each arm the build registers: both on an arm64 host whose XNNPACK has SME2
    kernels (one binary, libsme2farm_hide for the off arm), else the one sme2_mode says."""
    if plat in ARM64_HOSTS and SME2_KERNEL_MARKER in xnnpack_lib.read_bytes():
        return [("on", {}), ("off", dict(HIDE_ENV))]
    return [(sme2_mode(host_sme2, xnnpack_lib), {})]


@dataclass
class HostBuildPlan:
    platform: str
    et_dir: Path                    # the executorch package linked against (the Mac's installed wheel)
    build_dir: Path
    binary: Path
    hide_library: Path | None       # libsme2farm_hide beside the runner (arm64 hosts)
    xnnpack_library: Path
    cmake_args: list[str]           # what configure is given besides -S/-B
    commands: list[list[str]]       # configure, then build


def plan_host_build(plat: str, et_dir: Path, force: bool = False, cmake: str | None = None,
                    build_root: Path | None = None) -> HostBuildPlan:
    """The command lines that build the runner for `plat` against `et_dir`: the one place they are
    written, for a real build and for --dry-run alike."""
    build_dir = (build_root or RUNNERS_DIR / "build") / plat
    args = [f"-DCMAKE_PREFIX_PATH={et_dir}", "-DCMAKE_BUILD_TYPE=Release"]
    if plat == "macos-arm64":
        from sme2farm.runners.macho import read_macho

        # The wheel's dylibs say the oldest macOS they run on (LC_BUILD_VERSION minos): the same here.
        minos = read_macho(et_dir / "lib" / "libexecutorch_threadpool.dylib").minos
        args += [f"-DCMAKE_C_COMPILER={MAC_CLANG}", f"-DCMAKE_CXX_COMPILER={MAC_CLANG}++",
                 "-DCMAKE_OSX_ARCHITECTURES=arm64", f"-DCMAKE_OSX_DEPLOYMENT_TARGET={minos}"]
    cm = cmake or cmake_binary()
    commands = [[cm, "-S", str(RUNNERS_DIR), "-B", str(build_dir), *args],
                [cm, "--build", str(build_dir), "--target", BINARY_NAME, "-j", str(os.cpu_count() or 1)]
                + (["--clean-first"] if force else [])]
    suffix = library_suffix(plat)
    return HostBuildPlan(platform=plat, et_dir=et_dir, build_dir=build_dir, binary=build_dir / BINARY_NAME,
                         hide_library=build_dir / f"libsme2farm_hide{suffix}" if plat in ARM64_HOSTS else None,
                         xnnpack_library=et_dir / "lib" / f"libexecutorch_backend_xnnpack{suffix}",
                         cmake_args=args, commands=commands)


def macos_wheel_facts(et_dir: Path) -> list[str]:
    """What the macOS build and its off arm rely on in the wheel, read from its Mach-O files; one
    line each. Raises BuildError naming the first fact that does not hold."""
    from sme2farm.runners.macho import CPU_TYPE_ARM64, MH_DYLIB, read_macho

    lib = et_dir / "lib"
    facts = []
    for name in ("libexecutorch", "libexecutorch_threadpool", "libexecutorch_backend_xnnpack",
                 "libexecutorch_kernels_optimized", "libexecutorch_kernels_quantized", "libexecutorch_etdump"):
        path = lib / f"{name}.dylib"
        if not path.is_file():
            raise BuildError(f"the macOS wheel has no {path.name} in {lib}")
        m = read_macho(path)
        if m.cputype != CPU_TYPE_ARM64 or m.filetype != MH_DYLIB or m.install_name != f"@rpath/{name}.dylib":
            raise BuildError(f"{path} is not an arm64 dylib named @rpath/{name}.dylib (install name "
                             f"{m.install_name!r})")
    facts.append("every runtime dylib is arm64 with install name @rpath/<its file name>")
    tp = read_macho(lib / "libexecutorch_threadpool.dylib")
    missing = {"_cpuinfo_isa", "_cpuinfo_initialize"} - tp.exported
    if missing:
        raise BuildError(f"libexecutorch_threadpool.dylib does not export {', '.join(sorted(missing))}: "
                         "libsme2farm_hide cannot reach cpuinfo's state")
    facts.append("libexecutorch_threadpool.dylib exports _cpuinfo_isa and _cpuinfo_initialize")
    xnn = read_macho(lib / "libexecutorch_backend_xnnpack.dylib")
    for sym in ("_cpuinfo_isa", "_cpuinfo_initialize"):
        if xnn.imports.get(sym) != "@rpath/libexecutorch_threadpool.dylib":
            raise BuildError(f"libexecutorch_backend_xnnpack.dylib takes {sym} from {xnn.imports.get(sym)!r}, not "
                             "libexecutorch_threadpool.dylib: its cpuinfo state is not the one libsme2farm_hide clears")
    facts.append("libexecutorch_backend_xnnpack.dylib binds _cpuinfo_isa and _cpuinfo_initialize to "
                 "@rpath/libexecutorch_threadpool.dylib (one cpuinfo state per process)")
    facts.append(f"the dylibs are built for macOS {tp.minos} or newer")
    return facts


def check_hide_first(binary: Path) -> None:
    """dyld initialises images in load-command order, each after its own dependencies: the macOS
    runner's first dylib must be libsme2farm_hide, or XNNPACK may read cpuinfo_isa before it."""
    from sme2farm.runners.macho import read_macho

    dylibs = read_macho(binary).dylibs
    if not dylibs or dylibs[0] != "@rpath/libsme2farm_hide.dylib":
        raise BuildError(f"{binary}: the first dylib it loads is {dylibs[0] if dylibs else 'none'!r}, not "
                         "@rpath/libsme2farm_hide.dylib, so dyld could initialise XNNPACK before it")


def _stamp(et_dir: Path, et_version: str, et_commit: str, plan: HostBuildPlan) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((RUNNERS_DIR / name).read_bytes())
    h.update(f"{et_dir}\0{et_version}\0{et_commit}\0{' '.join(plan.cmake_args)}".encode())
    return h.hexdigest()


def check_built(plan: HostBuildPlan) -> None:
    """The link order libsme2farm_hide needs, read from the built binary."""
    if plan.hide_library is None:
        return
    if not plan.hide_library.is_file():
        raise BuildError(f"the build finished but {plan.hide_library} is missing")
    if plan.platform == "macos-arm64":
        check_hide_first(plan.binary)
    else:
        from sme2farm.runners.cross import check_hide_order
        from sme2farm.runners.elf import read_elf

        # Its dependencies by name: the wheel's, followed; the system's (libc, libstdc++) by name only.
        deps: set[str] = set()
        todo = list(read_elf(plan.hide_library).needed)
        while todo:
            name = todo.pop()
            if name not in deps:
                deps.add(name)
                if (plan.et_dir / "lib" / name).is_file():
                    todo.extend(read_elf(plan.et_dir / "lib" / name).needed)
        check_hide_order(read_elf(plan.binary).needed, deps, plan.binary)


def _register(plan: HostBuildPlan, manifest: Path | None, et_version: str, et_commit: str,
              sha: str, provenance: dict) -> list[RunnerBuild]:
    catalog = Catalog.load(manifest)
    try:
        path = str(plan.binary.relative_to(catalog.manifest.parent.resolve()))
    except ValueError:
        path = str(plan.binary)
    builds = []
    for sme2, env in host_arms(plan.platform, plan.xnnpack_library, host_has_sme2()):
        b = RunnerBuild(id=f"local-{plan.platform}-sme2{sme2}-timing-{sha[:8]}", platform=plan.platform, sme2=sme2,
                        flavour="timing", path=path, sha256=sha, executorch_version=et_version,
                        executorch_commit=et_commit, env=env, supports_outputs=True, supports_memory=True,
                        supports_llm=True, provenance=dict(provenance))
        catalog.register(b)
        builds.append(b)
    catalog.save()
    return builds


def build_host(manifest: Path | None = None, force: bool = False) -> list[RunnerBuild]:
    """Build (unless up to date) and register the local runner: every arm it serves here."""
    plat = host_platform()
    et_dir, et_version, et_commit = executorch_package()
    if plat == "macos-arm64":
        # /usr/bin/clang is a shim present on every Mac; it works once the command line tools are in.
        tools = subprocess.run(["xcode-select", "-p"], capture_output=True, text=True)
        if tools.returncode != 0 or not Path(tools.stdout.strip()).is_dir() or not Path(MAC_CLANG).exists():
            raise BuildError("the Xcode Command Line Tools are not installed (the system clang builds the runner): "
                             "run xcode-select --install, then build again")
        macos_wheel_facts(et_dir)
    plan = plan_host_build(plat, et_dir, force=force)
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    stamp_file = plan.build_dir / "stamp.json"
    stamp = _stamp(et_dir, et_version, et_commit, plan)

    # Concurrent test sessions share runners/build: one cmake at a time per build dir.
    with open(plan.build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
        if force or current.get("stamp") != stamp or not plan.binary.exists():
            log = plan.build_dir / "build.log"
            log.write_text("")
            t0 = time.monotonic()
            for argv in plan.commands:
                run_logged(argv, log)
            if not plan.binary.exists():
                raise BuildError(f"the build finished but {plan.binary} is missing; log {log}")
            check_built(plan)
            stamp_file.write_text(json.dumps({"stamp": stamp, "build_s": round(time.monotonic() - t0, 2)}) + "\n")
        provenance = {"cmake_args": plan.cmake_args} if plan.hide_library else {}
        if plan.hide_library:
            provenance["hide_library"] = plan.hide_library.name
        return _register(plan, manifest, et_version, et_commit, sha256_file(plan.binary), provenance)


def build_local(manifest: Path | None = None, force: bool = False) -> RunnerBuild:
    """Build and register the local runner (build_host); returns the arm this host runs as it is."""
    builds = build_host(manifest, force)
    want = "on" if host_has_sme2() else "off"
    return next((b for b in builds if b.sme2 == want), builds[0])


def macos_stand_in(say: Callable[[str], None]) -> tuple[Path, str, str]:
    """Off a Mac: the real macOS arm64 wheel (pip download, cached and sha256-recorded like the
    aarch64 one) unpacked, standing in for the installed one, as (package dir, version, commit)."""
    from sme2farm.runners.wheel import (MACOS_WHEEL_PLATFORM, fetch_wheel, pinned_version, unpack_wheel,
                                        wheel_git_commit, wheel_version)

    cache = RUNNERS_DIR / "build" / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".macos-wheel.lock", "w") as lock:   # concurrent sessions share the cache
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = fetch_wheel(pinned_version(), cache, MACOS_WHEEL_PLATFORM)
        et_dir = unpack_wheel(wheel, cache)
    say(f"# this host is not a Mac: the macOS wheel {wheel.path.name} (sha256 {wheel.sha256[:16]}…, unpacked in "
        f"{et_dir}) stands in for the Mac's installed executorch")
    return et_dir, wheel_version(et_dir) or wheel.version, wheel_git_commit(et_dir)


def dry_run(plat: str, say: Callable[[str], None] = print) -> list[RunnerBuild]:
    """Print what building `plat`'s runner would run and register, running nothing and writing no
    catalog. macos-arm64 works on any host (see macos_stand_in); other platforms on their own host."""
    here = None
    try:
        here = host_platform()
    except BuildError:
        pass
    if plat == here:
        et_dir, et_version, et_commit = executorch_package()
    elif plat == "macos-arm64":
        et_dir, et_version, et_commit = macos_stand_in(say)
    else:
        raise BuildError(f"a {plat} runner is built on a {plat} host; off one, --dry-run shows macos-arm64 only "
                         "(arm64 Linux and Android: build-runner --platform linux-arm64 / android-arm64 cross-builds)")
    if plat == "macos-arm64":
        for fact in macos_wheel_facts(et_dir):
            say(f"# checked in the wheel: {fact}")
    plan = plan_host_build(plat, et_dir)
    say(f"# build {plat}: {'the system clang, ' if plat == 'macos-arm64' else ''}the pip cmake, no ExecuTorch checkout")
    for argv in plan.commands:
        say(shlex.join(argv))
    if plan.hide_library is not None:
        where = "its first LC_LOAD_DYLIB is @rpath/libsme2farm_hide.dylib" if plat == "macos-arm64" else \
            "libsme2farm_hide.so comes after every library but its own dependencies in DT_NEEDED"
        say(f"# then: {plan.binary} and {plan.hide_library.name} beside it; checked that {where}")
    builds = []
    for sme2, env in host_arms(plat, plan.xnnpack_library, host_sme2=plat == here and host_has_sme2()):
        b = RunnerBuild(id=f"local-{plat}-sme2{sme2}-timing-<sha256[:8]>", platform=plat, sme2=sme2, flavour="timing",
                        path=str(plan.binary), sha256="", executorch_version=et_version, executorch_commit=et_commit,
                        env=env, supports_outputs=True, supports_memory=True, supports_llm=True)
        how = " ".join(f"{k}={v}" for k, v in env.items()) or "as the hardware is"
        say(f"# would register: {b.id} ({plat}, SME2 {sme2}: {how})")
        builds.append(b)
    return builds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sme2farm.runners.build",
                                description="Build the local runner and register it in the catalog.")
    p.add_argument("--manifest", type=Path, help=f"catalog manifest (default {DEFAULT_MANIFEST})")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--platform", help="with --dry-run: the platform to plan for (macos-arm64 on any host)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and the builds it would register")
    a = p.parse_args(argv)
    try:
        if a.dry_run:
            dry_run(a.platform or host_platform())
            return 0
        builds = build_host(a.manifest, force=a.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for b in builds:
        print(json.dumps(asdict(b), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
