"""What goes onto lab hosts and laptops stays light, and installs under one namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torch", "executorch", "sqlalchemy", "celery", "pandas", "fastapi")


def imported_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_agent_imports_without_heavy_dependencies():
    mods = imported_after("import sme2farm.agent.cli, sme2farm.agent.loop, sme2farm.agent.api\n"
                          "import sme2farm.agent.drivers.local, sme2farm.agent.drivers.android, sme2farm.agent.drivers.macos")
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_client_and_analysis_import_without_heavy_dependencies():
    mods = imported_after("import sme2farm.client.cli, sme2farm.client.api, sme2farm.client.render, sme2farm.analysis\n"
                          "sme2farm.client.cli.build_parser()")
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_offline_analyze_starts_without_the_http_client_or_the_wire_schemas():
    """`sme2-client analyze` (client/main.py) loads numpy and the analysis, not httpx, pydantic or protocol."""
    probe = ("import sys\nfrom sme2farm.client.main import main\n"
             "try:\n    main(['analyze', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    mods = set(out.stdout.splitlines()[-1].split())
    assert "sme2farm.client.analyze_cmd" in mods and "sme2farm.analysis" in mods
    assert not {m for m in mods if m.split(".")[0] in ("httpx", "pydantic") or m.startswith("sme2farm.protocol")
                or m in ("sme2farm.client.cli", "sme2farm.client.api")}, "analyze imported the online client"
    assert "usage: sme2-client analyze" in out.stdout


def test_no_generic_top_level_modules_are_installed():
    out = subprocess.run([sys.executable, "-c", "import importlib.util as u; print([m for m in "
                          "('server','worker','agent','client','analysis','runners','migrations') if u.find_spec(m)])"],
                         capture_output=True, text=True, cwd="/", timeout=60)
    assert out.stdout.strip() == "[]"


def test_offline_analyze_through_the_client_entry_point(example_pte, local_runner, tmp_path):
    """`sme2-client analyze` needs no server: run the real runner, then analyse its trace."""
    catalog, build = local_runner
    runner = catalog.resolve(build)
    subprocess.run([str(runner), f"--model_path={example_pte('portable_mix')}", "--num_executions=15",
                    "--warmup=1", f"--etdump_path={tmp_path / 't.etdump'}"], check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "sme2farm.client.main", "analyze", str(tmp_path / "t.etdump"), "--json"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["e2e_ms"]["n"] == 15
    assert rep["portable_ops"] and all(not o["delegated"] for o in rep["operators"] if o["name"] in rep["portable_ops"])
    text = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "analyze", str(tmp_path / "t.etdump")],
                          capture_output=True, text=True, timeout=120)
    assert "PORTABLE" in text.stdout and "Categories" in text.stdout


def test_the_wheel_builds_without_setuptools_warnings_and_ships_the_dashboard(tmp_path):
    """A plain (non-editable) build: setuptools says nothing about packages left out of the
    configuration (server/static is a data-only package it would otherwise warn about), and the
    installed wheel finds the dashboard through importlib.resources, every file of server/static."""
    import shutil
    import tomllib
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"   # a copy: the repository's own build/ may hold stale files from another build
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    folders = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for folder in sorted({f.split("/")[0] for f in folders}):
        shutil.copytree(root / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "build"))
    built = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                            f"print(build_meta.build_wheel({str(tmp_path / 'dist')!r}))"],
                           cwd=src, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    chatter = built.stdout + built.stderr
    assert "absent from the `packages` configuration" not in chatter and "Package would be ignored" not in chatter, chatter
    wheel = tmp_path / "dist" / built.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    static = sorted(p.name for p in (root / "server" / "static").iterdir() if p.is_file())
    probe = subprocess.run([sys.executable, "-c", "import importlib.resources as r, sme2farm; print(sme2farm.__file__); "
                            "d = r.files('sme2farm.server.static'); "
                            "print(sorted(p.name for p in d.iterdir() if p.is_file())); "
                            "print(d.joinpath('index.html').read_text()[:200])"],
                           cwd="/", env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    where, names, page = probe.stdout.split("\n", 2)
    assert where.startswith(str(tmp_path / "site")), where   # the wheel's copy, not the editable install
    assert names == repr(static) and "<html" in page.lower(), probe.stdout


def test_make_setup_prints_no_setuptools_box(tmp_path):
    """`make setup`'s editable install, with the Makefile's own warning filter: setuptools' boxed
    notice ("Editable installation ... !!") is not printed, and a real warning still would be."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    [quiet] = re.findall(r'^EDITABLE_QUIET := PYTHONWARNINGS="([^"]+)"$', (root / "Makefile").read_text(), re.M)
    src = tmp_path / "src"   # a copy: an editable build writes its egg-info beside pyproject.toml
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((root / name).read_bytes())
    import tomllib
    for folder in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values():
        (src / folder).mkdir(parents=True, exist_ok=True)   # the layout, empty: the notice is about its shape
        (src / folder / "__init__.py").write_text("")
    code = (f"import warnings; from setuptools import build_meta; build_meta.build_editable({str(tmp_path)!r}); "
            "warnings.warn('Package would be ignored: a real warning', UserWarning)")

    def build(warnings_filter: str) -> str:
        built = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONWARNINGS": warnings_filter})
        assert built.returncode == 0, built.stderr[-3000:]
        return built.stdout + built.stderr

    assert "Editable installation" in build("")   # what the filter is for
    chatter = build(quiet)
    assert "Editable installation" not in chatter and "\n!!\n" not in chatter, chatter
    assert "Package would be ignored: a real warning" in chatter
