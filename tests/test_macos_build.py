"""The Apple Silicon Mac's runner build, tested without a Mac: the command lines and CMake arguments
`sme2-farm build-runner --platform macos-arm64 --dry-run` prints (the same plan_host_build a real
Mac runs), both SME2 arms it registers from the one binary, and the Mach-O facts the build and the
off arm rest on, read from the REAL macOS arm64 executorch wheel (pip download, cached in
runners/build/wheels like the aarch64 one) by runners/macho.py and, independently, by llvm-nm /
llvm-objdump where installed. runners/sme2_hide.c is compiled for arm64-apple-macos14 by clang
where installed; its object's symbols are checked. Nothing here links or runs on macOS: no Mac
exists here (docs/devices-and-runners.md says what has not run on one).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sme2farm.runners.build import (HIDE_ENV, MAC_CLANG, BuildError, check_hide_first, host_arms, macos_stand_in,
                                    macos_wheel_facts, plan_host_build)
from sme2farm.runners.catalog import RUNNERS_DIR
from sme2farm.runners.macho import CPU_TYPE_ARM64, MH_DYLIB, MH_OBJECT, PLATFORM_MACOS, MachOError, read_macho

RUNTIME_DYLIBS = ("libexecutorch", "libexecutorch_threadpool", "libexecutorch_backend_xnnpack",
                  "libexecutorch_kernels_optimized", "libexecutorch_kernels_quantized", "libexecutorch_etdump")


@pytest.fixture(scope="module")
def macos_wheel() -> Path:
    """The real macOS arm64 wheel's executorch/ folder (pip download once, then the cache)."""
    said: list[str] = []
    et_dir, version, _ = macos_stand_in(said.append)
    assert "-macosx_14_0_arm64.whl" in said[0] and version.startswith("1.5.1")
    return et_dir


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", *args], capture_output=True, text=True,
                          timeout=600)


def test_macos_dry_run_prints_the_mac_build_and_registers_both_arms(macos_wheel, tmp_path):
    manifest = tmp_path / "manifest.json"
    r = _cli("build-runner", "--platform", "macos-arm64", "--dry-run", "--manifest", str(manifest))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert len(commands) == 2
    configure, build = commands
    build_dir = RUNNERS_DIR / "build" / "macos-arm64"
    assert configure[0].endswith("cmake") and configure[1:5] == ["-S", str(RUNNERS_DIR), "-B", str(build_dir)]
    assert configure[5:] == [f"-DCMAKE_PREFIX_PATH={macos_wheel}", "-DCMAKE_BUILD_TYPE=Release",
                             "-DCMAKE_C_COMPILER=/usr/bin/clang", "-DCMAKE_CXX_COMPILER=/usr/bin/clang++",
                             "-DCMAKE_OSX_ARCHITECTURES=arm64", "-DCMAKE_OSX_DEPLOYMENT_TARGET=14.0"]
    assert build[1:5] == ["--build", str(build_dir), "--target", "sme2farm_runner"]
    # Against the wheel alone: nothing names an ExecuTorch source tree.
    assert not any("executorch-src" in a or "recipe" in a for a in configure + build)
    assert "no ExecuTorch checkout" in r.stdout
    assert "executorch-1.5.1-cp311-cp311-macosx_14_0_arm64.whl" in lines[0] and "stands in" in lines[0]
    # Both arms from the one binary, the off arm switched by the environment.
    registered = [line for line in lines if line.startswith("# would register: ")]
    assert registered == [
        "# would register: local-macos-arm64-sme2on-timing-<sha256[:8]> (macos-arm64, SME2 on: as the hardware is)",
        "# would register: local-macos-arm64-sme2off-timing-<sha256[:8]> (macos-arm64, SME2 off: "
        "SME2FARM_HIDE_SME2=1)"]
    assert "first LC_LOAD_DYLIB is @rpath/libsme2farm_hide.dylib" in r.stdout
    assert not manifest.exists() and not (build_dir / "CMakeCache.txt").exists()   # nothing run or written


@pytest.mark.skipif(sys.platform == "darwin", reason="on a Mac this builds for real")
def test_macos_build_without_dry_run_off_a_mac_is_refused_in_one_line(tmp_path):
    from sme2farm.runners.build import host_platform

    r = _cli("build-runner", "--platform", "macos-arm64", "--manifest", str(tmp_path / "m.json"))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"error: a macos-arm64 runner is built on an Apple Silicon Mac, and this host is {host_platform()}; "
        "--dry-run shows the commands it would run"]


def test_macos_plan_is_the_one_a_mac_build_runs(macos_wheel, tmp_path):
    plan = plan_host_build("macos-arm64", macos_wheel, force=True, cmake="cmake", build_root=tmp_path)
    assert plan.binary == tmp_path / "macos-arm64" / "sme2farm_runner"
    assert plan.hide_library == tmp_path / "macos-arm64" / "libsme2farm_hide.dylib"
    assert plan.xnnpack_library == macos_wheel / "lib" / "libexecutorch_backend_xnnpack.dylib"
    assert plan.commands[1][-1] == "--clean-first"
    assert f"-DCMAKE_CXX_COMPILER={MAC_CLANG}++" in plan.commands[0]
    # The wheel's XNNPACK carries SME2 kernels, so an M4 registers both arms; on x86 one.
    assert host_arms("macos-arm64", plan.xnnpack_library, host_sme2=False) == [("on", {}), ("off", HIDE_ENV)]
    linux = plan_host_build("linux-x86_64", macos_wheel, cmake="cmake", build_root=tmp_path)
    assert linux.hide_library is None and not any("CMAKE_OSX" in a for a in linux.commands[0])


def test_macos_wheel_mach_o_facts_the_build_depends_on(macos_wheel):
    lib = macos_wheel / "lib"
    for name in RUNTIME_DYLIBS:
        m = read_macho(lib / f"{name}.dylib")
        assert (m.cputype, m.filetype, m.platform) == (CPU_TYPE_ARM64, MH_DYLIB, PLATFORM_MACOS)
        assert m.install_name == f"@rpath/{name}.dylib"
        # Each finds its siblings beside itself: a runner that adds the wheel's lib folder as an
        # LC_RPATH (the wheel's CMake package does) loads them in place.
        assert m.rpaths[0] == "@loader_path"
        assert m.minos == "14.0"
    tp = read_macho(lib / "libexecutorch_threadpool.dylib")
    assert {"_cpuinfo_isa", "_cpuinfo_initialize"} <= tp.exported
    xnn = read_macho(lib / "libexecutorch_backend_xnnpack.dylib")
    assert xnn.imports["_cpuinfo_isa"] == xnn.imports["_cpuinfo_initialize"] == "@rpath/libexecutorch_threadpool.dylib"
    assert "@rpath/libexecutorch_threadpool.dylib" in xnn.dylibs
    assert b"__neonsme2" in (lib / "libexecutorch_backend_xnnpack.dylib").read_bytes()
    assert len(macos_wheel_facts(macos_wheel)) == 4


@pytest.mark.skipif(not shutil.which("llvm-nm") or not shutil.which("llvm-objdump"), reason="no llvm tools")
def test_macos_mach_o_reader_agrees_with_llvm(macos_wheel):
    lib = macos_wheel / "lib"
    for name in ("libexecutorch_threadpool", "libexecutorch_backend_xnnpack"):
        path = lib / f"{name}.dylib"
        m = read_macho(path)
        nm = subprocess.run(["llvm-nm", "-g", "--defined-only", str(path)], capture_output=True, text=True,
                            check=True).stdout
        assert {line.split()[-1] for line in nm.splitlines() if line.strip()} == m.defined
        used = subprocess.run(["llvm-objdump", "--macho", "--dylibs-used", str(path)], capture_output=True,
                              text=True, check=True).stdout.splitlines()[1:]
        # --dylibs-used lists the install name first, then every dylib load command in order.
        assert [u.strip().split(" (compatibility")[0] for u in used] == [m.install_name, *m.dylibs]


def test_macos_checks_refuse_what_would_break_the_off_arm(macos_wheel, tmp_path):
    # A threadpool that exports no cpuinfo state (here: the xnnpack dylib in its place).
    fake = tmp_path / "executorch"
    shutil.copytree(macos_wheel / "lib", fake / "lib")
    shutil.copy(fake / "lib" / "libexecutorch_etdump.dylib", fake / "lib" / "libexecutorch_threadpool.dylib")
    with pytest.raises(BuildError, match="install name"):
        macos_wheel_facts(fake)
    # A runner whose first dylib is not the hiding library (any wheel dylib stands in for one).
    with pytest.raises(BuildError, match=r"first dylib it loads is '@rpath/libexecutorch.dylib', not "
                                         r"@rpath/libsme2farm_hide.dylib"):
        check_hide_first(macos_wheel / "lib" / "libexecutorch_threadpool.dylib")
    with pytest.raises(MachOError, match="not a 64-bit little-endian Mach-O"):
        read_macho(RUNNERS_DIR / "runner.cpp")


CLANG = shutil.which("clang") or shutil.which("clang-14")


@pytest.mark.skipif(CLANG is None, reason="no clang (apt-get install clang) to compile for arm64-apple-macos14")
def test_macos_hide_library_source_compiles_for_macos(tmp_path):
    """Compiled only: no macOS SDK or linker here, so nothing is linked or run."""
    obj = tmp_path / "sme2_hide.o"
    subprocess.run([CLANG, "-target", "arm64-apple-macos14", "-ffreestanding", "-O2", "-std=c11",
                    "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-c", str(RUNNERS_DIR / "sme2_hide.c"),
                    "-o", str(obj)], check=True)
    m = read_macho(obj)
    assert (m.cputype, m.filetype, m.platform, m.minos) == (CPU_TYPE_ARM64, MH_OBJECT, PLATFORM_MACOS, "14.0")
    assert m.exported == {"_sme2farm_hide_report", "_sme2farm_hide_checking"}
    # It asks the OS through sysctlbyname and reaches cpuinfo's state by name; no getauxval on macOS.
    assert {"_cpuinfo_isa", "_cpuinfo_initialize", "_sysctlbyname", "_getenv"} <= set(m.imports)
    assert not {"_getauxval", "___getauxval"} & set(m.imports)
    # A constructor: dyld runs it when the image initialises.
    assert "__DATA,__mod_init_func" in m.sections
    assert b"hw.optional.arm.FEAT_SME2" in obj.read_bytes()
