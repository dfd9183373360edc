"""What goes onto lab hosts and laptops stays light, and installs under one namespace."""

from __future__ import annotations

import json
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
