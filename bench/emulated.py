"""The emulated SME2 device: wall time of `--sme2 both` and the size of trace mode's translation log.

For each bundled example, through the qemu-arm64 driver (the same path a farm's agent takes) with
the installed SME2 emulator (`sme2-farm emulator install`) and the cross-built linux-arm64 runner:

  both arms     SME2 off then on in timing mode: the seconds each driver.execute took (stage,
                runner under qemu, collect, cleanup). Emulated: these are QEMU's translator's
                seconds, not a speed figure for any CPU, and never compared.
  trace         each arm in trace mode: the raw `-d in_asm` log's size (what the bound,
                SME2_TRANSLATION_LOG_MAX_MB, is measured against), the kernels.log that replaces
                it, and the microkernels it names by ISA.

    .venv/bin/python bench/emulated.py [--examples toy_cnn,mlp,portable_mix] [--iterations 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
import time
from pathlib import Path

NOT_SPEED = "emulated: not a speed figure"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", default="toy_cnn,mlp,portable_mix")
    p.add_argument("--iterations", type=int, default=5)
    a = p.parse_args(argv)

    from sme2farm.agent import emulator
    from sme2farm.runners.emulator import manual_steps
    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver
    from sme2farm.analysis import parse_kernel_log
    from sme2farm.runners.catalog import Catalog
    from sme2farm.runners.cross import build_platform
    from sme2farm.runners.examples import export_example

    qemu = emulator.installed()
    if qemu is None:
        print(f"no SME2 emulator installed: run `sme2-farm emulator install` first\n{manual_steps(emulator.cache_dir())}",
              file=sys.stderr)
        return 1
    driver = QemuArm64Driver(str(qemu))
    devices = driver.discover()
    if not devices or not devices[0].sme2:
        print(f"{qemu} does not emulate SME2 here ({driver.sme2()[1]})", file=sys.stderr)
        return 1
    dev = devices[0]
    print(f"device: {dev.model}; {dev.emulator}")

    with tempfile.TemporaryDirectory(prefix="bench-emulated-") as tmp:
        work = Path(tmp)
        manifest = work / "manifest.json"
        build_platform("linux-arm64", manifest)   # up to date in runners/build: registration only
        catalog = Catalog.load(manifest)

        def job(name: str, model: Path, sme2: str, mode: str) -> Job:
            build = catalog.find("linux-arm64", sme2, driver.runner_flavour(mode))
            wd = work / f"{name}-{sme2}-{mode}"
            wd.mkdir()
            return Job(run_id=1, model_path=model, runner=dataclasses.replace(build, path=str(catalog.resolve(build))),
                       threads=1, iterations=a.iterations, warmup=1, timeout_s=600, workdir=wd, mode=mode)

        print(f"\n{'example':<14} {'--sme2 both wall s (' + NOT_SPEED + ')':<52} "
              f"{'trace: raw in_asm log MiB (off / on)':<38} {'kernels.log bytes':<18} named kernels on | off")
        for name in a.examples.split(","):
            model = export_example(name, work / f"{name}.pte")
            walls = {}
            for sme2 in ("off", "on"):
                t0 = time.monotonic()
                r = driver.execute(dev.serial, job(name, model, sme2, "timing"))
                walls[sme2] = time.monotonic() - t0
                if not r.ok:
                    print(f"{name}: SME2 {sme2} timing run failed: {r.reason}", file=sys.stderr)
                    return 1
            raw, compact, named = {}, {}, {}
            for sme2 in ("off", "on"):
                r = driver.execute(dev.serial, job(name, model, sme2, "trace"))
                if not r.ok:
                    print(f"{name}: SME2 {sme2} trace run failed: {r.reason}", file=sys.stderr)
                    return 1
                text = r.kernel_log_path.read_text()
                raw[sme2] = int(re.search(r"^# Raw log (\d+) bytes", text, re.M).group(1)) / (1 << 20)
                compact[sme2] = len(text.encode())
                k = parse_kernel_log(text)
                named[sme2] = ", ".join(f"{isa} {n}" for isa, n in k.get("isa_counts", {}).items() if n) or "none"
            both = f"{walls['off'] + walls['on']:.2f} (off {walls['off']:.2f}, on {walls['on']:.2f}) [{NOT_SPEED}]"
            print(f"{name:<14} {both:<52} {raw['off']:>6.2f} / {raw['on']:<6.2f}{'':<23} "
                  f"{compact['off']:>6} / {compact['on']:<8} {named['on']} | {named['off']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
