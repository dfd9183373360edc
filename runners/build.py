"""Build the local runner (runners/runner.cpp) against the installed executorch wheel and
register it in the runner catalog.

The build goes to runners/build/<platform>/ with the pip `cmake` (the wheel's imported targets
need CMake >= 3.28) and is skipped when runner source, CMakeLists and the executorch version are
unchanged.

SME2 honesty: the wheel's XNNPACK is ONE build, so this produces one binary, never a pair.
 * Host without SME2 (every x86 host): registered as sme2 "off"; it cannot run SME2 code here.
 * Host with SME2: XNNPACK picks kernels from cpuinfo at init, so if the wheel's XNNPACK carries
   SME2 microkernels (their `__neonsme2` names are in the library) the binary behaves like the
   recipe's SME2-on build and is registered "on"; it can never be an honest "off" there. If the
   library carries none, it cannot use SME2 and is registered "off".
A real on/off pair (and the xnnlog flavour that proves which kernels ran) comes from
sme2farm.runners.recipe.

CLI: python -m sme2farm.runners.build [--manifest PATH] [--force]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sme2farm.runners.catalog import DEFAULT_MANIFEST, RUNNERS_DIR, Catalog, RunnerBuild, sha256_file
from sme2farm.runners.cpuinfo import host_hwcap2_sme2
from sme2farm.runners.tools import BINARY_NAME, SOURCES, BuildError, cmake_binary, executorch_package, run_logged

SME2_KERNEL_MARKER = b"__neonsme2"  # suffix of XNNPACK's SME2 microkernel names


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
    """'on' or 'off' for the wheel's single build on this host (see the module docstring)."""
    if not host_sme2:
        return "off"
    return "on" if SME2_KERNEL_MARKER in xnnpack_lib.read_bytes() else "off"


def _stamp(et_dir: Path, et_version: str, et_commit: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((RUNNERS_DIR / name).read_bytes())
    h.update(f"{et_dir}\0{et_version}\0{et_commit}".encode())
    return h.hexdigest()


def build_local(manifest: Path | None = None, force: bool = False) -> RunnerBuild:
    """Build (unless up to date) and register the local runner; returns the registered build."""
    plat = host_platform()
    et_dir, et_version, et_commit = executorch_package()
    build_dir = RUNNERS_DIR / "build" / plat
    build_dir.mkdir(parents=True, exist_ok=True)
    binary = build_dir / BINARY_NAME
    stamp_file = build_dir / "stamp.json"
    stamp = _stamp(et_dir, et_version, et_commit)

    # Concurrent test sessions share runners/build: one cmake at a time per build dir.
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
        if force or current.get("stamp") != stamp or not binary.exists():
            log = build_dir / "build.log"
            log.write_text("")
            t0 = time.monotonic()
            run_logged([cmake_binary(), "-S", str(RUNNERS_DIR), "-B", str(build_dir),
                  f"-DCMAKE_PREFIX_PATH={et_dir}", "-DCMAKE_BUILD_TYPE=Release"], log)
            run_logged([cmake_binary(), "--build", str(build_dir), "--target", BINARY_NAME, "-j", str(os.cpu_count() or 1)]
                 + (["--clean-first"] if force else []), log)
            if not binary.exists():
                raise BuildError(f"the build finished but {binary} is missing; log {log}")
            stamp_file.write_text(json.dumps({"stamp": stamp, "build_s": round(time.monotonic() - t0, 2)}) + "\n")

        catalog = Catalog.load(manifest)
        sha = sha256_file(binary)
        sme2 = sme2_mode(host_has_sme2(), et_dir / "lib" / "libexecutorch_backend_xnnpack.so")
        try:
            path = str(binary.relative_to(catalog.manifest.parent.resolve()))
        except ValueError:
            path = str(binary)
        build = RunnerBuild(id=f"local-{plat}-sme2{sme2}-timing-{sha[:8]}", platform=plat, sme2=sme2,
                            flavour="timing", path=path, sha256=sha, executorch_version=et_version,
                            executorch_commit=et_commit, supports_outputs=True,
                            supports_memory=True, supports_llm=True)
        catalog.register(build)
        catalog.save()
    return build


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sme2farm.runners.build",
                                description="Build the local runner and register it in the catalog.")
    p.add_argument("--manifest", type=Path, help=f"catalog manifest (default {DEFAULT_MANIFEST})")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    a = p.parse_args(argv)
    try:
        build = build_local(a.manifest, force=a.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(build), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
