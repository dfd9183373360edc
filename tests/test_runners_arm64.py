"""Prebuilt arm64 runners from PyPI's aarch64 executorch wheel, for real: `sme2-farm build-runner
--platform linux-arm64 / android-arm64` cross-compiles runners/runner.cpp with Debian's aarch64
toolchain, `sme2-farm runners --json` lists both SME2 arms, and the binary runs a tiny model under
qemu-aarch64 (QEMU 7.2 here: SME yes, SME2 no), writing an ETDump the analysis reads.

Needs g++-aarch64-linux-gnu and qemu-user (.ci/apt-packages.txt) and PyPI (or a warm pip cache).
Everything here is named *arm64* so `pytest -k arm64` selects it; nothing skips.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sme2farm.agent.drivers.base import Job
from sme2farm.analysis import analyze
from sme2farm.runners.catalog import Catalog, RunnerBuild, sha256_file

QEMU = ["qemu-aarch64", "-cpu", "max"]
SYSROOT = "/usr/aarch64-linux-gnu"
GLIBC_SIDE = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "libstdc++.so.6", "libgcc_s.so.1",
              "ld-linux-aarch64.so.1"}


def farm_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def arm64_listing(tmp_path_factory) -> tuple[Path, dict[tuple[str, str], dict]]:
    """Both platforms built through the real CLI into a private manifest, then listed by it."""
    manifest = tmp_path_factory.mktemp("arm64") / "manifest.json"
    for platform in ("linux-arm64", "android-arm64"):
        r = farm_cli("build-runner", "--platform", platform, "--manifest", str(manifest))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "sme2on" in r.stdout and "sme2off" in r.stdout, r.stdout
    r = farm_cli("runners", "--json", "--manifest", str(manifest))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    return manifest, {(b["platform"], b["sme2"]): b for b in rows}


def readelf_dynamic(path: Path) -> tuple[list[str], str]:
    """(NEEDED names, RUNPATH) as binutils reads them: an independent check of the build's own parser."""
    out = subprocess.run(["aarch64-linux-gnu-readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    runpath = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", out)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out), runpath.group(1) if runpath else ""


def seen_hwcaps(log: str) -> tuple[int, int, int, int]:
    """(real SME, real SME2, SME as the libraries see it, SME2 as they see it) from the runner's line."""
    m = re.search(r"HWCAP2: SME (\d) SME2 (\d); as the libraries see it: SME (\d) SME2 (\d)", log)
    assert m, log[-2000:]
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def run_and_analyze(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[dict, str]:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", **env})
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    return analyze((cwd / "trace.etdump").read_bytes()).to_dict(), log


def test_arm64_build_runner_registers_both_arms(arm64_listing):
    manifest, builds = arm64_listing
    import executorch.version

    for platform in ("linux-arm64", "android-arm64-v9a"):
        on, off = builds[(platform, "on")], builds[(platform, "off")]
        # One binary, two arms: only the environment differs.
        assert on["sha256"] == off["sha256"] and on["path"] == off["path"]
        assert on["env"] == {} and off["env"] == {"SME2FARM_HIDE_SME2": "1"}
        assert on["id"] == f"wheel-{platform}-sme2on-timing-{on['sha256'][:8]}"
        for b in (on, off):
            assert b["origin"] == "wheel-cross" and b["flavour"] == "timing" and b["present"]
            assert b["executorch_version"] == executorch.version.__version__
            assert sha256_file(Path(b["path"])) == b["sha256"]
            prov = b["provenance"]
            assert "aarch64-linux-gnu-g++" in prov["toolchain"]
            wheel = Path(__file__).resolve().parents[1] / "runners" / "build" / "wheels" / prov["wheel"]
            assert prov["wheel"].endswith("manylinux_2_28_aarch64.whl") and sha256_file(wheel) == prov["wheel_sha256"]
    assert builds[("linux-arm64", "on")]["loader"] == ""
    assert builds[("android-arm64-v9a", "on")]["loader"] == "ld-linux-aarch64.so.1"
    # The manifest the agent loads holds the same builds, and old fields are all there.
    loaded = {(b.platform, b.sme2): b for b in Catalog.load(manifest).builds}
    assert isinstance(loaded[("linux-arm64", "off")], RunnerBuild)
    assert loaded[("linux-arm64", "off")].env == {"SME2FARM_HIDE_SME2": "1"}


def test_arm64_runners_table_lists_every_build(arm64_listing):
    manifest, builds = arm64_listing
    r = farm_cli("runners", "--manifest", str(manifest))
    assert r.returncode == 0, r.stderr
    for b in builds.values():
        line = next(line for line in r.stdout.splitlines() if line.startswith(b["id"] + " "))
        assert b["platform"] in line and "wheel-cross" in line and b["sha256"][:12] in line
    assert "4 build(s)" in r.stdout


def test_arm64_binary_is_aarch64_elf_with_its_libraries_beside_it(arm64_listing):
    _, builds = arm64_listing
    runner = Path(builds[("linux-arm64", "on")]["path"])
    header = runner.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and header[4] == 2 and header[5] == 1   # ELF64, little-endian
    assert struct.unpack_from("<H", header, 18)[0] == 183                    # e_machine EM_AARCH64
    needed, runpath = readelf_dynamic(runner)
    assert runpath == "$ORIGIN"      # no build-host path: the folder is what travels
    beside = {p.name for p in runner.parent.iterdir()}
    assert {n for n in needed if n.startswith("libexecutorch")} <= beside
    assert set(builds[("linux-arm64", "on")]["extra_files"]) == beside - {runner.name}
    assert not beside & GLIBC_SIDE   # the host's own glibc/libstdc++ serve a Linux arm64 host


def test_arm64_linux_runner_runs_a_model_under_qemu(arm64_listing, example_pte, tmp_path):
    _, builds = arm64_listing
    folder = Path(builds[("linux-arm64", "on")]["path"]).parent
    # Copied elsewhere: proves the folder is self-contained through RUNPATH $ORIGIN.
    shutil.copytree(folder, tmp_path / "runner")
    results = {}
    for arm in ("on", "off"):
        run = tmp_path / f"run-{arm}"
        run.mkdir()
        shutil.copy(example_pte("toy_cnn"), run / "model.pte")
        report, log = run_and_analyze(
            [*QEMU, "-L", SYSROOT, str(tmp_path / "runner" / "sme2farm_runner"), "--model_path=model.pte",
             "--num_executions=2", "--cpu_threads=1", "--etdump_path=trace.etdump"],
            run, builds[("linux-arm64", arm)]["env"])
        assert report["n_iterations"] == 2 and report["e2e_ms"]["mean"] > 0, report["warnings"]
        results[arm] = seen_hwcaps(log)
    # QEMU 7.2 emulates SME, never SME2; the off arm hides SME from the libraries too.
    assert results["on"] == (1, 0, 1, 0)
    assert results["off"] == (1, 0, 0, 0)


def test_arm64_android_bundle_holds_the_loader_and_needed_closure(arm64_listing):
    _, builds = arm64_listing
    b = builds[("android-arm64-v9a", "on")]
    runner = Path(b["path"])
    files = {runner.name, *b["extra_files"]}
    assert {p.name for p in runner.parent.iterdir()} == files
    assert "ld-linux-aarch64.so.1" in files and b["loader"] in files
    for name in sorted(files):
        if name == "ld-linux-aarch64.so.1":
            continue
        needed, _ = readelf_dynamic(runner.parent / name)
        missing = set(needed) - files
        assert not missing, f"{name} needs {missing}, not in the bundle"
    assert b["provenance"]["bundle_files"] == len(files)
    assert b["provenance"]["bundle_bytes"] == sum((runner.parent / n).stat().st_size for n in files)


def test_arm64_android_bundle_runs_through_its_loader_under_qemu(arm64_listing, example_pte, tmp_path):
    """Staged as the Android driver does (runner renamed `runner`, extra files by name beside it)
    and started with the driver's own argv (Job.runner_command): the loader runs the runner with
    the bundle's glibc, without QEMU's -L sysroot, so nothing of this host's aarch64 sysroot helps."""
    _, builds = arm64_listing
    b = builds[("android-arm64-v9a", "off")]
    src = Path(b["path"]).parent
    runner_dir, run_dir = tmp_path / "runners" / b["sha256"], tmp_path / "runs" / "1"
    runner_dir.mkdir(parents=True)
    run_dir.mkdir(parents=True)
    shutil.copy(src / "sme2farm_runner", runner_dir / "runner")
    for name in b["extra_files"]:
        shutil.copy(src / name, runner_dir / name)
    shutil.copy(example_pte("toy_cnn"), run_dir / "model.pte")
    build = RunnerBuild(**{k: v for k, v in b.items() if k != "present"})
    job = Job(run_id=1, model_path=run_dir / "model.pte", runner=build, threads=1, iterations=2, warmup=1,
              timeout_s=300, workdir=run_dir)
    argv = job.runner_command(str(runner_dir / "runner"))
    assert argv[:3] == [str(runner_dir / "ld-linux-aarch64.so.1"), "--library-path", str(runner_dir)]
    report, log = run_and_analyze([*QEMU, *argv], run_dir, build.env)
    assert report["n_iterations"] == 2 and report["e2e_ms"]["mean"] > 0, report["warnings"]
    assert seen_hwcaps(log) == (1, 0, 0, 0)   # the off arm's env reached the bundled runner
