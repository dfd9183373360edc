"""The runner commands: build-runner (the host's, or arm64 cross-compiled), runners (list every
registered build) and emulator (the SME2-capable qemu-aarch64 for emulated arm64 devices)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sme2farm.agent import emulator
from sme2farm.runners import emulator as installer
from sme2farm.farm.preflight import compiler
from sme2farm.runners.build import BuildError, build_host, dry_run, host_platform
from sme2farm.runners.catalog import Catalog
from sme2farm.runners.cross import build_platform
from sme2farm.runners.listing import render


def ensure_runner(manifest: Path | None) -> None:
    """Build the local runner (seconds; skipped when up to date) so the local agent has one. A build
    that fails raises RuntimeError with one line: a missing compiler named as such, else the log."""
    try:
        builds = build_host(manifest)
    except BuildError as e:
        if compiler() is None:
            raise RuntimeError("no C++ compiler found to build the local runner (looked for $CXX, c++, g++, "
                               "clang++): install one (e.g. the g++ package) and start again") from e
        first = str(e).splitlines()[0]
        raise RuntimeError(f"building the local runner failed: {first}") from e
    for build in builds:
        how = f": {' '.join(f'{k}={v}' for k, v in build.env.items())}" if build.env else ""
        print(f"runner: {build.id} ({build.platform}, SME2 {build.sme2}{how}, sha256 {build.sha256[:12]}…)", flush=True)


def _here() -> str:
    try:
        return host_platform()
    except BuildError:
        return "unsupported"


def cmd_build_runner(args) -> int:
    manifest = Path(args.manifest).resolve() if args.manifest else None
    if getattr(args, "dry_run", False):
        # The host's build (macos-arm64 from any host, against the real macOS wheel): commands and
        # the builds it would register, nothing run or written (runners/build.py, plan_host_build).
        if args.platform not in ("host", "macos-arm64"):
            print(f"error: --dry-run shows the host's build or macos-arm64's, not {args.platform}'s "
                  "(its cross build takes seconds: run it without --dry-run)", file=sys.stderr)
            return 1
        try:
            dry_run(_here() if args.platform == "host" else args.platform)
        except BuildError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if args.platform == "host" or args.platform == "macos-arm64" == _here():
        try:
            ensure_runner(manifest)
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if args.platform == "macos-arm64":
        print(f"error: a macos-arm64 runner is built on an Apple Silicon Mac, and this host is {_here()}; "
              "--dry-run shows the commands it would run", file=sys.stderr)
        return 1
    # arm64 runners cross-compiled from PyPI's aarch64 wheel (runners/cross.py), both SME2 arms.
    try:
        builds = build_platform(args.platform, manifest, force=args.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for b in builds:
        how = " ".join(f"{k}={v}" for k, v in b.env.items()) or "as the hardware is"
        print(f"runner: {b.id} ({b.platform}, SME2 {b.sme2}: {how}; sha256 {b.sha256[:12]}…, "
              f"{b.provenance.get('bundle_files')} files, {b.provenance.get('bundle_bytes', 0) / 1e6:.1f} MB)",
              flush=True)
    return 0


def cmd_runners(args) -> int:
    print(render(Catalog.load(Path(args.manifest).resolve() if args.manifest else None), args.json))
    return 0


def cmd_emulator(args) -> int:
    """`emulator install|status`: the SME2-capable qemu-aarch64 (runners/emulator.py) in the agent's
    emulator directory (agent/emulator.py cache_dir)."""
    if args.emulator_cmd == "install":
        try:
            manifest, new = installer.install(emulator.cache_dir(), say=lambda msg: print(msg, flush=True))
        except installer.EmulatorError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        where = emulator.cache_dir() / installer.BINARY
        print(f"{'installed' if new else 'already installed (sha256 matches its manifest): nothing to do'}: "
              f"{where} ({manifest['package']} {manifest['package_version']} from {manifest['suite']}, "
              f"HWCAP2 {manifest['hwcap2']}, SME2 {'yes' if manifest['sme2'] else 'no'})")
        return 0
    st = installer.status(emulator.cache_dir())
    print(json.dumps(st, indent=2) if args.json else installer.render_status(st))
    return 0 if st["sme2"] else 1
