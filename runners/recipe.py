"""Device build recipe: the SME2-on/off x timing/xnnlog runner builds from an ExecuTorch checkout.

Users run it on their own machine (an ExecuTorch source tree, plus the Android NDK for phones).
For each variant it configures and builds upstream's `executor_runner` target with the event
tracer, devtools and XNNPACK enabled, then copies the binary (and, on Android, libc++_shared.so)
beside the manifest and registers it with its sha256 and the checkout's commit.

Every variant builds ExecuTorch's LLM custom ops in (EXECUTORCH_BUILD_KERNELS_LLM: the
extension/llm/custom_ops library, linked into executor_runner by ExecuTorch's own CMakeLists), so a
program exported with them (llama::custom_sdpa.out, llama::update_cache.out) runs on these builds;
the farm's wheel runners do not carry them (the wheel ships them only in custom_ops_aot_lib, which
needs libtorch). Checked against ExecuTorch's CMakeLists.txt (release/1.3 and main: the option adds
extension/llm/custom_ops and appends $<LINK_LIBRARY:WHOLE_ARCHIVE,custom_ops> to executor_runner's
libraries).

The pair differs ONLY in XNNPACK_ENABLE_ARM_SME2/XNNPACK_ENABLE_ARM_SME; xnnlog adds XNNPACK
logging (`-UXNN_NO_LOGGING -DXNN_LOG_LEVEL=5`) so the log names the microkernels that ran, the
only proof that SME2 was used (the ETDump event names are the same either way).

Option names were checked against the Arm kit's CMake presets (ArmDeveloperEcosystem/
sme-executorch-profiling: EXECUTORCH_BUILD_EXECUTOR_RUNNER, EXECUTORCH_BUILD_DEVTOOLS,
EXECUTORCH_ENABLE_EVENT_TRACER, EXECUTORCH_BUILD_XNNPACK, EXECUTORCH_ENABLE_LOGGING,
EXECUTORCH_BUILD_EXTENSION_EVALUE_UTIL, EXECUTORCH_BUILD_KERNELS_OPTIMIZED,
EXECUTORCH_XNNPACK_ENABLE_KLEIDI, XNNPACK_ENABLE_ARM_SME2, XNNPACK_ENABLE_ARM_SME, ANDROID_STL)
and ExecuTorch's tools/cmake/preset files (EXECUTORCH_BUILD_EXTENSION_RUNNER_UTIL).

Upstream executor_runner parses flags with gflags and has no --warmup, so its builds are
registered with supports_warmup=False (see RunnerBuild).

CLI:
  python -m sme2farm.runners.recipe --executorch-src DIR [--ndk DIR] --platform P [--dry-run]
  python -m sme2farm.runners.recipe register --binary FILE --platform P --sme2 on|off
      [--flavour timing|xnnlog] [--executorch-src DIR | --executorch-commit SHA] [--extra-file F]...
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sme2farm.runners.catalog import Catalog, RunnerBuild, sha256_file

PLATFORMS = ("android-arm64-v9a", "macos-arm64", "linux-arm64")
VARIANTS = tuple((sme2, flavour) for sme2 in ("on", "off") for flavour in ("timing", "xnnlog"))
TARGET = "executor_runner"
ANDROID_PLATFORM = "android-26"  # API level of upstream's Android build scripts
XNN_FLAGS = {"timing": "-DXNN_LOG_LEVEL=0", "xnnlog": "-UXNN_NO_LOGGING -DXNN_LOG_LEVEL=5"}
LLM_CUSTOM_OPS_OPTION = "-DEXECUTORCH_BUILD_KERNELS_LLM=ON"
LLM_CUSTOM_OPS = ("llama::custom_sdpa.out", "llama::update_cache.out")
COMMON_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DEXECUTORCH_BUILD_EXECUTOR_RUNNER=ON",
    "-DEXECUTORCH_BUILD_DEVTOOLS=ON",
    "-DEXECUTORCH_ENABLE_EVENT_TRACER=ON",
    "-DEXECUTORCH_ENABLE_LOGGING=ON",  # the "Iteration i of N" lines are ET_LOG(Info)
    "-DEXECUTORCH_BUILD_XNNPACK=ON",
    "-DEXECUTORCH_XNNPACK_ENABLE_KLEIDI=ON",  # KleidiAI carries the SME2 packed GEMMs; same in both
    "-DEXECUTORCH_BUILD_KERNELS_OPTIMIZED=ON",  # portable ops run the kernels the wheel runner uses
    "-DEXECUTORCH_BUILD_EXTENSION_EVALUE_UTIL=ON",
    "-DEXECUTORCH_BUILD_EXTENSION_RUNNER_UTIL=ON",
    # ExecuTorch's LLM custom ops (extension/llm/custom_ops: llama::custom_sdpa.out,
    # llama::update_cache.out, on cpublas and the threadpool), which the exports ExecuTorch recommends
    # for phones call (export_llama --use_sdpa_with_kv_cache; optimum-executorch --use_custom_sdpa
    # --use_custom_kv_cache). With it ON, ExecuTorch's CMakeLists adds the custom_ops library and links
    # it into executor_runner whole-archive, so its static registrations run: the runner has the ops.
    # It needs EXECUTORCH_BUILD_KERNELS_OPTIMIZED (tools/cmake/preset/default.cmake), ON above.
    LLM_CUSTOM_OPS_OPTION,
)


class RecipeError(Exception):
    pass


@dataclass
class VariantPlan:
    platform: str
    sme2: str
    flavour: str
    build_dir: Path
    configure: list[str]
    build: list[str]
    binary: Path
    extra_files: list[Path] = field(default_factory=list)

    def as_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else [str(x) for x in v] if k == "extra_files" else v)
                for k, v in asdict(self).items()}


def check_checkout(src: Path) -> Path:
    src = Path(src).expanduser().resolve()
    if not (src / "CMakeLists.txt").is_file() or not (src / "examples/portable/executor_runner").is_dir():
        raise RecipeError(f"{src} is not an ExecuTorch checkout (no CMakeLists.txt or "
                          "examples/portable/executor_runner); pass --executorch-src")
    return src


def find_ndk(ndk: Path | None) -> tuple[Path, Path, Path]:
    """(ndk, toolchain file, libc++_shared.so for arm64) or RecipeError naming what is missing."""
    raw = ndk or os.environ.get("ANDROID_NDK") or os.environ.get("ANDROID_NDK_HOME")
    if not raw:
        raise RecipeError("android-arm64-v9a needs the Android NDK: pass --ndk or set ANDROID_NDK")
    ndk = Path(raw).expanduser().resolve()
    toolchain = ndk / "build/cmake/android.toolchain.cmake"
    if not toolchain.is_file():
        raise RecipeError(f"{ndk} is not an Android NDK: {toolchain} is missing")
    libcxx = sorted(glob.glob(str(ndk / "toolchains/llvm/prebuilt/*/sysroot/usr/lib/aarch64-linux-android/libc++_shared.so")))
    if not libcxx:
        raise RecipeError(f"no arm64 libc++_shared.so under {ndk}/toolchains/llvm/prebuilt")
    return ndk, toolchain, Path(libcxx[0])


def plan(executorch_src: Path, platform: str, ndk: Path | None = None, cmake: str = "cmake",
         jobs: int | None = None) -> list[VariantPlan]:
    """The configure/build argv lists of every (sme2, flavour) variant for `platform`."""
    if platform not in PLATFORMS:
        raise RecipeError(f"unknown platform {platform!r}; choose from {', '.join(PLATFORMS)}")
    src = check_checkout(executorch_src)
    platform_options: list[str] = []
    extra: list[Path] = []
    if platform == "android-arm64-v9a":
        _, toolchain, libcxx = find_ndk(ndk)
        platform_options = [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", "-DANDROID_ABI=arm64-v8a",
                            f"-DANDROID_PLATFORM={ANDROID_PLATFORM}", "-DANDROID_STL=c++_shared"]
        extra = [libcxx]  # the runner links c++_shared; it must be pushed beside it
    elif platform == "macos-arm64":
        platform_options = ["-DCMAKE_OSX_ARCHITECTURES=arm64"]

    plans = []
    for sme2, flavour in VARIANTS:
        name = f"{platform}-sme2-{sme2}" + ("-xnnlog" if flavour == "xnnlog" else "")
        build_dir = src / "cmake-out" / "sme2farm" / name
        switch = "ON" if sme2 == "on" else "OFF"
        configure = [cmake, "-S", str(src), "-B", str(build_dir), *COMMON_OPTIONS, *platform_options,
                     f"-DXNNPACK_ENABLE_ARM_SME2={switch}", f"-DXNNPACK_ENABLE_ARM_SME={switch}",
                     f"-DCMAKE_C_FLAGS={XNN_FLAGS[flavour]}", f"-DCMAKE_CXX_FLAGS={XNN_FLAGS[flavour]}"]
        build = [cmake, "--build", str(build_dir), "--target", TARGET, "-j", str(jobs or os.cpu_count() or 1)]
        plans.append(VariantPlan(platform, sme2, flavour, build_dir, configure, build, build_dir / TARGET, list(extra)))
    return plans


def checkout_commit(src: Path) -> str:
    r = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RecipeError(f"cannot read the commit of {src}: {r.stderr.strip() or 'git failed'}")
    return r.stdout.strip()


def checkout_version(src: Path) -> str:
    version = Path(src) / "version.txt"  # ExecuTorch keeps its version here
    return version.read_text().strip() if version.is_file() else ""


def register_binary(binary: Path, platform: str, sme2: str, flavour: str = "timing", *,
                    manifest: Path | None = None, executorch_commit: str = "", executorch_version: str = "",
                    extra_files: list[Path] = (), supports_warmup: bool = False) -> RunnerBuild:
    """Copy `binary` (and extra files) beside the manifest and register it, replacing the build of
    the same (platform, sme2, flavour). A copy, so rebuilding the checkout cannot change a
    registered binary behind its recorded sha256."""
    binary = Path(binary)
    if sme2 not in ("on", "off") or flavour not in ("timing", "xnnlog"):
        raise RecipeError(f"sme2 must be on|off and flavour timing|xnnlog, got {sme2!r}, {flavour!r}")
    for f in (binary, *extra_files):
        if not Path(f).is_file():
            raise RecipeError(f"{f} does not exist")
    catalog = Catalog.load(manifest)
    dest = catalog.manifest.parent / f"{platform}-sme2{sme2}-{flavour}"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, dest / binary.name)
    for f in extra_files:
        shutil.copy2(f, dest / Path(f).name)
    sha = sha256_file(dest / binary.name)
    rel = dest.relative_to(catalog.manifest.parent)
    build = RunnerBuild(id=f"{platform}-sme2{sme2}-{flavour}-{sha[:8]}", platform=platform, sme2=sme2,
                        flavour=flavour, path=str(rel / binary.name), sha256=sha,
                        executorch_version=executorch_version, executorch_commit=executorch_commit,
                        extra_files=[str(rel / Path(f).name) for f in extra_files],
                        supports_warmup=supports_warmup)
    catalog.register(build)
    catalog.save()
    return build


def run_recipe(executorch_src: Path, platform: str, ndk: Path | None = None, manifest: Path | None = None,
               jobs: int | None = None) -> list[RunnerBuild]:
    plans = plan(executorch_src, platform, ndk, jobs=jobs)
    src = check_checkout(executorch_src)
    commit, version = checkout_commit(src), checkout_version(src)
    builds = []
    for p in plans:
        for argv in (p.configure, p.build):
            print("$", " ".join(argv), flush=True)
            if subprocess.run(argv, cwd=src).returncode != 0:
                raise RecipeError(f"{p.platform} sme2 {p.sme2} {p.flavour}: `{' '.join(argv[:2])}` failed")
        builds.append(register_binary(p.binary, p.platform, p.sme2, p.flavour, manifest=manifest,
                                      executorch_commit=commit, executorch_version=version,
                                      extra_files=p.extra_files))
    return builds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["register"]:
            p = argparse.ArgumentParser(prog="python -m sme2farm.runners.recipe register",
                                        description="Register an existing runner binary in the manifest.")
            p.add_argument("--binary", type=Path, required=True)
            p.add_argument("--platform", required=True, choices=[*PLATFORMS, "linux-x86_64"])
            p.add_argument("--sme2", required=True, choices=["on", "off"])
            p.add_argument("--flavour", default="timing", choices=["timing", "xnnlog"])
            p.add_argument("--executorch-src", type=Path, help="checkout the binary was built from")
            p.add_argument("--executorch-commit", default="")
            p.add_argument("--executorch-version", default="")
            p.add_argument("--extra-file", type=Path, action="append", default=[])
            p.add_argument("--supports-warmup", action="store_true", help="the runner accepts --warmup")
            p.add_argument("--manifest", type=Path)
            a = p.parse_args(argv[1:])
            commit, version = a.executorch_commit, a.executorch_version
            if a.executorch_src:
                src = Path(a.executorch_src).resolve()
                commit, version = commit or checkout_commit(src), version or checkout_version(src)
            build = register_binary(a.binary, a.platform, a.sme2, a.flavour, manifest=a.manifest,
                                    executorch_commit=commit, executorch_version=version,
                                    extra_files=a.extra_file, supports_warmup=a.supports_warmup)
            print(json.dumps(asdict(build), indent=2))
            return 0
        p = argparse.ArgumentParser(prog="python -m sme2farm.runners.recipe",
                                    description="Build and register the SME2 on/off x timing/xnnlog runners.")
        p.add_argument("--executorch-src", type=Path, required=True)
        p.add_argument("--platform", required=True, choices=PLATFORMS)
        p.add_argument("--ndk", type=Path, help="Android NDK (default $ANDROID_NDK)")
        p.add_argument("--manifest", type=Path)
        p.add_argument("--jobs", type=int)
        p.add_argument("--dry-run", action="store_true", help="print the commands as JSON, build nothing")
        a = p.parse_args(argv)
        if a.dry_run:
            print(json.dumps([v.as_json() for v in plan(a.executorch_src, a.platform, a.ndk, jobs=a.jobs)], indent=2))
            return 0
        builds = run_recipe(a.executorch_src, a.platform, a.ndk, a.manifest, a.jobs)
        print(json.dumps([asdict(b) for b in builds], indent=2))
        return 0
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
