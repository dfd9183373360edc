"""Prebuilt arm64 runners benchmark: how long producing both SME2 arms for linux-arm64 and
android-arm64 takes from a warm pip cache, first build and up to date, and the Android bundle's size.

Builds into a fresh temporary build root (never the repo's runners/build) with a private
manifest, so it measures a first build honestly and disturbs nobody:

  first build   pip download (served from pip's cache) + unzip + cmake configure/compile with
                the aarch64 cross toolchain + staging both folders + registering 4 builds
  up to date    the same two commands again: stamp checks, sha256 checks, registration

    .venv/bin/python bench/runners.py [--repeat 1]

  staging       the Android driver pushing the bundle + a model to the loopback phone (real adb
                server, adb wire protocol, sha256 checks on the device) the first time, then with
                the bundle cached on the phone by sha256
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # the loopback phone


def staging(manifest: Path, work: Path) -> tuple[float, float, dict]:
    """(first, cached) seconds for AndroidDriver.prepare of the android-arm64 bundle + a model."""
    import adbutils
    from adb_loopback import LoopbackDevice, emulated_arm64_phone

    from sme2farm.agent.drivers.android import AndroidDriver
    from sme2farm.agent.drivers.base import Job
    from sme2farm.runners.catalog import Catalog

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adb = adbutils.adb_path()
    subprocess.run([adb, "-P", str(port), "start-server"], check=True, capture_output=True, timeout=30)
    phone = LoopbackDevice(work / "phone", emulated_arm64_phone())
    try:
        client = adbutils.AdbClient(port=port)
        client.connect(phone.serial, timeout=10)
        catalog = Catalog.load(manifest)
        build = catalog.find("android-arm64-v9a", "off")
        build = dataclasses.replace(build, path=str(catalog.resolve(build)))
        driver = AndroidDriver(port)
        model = work / "model.pte"
        model.write_bytes(b"\0" * 1_000_000)   # staging never reads the model: size is what counts
        times, pushed = [], {}
        for run_id in (1, 2):
            wd = work / f"run{run_id}"
            wd.mkdir()
            job = Job(run_id=run_id, model_path=model, runner=build, threads=1, iterations=1, warmup=0,
                      timeout_s=60, workdir=wd)   # the loopback phone is cool: gates pass at once
            t0 = time.perf_counter()
            before = driver.prepare(phone.serial, job)
            times.append(time.perf_counter() - t0)
            pushed[run_id] = len(before["staging"]["pushed"])
            driver.cleanup(phone.serial, job)
        return times[0], times[1], pushed
    finally:
        phone.stop()
        subprocess.run([adb, "-P", str(port), "kill-server"], capture_output=True, timeout=30)


def once(root: Path) -> dict:
    from sme2farm.runners.cross import build_platform
    from sme2farm.runners.wheel import fetch_wheel, pinned_version, unpack_wheel

    manifest = root / "manifest.json"
    t0 = time.perf_counter()
    wheel = fetch_wheel(pinned_version(), root / "wheels")
    t_fetch = time.perf_counter() - t0
    unpack_wheel(wheel, root / "wheels")
    t_unpack = time.perf_counter() - t0 - t_fetch
    linux = build_platform("linux-arm64", manifest, build_root=root)
    t_linux = time.perf_counter() - t0
    android = build_platform("android-arm64", manifest, build_root=root)
    first = time.perf_counter() - t0

    t1 = time.perf_counter()
    build_platform("linux-arm64", manifest, build_root=root)
    build_platform("android-arm64", manifest, build_root=root)
    again = time.perf_counter() - t1
    stage_first, stage_cached, pushed = staging(manifest, root)
    return {"stage_first": stage_first, "stage_cached": stage_cached, "pushed": pushed,
            "first": first, "fetch": t_fetch, "unpack": t_unpack, "compile": linux[0].provenance["build_s"],
            "linux_total": t_linux, "android_stage": first - t_linux, "again": again,
            "android": android[0].provenance, "linux": linux[0].provenance}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="independent first builds (each in a fresh root)")
    a = p.parse_args()
    from sme2farm.runners.wheel import fetch_wheel, pinned_version

    with tempfile.TemporaryDirectory(prefix="sme2farm-bench-warm-") as warm:
        fetch_wheel(pinned_version(), Path(warm))   # makes sure pip's own cache holds the wheel
    results = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory(prefix="sme2farm-bench-runners-") as d:
            results.append(once(Path(d)))
    for i, r in enumerate(results, 1):
        print(f"run {i}: both arm64 platforms x both SME2 arms (4 builds, 1 binary)")
        print(f"  first build       {r['first']:6.2f} s  (pip download {r['fetch']:.2f} s, unzip {r['unpack']:.2f} s, "
              f"cmake+compile {r['compile']:.2f} s, linux-arm64 total {r['linux_total']:.2f} s, "
              f"android bundle staging {r['android_stage']:.2f} s)")
        print(f"  up to date        {r['again']:6.2f} s")
        print(f"  staging to the loopback phone: first {r['stage_first']:.2f} s ({r['pushed'][1]} files pushed), "
              f"cached {r['stage_cached']:.2f} s ({r['pushed'][2]} files pushed; the 1 MB model each time)")
    pa, pl = results[-1]["android"], results[-1]["linux"]
    print(f"android-arm64 bundle: {pa['bundle_bytes'] / 1e6:.1f} MB in {pa['bundle_files']} files "
          f"(linux-arm64 folder: {pl['bundle_bytes'] / 1e6:.1f} MB in {pl['bundle_files']} files; "
          f"needs glibc {pl['requires'].get('GLIBC')}, GLIBCXX {pl['requires'].get('GLIBCXX')})")
    print(f"wheel: {pa['wheel']} sha256 {pa['wheel_sha256'][:16]}…; toolchain: {pa['toolchain']}")


if __name__ == "__main__":
    main()
