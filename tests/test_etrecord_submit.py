"""The ETRecord through the farm: sent with a model (the `etrecord` part, `sme2-client submit
--etrecord` or the file beside the model), checked against it at submission, stored by sha256,
read by ingest, its attribution in the run's report. On the real API (SQLite and PostgreSQL), the
real agent and runner, ETRecords written by the bundled examples' real export."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil

import pytest
from sqlalchemy import select

from _fixtures_farm import QUICK_SPEC, dispatch, http_of, ingest_all
from _fixtures_runtime import export_once, shared_exports_dir
from sme2farm.protocol import Attribution, ModuleTime, RunReport, SourceRow
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Experiment

pytestmark = pytest.mark.models

# toy_cnn's modules (runners/examples.py _toy_cnn): what its operators are attributed to
TOY_MODULES = {"conv", "dw", "pw", "fc"}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """Factory exported(name) -> (the .pte, its ETRecord beside it as <name>.pte.etrecord), written
    once per session by the examples' own export."""
    pytest.importorskip("executorch")
    from sme2farm.runners.examples import etrecord_path, export_example

    out_dir = shared_exports_dir(tmp_path_factory)

    def make(name: str):
        pte = out_dir / f"{name}-with-etrecord.pte"

        def export(partial):
            export_example(name, partial, etrecord=etrecord_path(pte).with_suffix(f".{os.getpid()}.partial"))
            os.replace(etrecord_path(pte).with_suffix(f".{os.getpid()}.partial"), etrecord_path(pte))

        export_once(pte, export)
        return pte, etrecord_path(pte)

    return make


def post(api, model: bytes, etrecord: bytes | None = None, spec: dict | None = None, vs_model: bytes | None = None):
    http, headers = http_of(api)
    files = {"model": ("m.pte", model, "application/octet-stream")}
    if vs_model is not None:
        files["vs_model"] = ("b.pte", vs_model, "application/octet-stream")
    if etrecord is not None:
        files["etrecord"] = ("m.etrecord", etrecord, "application/octet-stream")
    import json
    return http.post("/experiments", files=files, data={"spec": json.dumps(spec or QUICK_SPEC)}, headers=headers)


def stored(api) -> tuple:
    """What a refused submission must leave as it was: experiments, files in the store, temp files."""
    data = api.settings.data_dir
    files = sorted(str(p.relative_to(data)) for d in ("models", "etrecords", "inputs", "tmp") if (data / d).exists()
                   for p in (data / d).rglob("*") if p.is_file())
    with session_scope(api.settings.sqlalchemy_url) as s:
        return len(s.scalars(select(Experiment.id)).all()), files


def run_it(api, agent, exp_id: int, monkeypatch) -> RunReport:
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    ingest_all(api, [rid], monkeypatch)
    r = api.client.get(f"/runs/{rid}", headers=api.auth())
    assert r.status_code == 200, r.text
    return RunReport.model_validate(r.json())


def test_a_model_with_its_etrecord_gets_its_runs_attributed_to_its_modules(api, agent, exported, monkeypatch):
    pte, etrecord = exported("toy_cnn")
    r = post(api, pte.read_bytes(), etrecord.read_bytes())
    assert r.status_code == 201, r.text
    exp = r.json()
    sha = hashlib.sha256(etrecord.read_bytes()).hexdigest()
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert s.get(Experiment, exp["id"]).etrecord_sha256 == sha
    kept = api.settings.data_dir / "etrecords" / sha[:2] / f"{sha}.etrecord"
    assert kept.read_bytes() == etrecord.read_bytes()   # content-addressed, as sent
    assert not list((api.settings.data_dir / "tmp").iterdir())

    run = run_it(api, agent, exp["id"], monkeypatch)
    assert run.status == "succeeded", run.reason
    assert run.attribution is not None and run.attribution.status == "attributed", run.attribution
    assert run.attribution.attributed_share > 0.5
    named = {row.module for row in run.by_source if row.module}
    assert named and named <= TOY_MODULES, named
    assert {"conv", "fc"} <= named  # the 3x3 convolution and the Linear head, each its own row
    conv = [row for row in run.by_source if row.module == "conv" and row.category == "Convolution"]
    assert conv and all(row.module_class == "Conv2d" for row in conv)
    # the line of the model's code that made it: runners/examples.py's forward, not torch's
    assert all(row.location and row.location.split(":")[0].endswith("examples.py") for row in conv), conv
    assert all("self.conv(x)" in (row.code or "") for row in conv), conv
    [fc] = [row for row in run.by_source if row.module == "fc" and row.category == "GEMM"]
    assert fc.module_class == "Linear" and fc.delegated and "self.fc(y)" in (fc.code or ""), fc
    assert {m.module for m in run.by_module} >= {"conv", "fc"}
    assert sum(m.ms for m in run.by_module if m.depth == 1) <= run.e2e_ms.mean * 1.001

    # The wire contract holds every key the analysis wrote (read models would drop an unknown one).
    served = r_json(api, run.id)
    for key, model in (("by_source", SourceRow), ("by_module", ModuleTime)):
        names = {f.name for f in dataclasses.fields(model)}
        assert served[key] and all(set(row) <= names for row in served[key]), (key, served[key][0])
    assert set(served["attribution"]) <= {f.name for f in dataclasses.fields(Attribution)}

    # The experiment's report carries the same sections for the run.
    rep = api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()
    [listed] = rep["runs"]
    assert listed["attribution"]["status"] == "attributed" and listed["by_source"] == r_json(api, run.id)["by_source"]


def r_json(api, run_id: int) -> dict:
    return api.client.get(f"/runs/{run_id}", headers=api.auth()).json()


def test_without_an_etrecord_no_module_is_named(api, agent, exported, monkeypatch):
    pte, _ = exported("toy_cnn")
    r = post(api, pte.read_bytes())
    assert r.status_code == 201, r.text
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert s.get(Experiment, r.json()["id"]).etrecord_sha256 is None
    run = run_it(api, agent, r.json()["id"], monkeypatch)
    assert run.status == "succeeded", run.reason
    assert run.attribution.status == "no etrecord"
    assert not [row for row in run.by_source or [] if row.module]   # invented no module
    assert not [m for m in run.by_module or [] if m.module not in ("not attributed",)]


def test_the_etrecord_is_model_as_and_read_once_per_batch(api, agent, exported, monkeypatch):
    """An A/B experiment with model A's ETRecord, two sessions (A B B A): A's runs are attributed,
    B's (another model) say "no etrecord" and name no module; the ingest batch that takes the four
    runs reads the ETRecord once."""
    from sme2farm.server.services import etrecords
    from sme2farm.worker import tasks

    pte, etrecord = exported("toy_cnn")
    mlp, _ = exported("mlp")
    r = post(api, pte.read_bytes(), etrecord.read_bytes(), {**QUICK_SPEC, "sessions": 2}, vs_model=mlp.read_bytes())
    assert r.status_code == 201, r.text
    dispatch(api)
    for _ in range(4):  # one device: each run is assigned as the one before finishes
        [a] = agent.api.claim(wait=0)
        agent.execute(a)
    rids = sorted(run["id"] for run in api.client.get(f"/experiments/{r.json()['id']}", headers=api.auth()).json()["runs"])
    reads = []
    real = etrecords.parse
    monkeypatch.setattr(etrecords, "parse", lambda data: reads.append(len(data)) or real(data))
    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    assert tasks.ingest_run(rids[0]) == "succeeded"   # the batch takes the four
    assert reads == [etrecord.stat().st_size]
    runs = [RunReport.model_validate(r_json(api, rid)) for rid in rids]
    assert sorted(run.variant for run in runs) == ["A", "A", "B", "B"] and {run.status for run in runs} == {"succeeded"}
    for run in runs:
        if run.variant == "A":
            assert run.attribution.status == "attributed" and {row.module for row in run.by_source} & TOY_MODULES
        else:
            assert run.attribution.status == "no etrecord" and not [row for row in run.by_source if row.module]


def test_another_models_etrecord_is_a_422_naming_the_mismatch_and_stores_nothing(api, agent, exported):
    pte, _ = exported("toy_cnn")
    _, mlp_etrecord = exported("mlp")
    before = stored(api)
    r = post(api, pte.read_bytes(), mlp_etrecord.read_bytes())
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("etrecord: the ETRecord is not this model's: "), detail
    assert stored(api) == before


def test_an_unreadable_or_oversized_etrecord_is_refused_naming_why(api, agent, exported):
    pte, etrecord = exported("toy_cnn")
    before = stored(api)
    r = post(api, pte.read_bytes(), b"PK\x03\x04 not really a zip")
    assert r.status_code == 422 and r.json()["detail"].startswith("etrecord: not a readable ETRecord: "), r.text
    assert stored(api) == before
    r = post(api, pte.read_bytes(), etrecord.read_bytes()[: len(etrecord.read_bytes()) // 2])   # truncated
    assert r.status_code == 422 and r.json()["detail"].startswith("etrecord: not a readable ETRecord: "), r.text
    assert stored(api) == before
    api.settings.max_etrecord_mb = 1
    r = post(api, pte.read_bytes(), bytes((1 << 20) + 1))
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == "etrecord upload exceeds the 1 MiB limit (SME2_MAX_ETRECORD_MB)"
    assert stored(api) == before
    r = post(api, pte.read_bytes(), etrecord.read_bytes())   # within it, the same body is taken
    assert r.status_code == 201, r.text


def test_submit_takes_the_etrecord_beside_the_model_and_says_so_once(api, agent, exported, tmp_path, capsys):
    from sme2farm.client import cli

    pte, etrecord = exported("toy_cnn")
    model = tmp_path / "net.pte"
    shutil.copy(pte, model)
    argv = ["--server", api.url, "--token", api.token, "submit", str(model), "--sme2", "off", "--iterations", "3"]

    assert cli.main(argv) == 0   # none beside it: one line on how to export one
    err = capsys.readouterr().err
    assert err.count("no ETRecord beside net.pte") == 1 and "generate_etrecord=True" in err, err

    for sibling in (tmp_path / "net.pte.etrecord", tmp_path / "net.etrecord"):
        shutil.copy(etrecord, sibling)
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        assert err.count(f"taking the ETRecord beside the model, {sibling}") == 1, err
        sibling.unlink()
    explicit = tmp_path / "elsewhere" / "x.bin"
    explicit.parent.mkdir()
    shutil.copy(etrecord, explicit)
    assert cli.main([*argv, "--etrecord", str(explicit)]) == 0
    assert "ETRecord" not in capsys.readouterr().err   # given: nothing to say

    sha = hashlib.sha256(etrecord.read_bytes()).hexdigest()
    with session_scope(api.settings.sqlalchemy_url) as s:
        got = [e.etrecord_sha256 for e in s.scalars(select(Experiment).order_by(Experiment.id))]
    assert got == [None, sha, sha, sha]


def test_a_kit_config_submit_takes_the_kits_etrecord_beside_its_model(api, agent, exported, tmp_path, capsys):
    """The kit keeps the ETRecord as <model>.pte.etrecord beside the model its config names."""
    import json

    from _fixtures_kit import template
    from sme2farm.client import cli

    pte, etrecord = exported("toy_cnn")
    shutil.copy(pte, tmp_path / "toy_cnn_xnnpack_fp32.pte")
    shutil.copy(etrecord, tmp_path / "toy_cnn_xnnpack_fp32.pte.etrecord")
    cfg = template()
    cfg.pop("output_root")
    cfg["experiments"] = [{"name": "linux_sme2_off", "runs": 3, "warmup": 0, "threads": [1]}]
    config = tmp_path / "exp.json"
    config.write_text(json.dumps(cfg))
    assert cli.main(["--server", api.url, "--token", api.token, "submit", "--kit-config", str(config)]) == 0
    assert "taking the ETRecord beside the model" in capsys.readouterr().err
    with session_scope(api.settings.sqlalchemy_url) as s:
        [exp] = s.scalars(select(Experiment))
        assert exp.etrecord_sha256 == hashlib.sha256(etrecord.read_bytes()).hexdigest()


def test_examples_write_the_pte_and_its_etrecord_and_the_pte_is_unchanged(exported):
    from sme2farm.agent.check import EXAMPLE

    pte, etrecord = exported("toy_cnn")
    assert pte.read_bytes() == EXAMPLE.read_bytes()   # runners/check_example.pte: the same bytes with an ETRecord
    import zipfile
    with zipfile.ZipFile(etrecord) as z:
        assert "edge_dialect_exported_program/forward" in z.namelist() and "debug_handle_map" in z.namelist()
