"""The runner catalog: a JSON manifest naming every runner build the farm can use.

Each build is one binary for one (platform, sme2 on/off, flavour), with its sha256 and the
ExecuTorch version it was built from. Agents pick the build a run needs from here and refuse,
with a reason, when none fits; every Run records the build that ran.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sme2farm.protocol import RunnerInfo

RUNNERS_DIR = Path(__file__).resolve().parent
DEFAULT_MANIFEST = RUNNERS_DIR / "build" / "manifest.json"


@dataclass
class RunnerBuild:
    id: str
    platform: str            # linux-x86_64 | linux-arm64 | macos-arm64 | android-arm64-v9a
    sme2: str                # "on" | "off"
    flavour: str             # "timing" | "xnnlog"
    path: str                # binary, absolute or relative to the manifest's folder
    sha256: str
    executorch_version: str = ""
    executorch_commit: str = ""
    extra_files: list[str] = field(default_factory=list)  # pushed beside the runner (libc++_shared.so)
    # Upstream executor_runner (gflags) rejects --warmup; such builds are registered with False so a
    # driver can run warmup+iterations and drop the first `warmup` Execute blocks instead.
    supports_warmup: bool = True
    # How the build was made: "local-build" (runners.build on this host), "wheel-cross" (cross-compiled
    # against PyPI's aarch64 executorch wheel), "recipe" (an ExecuTorch checkout, runners.recipe).
    origin: str = "local-build"
    # Environment the driver sets for the runner. One arm64 binary (wheel-cross, or a Mac's or arm64
    # host's local build) serves both SME2 arms: the "off" arm is registered with
    # {"SME2FARM_HIDE_SME2": "1"}, which makes libsme2farm_hide clear cpuinfo_isa's SME fields before
    # XNNPACK reads them (and, on Linux, the runner's exported getauxval() clear HWCAP2_SME/SME2).
    env: dict[str, str] = field(default_factory=dict)
    # A glibc dynamic loader shipped among extra_files (Android bundles): the driver runs
    # `<dir>/<loader> --library-path <dir> <dir>/runner ...` so the phone's bionic is not involved.
    loader: str = ""
    # Our runner reads --inputs_file (runners/inputs.py's container); upstream executor_runner does not.
    supports_inputs: bool = True
    # Our runner writes the method's outputs with --outputs_file (the same container); builds made
    # before it, and upstream executor_runner, cannot. Default False so a manifest written before
    # this field loads as "cannot write outputs" (numerics "not recorded"), never as a promise.
    supports_outputs: bool = False
    # Our runner writes its memory figures with --memory_file and runs LLM prefill/decode with
    # --llm_prompt/--llm_decode; builds made before them, and upstream executor_runner, cannot.
    # Default False so an older manifest loads as "cannot" (memory not recorded, LLM runs refused).
    supports_memory: bool = False
    supports_llm: bool = False
    # How it was made, free-form (runners.cross: toolchain, wheel file and sha256, build seconds,
    # minimum glibc). Defaulted so manifests written before it load unchanged.
    provenance: dict = field(default_factory=dict)

    def info(self) -> RunnerInfo:
        return RunnerInfo(id=self.id, platform=self.platform, sme2=self.sme2, flavour=self.flavour,
                          executorch_version=self.executorch_version,
                          executorch_commit=self.executorch_commit, sha256=self.sha256, origin=self.origin)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Catalog:
    def __init__(self, manifest: Path, builds: list[RunnerBuild]):
        self.manifest = manifest
        self.builds = builds

    @classmethod
    def load(cls, manifest: Path | str | None = None) -> "Catalog":
        path = Path(manifest or os.environ.get("SME2_RUNNER_MANIFEST") or DEFAULT_MANIFEST)
        if not path.exists():
            return cls(path, [])
        data = json.loads(path.read_text())
        return cls(path, [RunnerBuild(**b) for b in data.get("builds", [])])

    def save(self) -> None:
        self.manifest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": 1, "builds": [asdict(b) for b in self.builds]}, indent=2) + "\n")
        tmp.replace(self.manifest)

    def resolve(self, build: RunnerBuild) -> Path:
        p = Path(build.path)
        return p if p.is_absolute() else (self.manifest.parent / p)

    def find(self, platform: str, sme2: str, flavour: str = "timing") -> RunnerBuild | None:
        for b in self.builds:
            if (b.platform, b.sme2, b.flavour) == (platform, sme2, flavour):
                return b
        return None

    def register(self, build: RunnerBuild) -> None:
        """Add or replace the build for the same (platform, sme2, flavour)."""
        self.builds = [b for b in self.builds if (b.platform, b.sme2, b.flavour) != (build.platform, build.sme2, build.flavour)]
        self.builds.append(build)
