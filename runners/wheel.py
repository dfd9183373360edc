"""The executorch wheels from PyPI that a build reads without installing them: the aarch64 one the
cross build links against, and the macOS arm64 one whose Mach-O facts the macOS build plan is
checked against off a Mac (runners/build.py --dry-run); the version pinned to the installed
exporter's, fetched by pip once (its sha256 recorded), and the parts a build needs unpacked once
per sha256.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sme2farm.runners.catalog import sha256_file
from sme2farm.runners.tools import BuildError, executorch_package

WHEEL_PLATFORM = "manylinux_2_28_aarch64"
MACOS_WHEEL_PLATFORM = "macosx_14_0_arm64"
WHEEL_PYTHON = "3.11"            # any cp3x wheel carries the same C++ libraries; pinned for a stable file
# What a build needs from the wheel (73 MB unpacked in full; these parts are ~14 MB).
WHEEL_PARTS = ("executorch/include/", "executorch/lib/", "executorch/share/", "executorch/version.py")


@dataclass
class Wheel:
    path: Path
    sha256: str
    version: str       # the pip pin (public version, no local label)


def pinned_version() -> str:
    """The installed executorch's public version (1.5.1 for 1.5.1+cpu): the wheel must match the
    exporter that writes the programs, so the pin follows the install."""
    _, version, _ = executorch_package()
    return version.split("+", 1)[0]


def fetch_wheel(version: str, cache: Path, platform: str = WHEEL_PLATFORM) -> Wheel:
    """The `platform` wheel (aarch64 Linux unless told) in `cache`, downloaded by pip unless a file
    whose sha256 matches the record is already there. A file that no longer matches its record is
    fetched again; a fresh download that differs from the record is refused (the pin is the
    recorded sha256)."""
    cache.mkdir(parents=True, exist_ok=True)
    record_file = cache / "wheels.json"
    records = json.loads(record_file.read_text()) if record_file.exists() else {}
    key = f"executorch=={version} {platform} cp{WHEEL_PYTHON.replace('.', '')}"
    rec = records.get(key)
    if rec and (cache / rec["file"]).is_file():
        if sha256_file(cache / rec["file"]) == rec["sha256"]:
            return Wheel(cache / rec["file"], rec["sha256"], version)
        (cache / rec["file"]).unlink()          # damaged or replaced: fetch it again
    argv = [sys.executable, "-m", "pip", "download", f"executorch=={version}", "--platform", platform,
            "--python-version", WHEEL_PYTHON, "--only-binary=:all:", "--no-deps", "--disable-pip-version-check",
            "-d", str(cache)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"pip download of the {platform} executorch=={version} wheel failed:\n{r.stdout[-800:]}{r.stderr[-800:]}")
    found = sorted(cache.glob(f"executorch-{version}*-{platform}.whl"))
    found = [p for p in found if f"-cp{WHEEL_PYTHON.replace('.', '')}-" in p.name] or found
    if not found:
        raise BuildError(f"pip reported success but no executorch-{version}*{platform}.whl is in {cache}")
    wheel = found[-1]
    sha = sha256_file(wheel)
    if rec and rec["sha256"] != sha:
        raise BuildError(f"{wheel.name} has sha256 {sha}, but {rec['sha256']} was recorded in {record_file}; "
                         "remove that entry to accept the new file")
    records[key] = {"file": wheel.name, "sha256": sha}
    tmp = record_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    tmp.replace(record_file)
    return Wheel(wheel, sha, version)


def unpack_wheel(wheel: Wheel, cache: Path) -> Path:
    """<cache>/<sha16>/executorch: the wheel's headers, libraries and CMake package (once per sha)."""
    root = cache / wheel.sha256[:16]
    if (root / ".complete").exists():
        return root / "executorch"
    tmp = cache / f".{wheel.sha256[:16]}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel.path) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith(WHEEL_PARTS)])
    (tmp / ".complete").write_text(wheel.sha256 + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root / "executorch"


def wheel_git_commit(et_dir: Path) -> str:
    m = re.search(r"git_version[^=]*=\s*'([0-9a-f]+)'", (et_dir / "version.py").read_text())
    return m.group(1) if m else ""


def wheel_version(et_dir: Path) -> str:
    m = re.search(r"__version__\s*=\s*\"([^\"]+)\"", (et_dir / "version.py").read_text())
    return m.group(1) if m else ""
