"""A runner's folder for a device: the binary and every library it needs (DT_NEEDED, followed
recursively), copied as plain files so adb push and zip carry them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sme2farm.runners.catalog import sha256_file
from sme2farm.runners.elf import read_elf
from sme2farm.runners.tools import BINARY_NAME, BuildError


def resolve_needed(name: str, search: list[Path]) -> Path:
    for d in search:
        if (d / name).is_file():
            return d / name
    raise BuildError(f"no {name} (needed by the runner or its libraries) in {', '.join(map(str, search))}")


def needed_closure(binary: Path, search: list[Path]) -> dict[str, Path]:
    """Every library the binary needs, recursively (DT_NEEDED), name -> file (libc.so.6 brings
    the loader in by name). The binary itself is not included."""
    out: dict[str, Path] = {}
    todo = list(read_elf(binary).needed)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = resolve_needed(name, search)
        todo.extend(read_elf(out[name]).needed)
    return out


def stage(dest: Path, binary: Path, libs: dict[str, Path]) -> None:
    """Make `dest` hold exactly the binary and `libs` (by their NEEDED names, symlinks resolved:
    adb push and zip keep no links), copying only what differs."""
    dest.mkdir(parents=True, exist_ok=True)
    want = {BINARY_NAME: binary, **libs}
    for old in dest.iterdir():
        if old.name not in want and not old.name.startswith("."):
            old.unlink() if old.is_file() or old.is_symlink() else shutil.rmtree(old)
    for name, src in want.items():
        target = dest / name
        if target.is_file() and not target.is_symlink() and target.stat().st_size == src.stat().st_size \
                and sha256_file(target) == sha256_file(src):
            continue
        tmp = dest / f".{name}.tmp"
        shutil.copyfile(src.resolve(), tmp)
        os.chmod(tmp, 0o755)
        tmp.replace(target)
