"""The import layering holds (.importlinter: farm and migrations above the worker, the server,
agent and client, runners, the wire contract and the analysis; no cycle inside any package), and
no module imports another module's private names.

pyproject.toml maps the repository's folders to sme2farm.* (package-dir), which grimp cannot
see: it walks the sme2farm/ folder only. So the test lays the installed package out as a tree
of symlinks and runs lint-imports on that tree (grimp follows the links)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _package_dirs() -> dict[str, Path]:
    """sme2farm.* top-level sub-package -> its folder, from pyproject.toml's package-dir."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name.split(".")[1]: ROOT / folder for name, folder in mapping.items() if name.count(".") == 1}


def _modules(dirs: dict[str, Path]) -> list[tuple[str, Path]]:
    """Every sme2farm module (dotted name, file)."""
    out = [(f"sme2farm.{p.stem}" if p.stem != "__init__" else "sme2farm", p)
           for p in sorted((ROOT / "sme2farm").glob("*.py"))]
    for sub, folder in sorted(dirs.items()):
        for p in sorted(folder.rglob("*.py")):
            if any(not (d / "__init__.py").is_file() for d in (p.parent, *p.parent.parents) if d.is_relative_to(folder)):
                continue  # not in a package (an unpacked wheel under runners/build/)
            parts = p.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out.append((".".join(("sme2farm", sub, *parts)), p))
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layers")
    pkg = root / "sme2farm"
    pkg.mkdir()
    for p in (ROOT / "sme2farm").glob("*.py"):
        (pkg / p.name).symlink_to(p)
    for sub, folder in _package_dirs().items():
        (pkg / sub).symlink_to(folder, target_is_directory=True)
    return root


def test_the_import_contracts_hold(tree):
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # the count first: a graph of the 3 modules under sme2farm/ would keep every contract vacuously
    probe = subprocess.run([sys.executable, "-c", "import grimp, sme2farm; "
                            "print(sme2farm.__file__); print(len(grimp.build_graph('sme2farm').modules))"],
                           cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    where, count = probe.stdout.split()
    assert Path(where).parent == tree / "sme2farm"
    assert int(count) == len(_modules(_package_dirs())), "grimp did not read the symlinked tree"
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), str(ROOT / ".importlinter"), "--no-cache"],
                       cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "import contracts broken:\n" + r.stdout + r.stderr


def _private_imports(module: str, path: Path, known: set[str]) -> list[str]:
    """`from X import _name` where X is another sme2farm module (or `import X._mod`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("sme2farm") or source == module:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and \
                        f"{source}.{alias.name}" not in known:
                    out.append(f"{module}:{node.lineno} imports {source}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sme2farm") and any(
                        p.startswith("_") and not p.startswith("__") for p in alias.name.split(".")):
                    out.append(f"{module}:{node.lineno} imports {alias.name}")
    return out


def test_no_module_imports_another_modules_private_names():
    modules = _modules(_package_dirs())
    known = {name for name, _ in modules}   # `from pkg import _module` names a module, not a private name
    found = [line for name, path in modules for line in _private_imports(name, path, known)]
    assert not found, "private names imported across modules:\n" + "\n".join(found)
