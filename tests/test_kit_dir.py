"""The SME2 kit's run directory, both ways, on the real server with real runs: `sme2-client
artifacts E<id> --kit -o DIR` writes what the kit's tools read, `sme2-client import DIR` stores it
back (analysed again by the farm's own ingest), and a placeholder or truncated trace is refused in
one sentence with nothing stored.

The kit is github ArmDeveloperEcosystem/sme-executorch-profiling (Apache-2.0); the layout and keys
below are written out from its files (model_profiling/...), not imported from the farm's module, so
a change there cannot silently change what is checked. Where each comes from:
- validate_results.py:27-41: `<run dir>/manifest.json` and `metrics.json` exist, at least one
  `**/*.etdump`, the manifest has `model` and a `results` list;
- generate_report.py:202-260: the manifest's `model`, `config`, `executorch.sha`; metrics.json's
  `results[].experiment` and `metrics.latency_ms`; each experiment is the folder its traces are in, named
  with sme2_on / sme2_off (line ~340);
- analyze_results.py:184-192: the manifest's `model` + ".etrecord" is the ETRecord;
- test-cases/fixtures/known_good_mac/runs/mac/manifest.json: `metrics` {runs, threads, latency_ms,
  median_ms, min_ms, max_ms, etdump, log, etdump_rel, log_rel};
- analyze_results.py:160-167 and the fixture's analysis_summary.json: run_dir, model, etrecord,
  etdump_count, category_totals_ms, kernel_hints, per_etdump[] {etdump, categories_ms, rows}.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _fixtures_farm import QUICK_SPEC, dispatch, ingest_all, register, submit
from sme2farm.client import cli

MANIFEST_KEYS = {"model", "results", "executorch"}
METRIC_KEYS = {"runs", "threads", "latency_ms", "median_ms", "min_ms", "max_ms", "etdump", "log", "etdump_rel",
               "log_rel"}
SUMMARY_KEYS = {"run_dir", "model", "etrecord", "etdump_count", "category_totals_ms", "kernel_hints", "per_etdump"}
PER_ETDUMP_KEYS = {"etdump", "categories_ms", "rows"}
# The kit's placeholder trace: test-cases/fixtures/known_good_mac/runs/mac/mac_sme2_on/mac_sme2_on_t1.etdump
KIT_PLACEHOLDER = b"dummy-etdump\n"


@pytest.fixture
def as_user(api, monkeypatch):
    """sme2-client in this process, pointed at the test's server."""
    monkeypatch.setenv("SME2_SERVER", api.url)
    monkeypatch.setenv("SME2_TOKEN", api.token)
    return lambda *argv: cli.main([*argv])


@pytest.fixture(scope="module")
def toy_with_etrecord(tmp_path_factory) -> tuple[Path, Path]:
    """toy_cnn exported here with its ETRecord beside it, as the kit keeps it (<model>.pte.etrecord)."""
    pytest.importorskip("torch")
    from sme2farm.runners.examples import export_example

    d = tmp_path_factory.mktemp("toy_et")
    pte, et = d / "toy_cnn.pte", d / "toy_cnn.pte.etrecord"
    export_example("toy_cnn", pte, etrecord=et)
    return pte, et


def _run_on_host(api, agent, monkeypatch, model: Path, etrecord: Path | None = None, **spec) -> dict:
    if etrecord is None:
        exp = submit(api, model.read_bytes(), **spec)
    else:
        r = api.client.post("/experiments", headers=api.auth(), data={"spec": json.dumps({**QUICK_SPEC, **spec})},
                            files={"model": ("m.pte", model.read_bytes()), "etrecord": ("m.etrecord", etrecord.read_bytes())})
        assert r.status_code == 201, r.text
        exp = r.json()
    ids = dispatch(api)
    for a in agent.api.claim(wait=0):
        agent.execute(a)
    ingest_all(api, ids, monkeypatch)
    return api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()


def _check_kit_dir(run_dir: Path, out: Path) -> tuple[dict, dict]:
    """What the kit's tools read is there, and every path named exists."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    summary = json.loads((run_dir / "analysis_summary.json").read_text())
    assert MANIFEST_KEYS <= set(manifest) and isinstance(manifest["results"], list) and manifest["results"]
    assert metrics["results"] == manifest["results"]
    assert Path(manifest["model"]).is_file() and Path(manifest["model"]).parent == (out / "artifacts").resolve()
    assert list(run_dir.glob("**/*.etdump"))
    for r in manifest["results"]:
        m = r["metrics"]
        assert METRIC_KEYS <= set(m), set(m)
        assert "sme2_on" in r["experiment"] or "sme2_off" in r["experiment"]
        assert Path(m["etdump"]).is_file() and (run_dir / m["etdump_rel"]).resolve() == Path(m["etdump"])
        assert Path(m["etdump"]).parent.name == r["experiment"]  # the kit's <run dir>/<experiment>/ folder
        assert Path(m["etdump"]).name == f"{Path(manifest['model']).stem}_{r['experiment']}_t{m['threads']}.etdump"
        if m["log"] is not None:
            assert Path(m["log"]).is_file() and (run_dir / m["log_rel"]).resolve() == Path(m["log"])
    assert SUMMARY_KEYS <= set(summary)
    assert Path(summary["run_dir"]) == run_dir.resolve() and Path(summary["model"]).is_file()
    assert summary["etdump_count"] == len(summary["per_etdump"]) == len(manifest["results"])
    for per in summary["per_etdump"]:
        assert PER_ETDUMP_KEYS <= set(per) and Path(per["etdump"]).is_file()
    return manifest, summary


def test_export_writes_the_kits_layout_and_import_gets_the_same_analysis(api, agent, toy_with_etrecord, as_user,
                                                                        monkeypatch, tmp_path, capsys):
    pte, etrecord = toy_with_etrecord
    exp = _run_on_host(api, agent, monkeypatch, pte, etrecord, sme2="off", iterations=5)
    [run] = exp["runs"]
    assert run["status"] == "succeeded", run["reason"]

    out = tmp_path / "kit"
    assert as_user("artifacts", f"E{exp['id']}", "--kit", "-o", str(out)) == 0, capsys.readouterr().err
    run_dir = out / "runs" / "linux"  # one device: runs/<platform>/, as the kit writes it
    manifest, summary = _check_kit_dir(run_dir, out)
    assert (out / "artifacts" / Path(manifest["model"]).name).read_bytes() == pte.read_bytes()
    [result] = manifest["results"]
    m = result["metrics"]
    assert result["experiment"] == "linux_sme2_off" and m["threads"] == 1 and m["sme2"] == "off"
    assert m["runs"] == 5 == len(m["latency_ms"]) and m["median_ms"] == pytest.approx(run["e2e_ms"]["median"])
    assert m["min_ms"] == min(m["latency_ms"]) and m["max_ms"] == max(m["latency_ms"])
    assert manifest["device"]["serial"] == run["device"]["serial"] and manifest["device"]["sme2"] is False
    assert manifest["executorch"]["sha"]  # what generate_report.py prints as the ExecuTorch SHA
    assert summary["category_totals_ms"] == pytest.approx(run["categories_ms"])
    # the ETRecord beside the model, where the kit's analyze_results.py looks (the manifest's model + ".etrecord")
    assert summary["etrecord"] == manifest["model"] + ".etrecord"
    assert Path(summary["etrecord"]).read_bytes() == etrecord.read_bytes()
    assert run["attribution"]["status"] == "attributed", run["attribution"]
    # report --by module lists the heaviest call sites under the tree, with their file:line, as analyze does
    capsys.readouterr()
    assert as_user("report", str(exp["id"]), "--by", "module") == 0
    text = capsys.readouterr().out
    head, _, sites = text.partition("top call sites (ms per iteration, operator, module, file:line):")
    assert sites, text
    heaviest = max(run["by_source"], key=lambda r: r["ms"])
    first = sites.strip().splitlines()[0]
    assert heaviest["location"] and heaviest["location"] in first and heaviest["module"] in first, (first, heaviest)
    assert first.split()[0] == f"{heaviest['ms']:.3f}"

    # back in: one experiment, marked imported, the same figures from the farm's own analysis
    before = api.client.get("/experiments", headers=api.auth()).json()["total"]
    capsys.readouterr()
    assert as_user("import", str(out)) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    # the farm's own export: said to come from that experiment, not measured outside the farm
    from_farm = f"imported: exported from farm experiment {exp['id']} ({api.url})"
    assert from_farm in said and "measured outside the farm" not in said
    page = api.client.get("/experiments", headers=api.auth()).json()
    assert page["total"] == before + 1
    back = api.client.get(f"/experiments/{page['items'][0]['id']}", headers=api.auth()).json()
    assert page["items"][0]["imported"] == from_farm  # the dashboard chip's title
    assert back["imported"]["note"] == from_farm and back["imported"]["farm"] == {"experiment": exp["id"],
                                                                                  "server": api.url}
    assert back["imported"]["source"] == "farm experiment export"
    assert "measured outside the farm" not in " ".join(back["warnings"])
    assert as_user("report", str(back["id"]), "--markdown", "-o", str(tmp_path / "r.md")) == 0
    assert f"Imported: exported from farm experiment {exp['id']} (farm experiment export" in (tmp_path / "r.md").read_text()
    assert back["imported"]["device"] == run["device"]["serial"] and back["imported"]["experiments"] == ["linux_sme2_off"]
    assert back["status"] == "succeeded" and back["model_sha256"] == exp["model_sha256"]
    assert back["etrecord_sha256"] == exp["etrecord_sha256"] is not None  # sent back with the model, checked again
    [again] = back["runs"]
    assert again["status"] == "succeeded" and again["sme2"] == "off" and again["threads"] == 1
    assert again["device"]["serial"] == run["device"]["serial"]
    assert again["runner"]["origin"] == "imported"
    assert again["e2e_ms"] == run["e2e_ms"] and again["categories_ms"] == run["categories_ms"]
    assert [o["name"] for o in again["operators"]] == [o["name"] for o in run["operators"]]
    assert again["attribution"] == run["attribution"] and again["by_module"] == run["by_module"]
    # imported runs are never dispatched: nothing is queued or assigned
    assert dispatch(api) == []


def _kit_dir_by_hand(tmp_path: Path, pte: Path, traces: dict[str, bytes]) -> Path:
    """A kit run directory as a user's Mac run leaves it (the known-good fixture's layout), with
    no device in its manifest: the command line says what it ran on."""
    out = tmp_path / "out_toy" / "runs" / "mac"
    results = []
    for name, data in traces.items():
        (out / name).mkdir(parents=True)
        (out / name / f"{name}_t1.etdump").write_bytes(data)
        (out / name / f"{name}_t1.log").write_text("runner log\n")
        results.append({"experiment": name, "metrics": {
            "runs": 3, "threads": 1, "latency_ms": [1.0, 1.0, 1.0], "median_ms": 1.0, "min_ms": 1.0, "max_ms": 1.0,
            "etdump": f"{name}/{name}_t1.etdump", "log": f"{name}/{name}_t1.log",
            "etdump_rel": f"{name}/{name}_t1.etdump", "log_rel": f"{name}/{name}_t1.log"}})
    (out.parent.parent / "artifacts").mkdir(parents=True)
    model = out.parent.parent / "artifacts" / "toy.pte"
    model.write_bytes(pte.read_bytes())
    (out / "manifest.json").write_text(json.dumps({
        "generated_at": "2026-11-30T00:00:00Z", "config": "configs/mac.json", "model": "out_toy/artifacts/toy.pte",
        "executorch": {"present": True, "sha": "abc123", "dirty": False}, "results": results}))
    (out / "metrics.json").write_text(json.dumps({"results": results}))
    return out


def _nothing_stored(api, before: int) -> None:
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == before
    data = Path(api.settings.data_dir)
    left = [p for p in (data / "artifacts" / "runs").rglob("*") if p.is_file()] if (data / "artifacts").exists() else []
    assert left == [], left
    assert [p for p in (data / "tmp").iterdir() if p.is_file()] == []


def test_a_placeholder_or_truncated_trace_is_refused_in_one_sentence_and_nothing_is_stored(
        api, example_pte, portable_trace, as_user, tmp_path, capsys):
    pte = example_pte("toy_cnn")
    before = api.client.get("/experiments", headers=api.auth()).json()["total"]
    real = portable_trace.read_bytes()
    # the kit's placeholder: refused by the command itself, in one sentence, before it asks for --sme2 or --model
    d = _kit_dir_by_hand(tmp_path / "placeholder", pte, {"mac_sme2_off": real, "mac_sme2_on": KIT_PLACEHOLDER})
    (d.parent.parent / "artifacts" / "toy.pte").unlink()  # no model found either: the trace is named first
    capsys.readouterr()
    assert as_user("import", str(d)) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "results[1] (mac_sme2_on): its etdump" in line and "is not an ETDump (no 'ED00' identifier" in line, line
    assert "--sme2" not in line and "--model" not in line and line.count(". ") == 0
    _nothing_stored(api, before)

    cases = {"truncated": real[: len(real) // 2]}
    for case, bad in cases.items():
        d = _kit_dir_by_hand(tmp_path / case, pte, {"mac_sme2_off": real, "mac_sme2_on": bad})
        capsys.readouterr()
        rc = as_user("import", str(d), "--sme2", "--device-model", "MacBook M4")
        err = capsys.readouterr().err
        assert rc == 1, err
        [line] = [x for x in err.splitlines() if "server said 422" in x]
        assert "manifest.results[1] (mac_sme2_on): its trace is not a usable ETDump" in line, line
        assert line.count(". ") == 0  # one sentence
        _nothing_stored(api, before)

    # and the device must be said: a kit manifest names none, the farm assumes no SME2
    d = _kit_dir_by_hand(tmp_path / "nodevice", pte, {"mac_sme2_off": real, "mac_sme2_on": real})
    capsys.readouterr()
    assert as_user("import", str(d)) == 2
    assert "--sme2 or --no-sme2" in capsys.readouterr().err
    _nothing_stored(api, before)


def test_the_server_refuses_what_the_manifest_cannot_back(api, example_pte, portable_trace):
    """The route's own checks (a client that is not sme2-client): a missing trace part, an SME2-on
    run on a device said to have no SME2, a part past results[], bad JSON: each a 422 naming it."""
    pte = example_pte("mlp").read_bytes()
    trace = portable_trace.read_bytes()
    device = {"serial": "my-mac", "platform": "macos", "sme2": False}
    on = {"experiment": "mac_sme2_on", "metrics": {"threads": 1}}
    off = {"experiment": "mac_sme2_off", "metrics": {"threads": 1}}

    def post(manifest, parts):
        files = [("model", ("m.pte", pte)), *[(k, (k, v)) for k, v in parts.items()]]
        data = {"manifest": manifest if isinstance(manifest, str) else json.dumps(manifest)}
        return api.client.post("/experiments/import", files=files, data=data, headers=api.auth())

    r = post({"model": "m.pte", "results": [off, on], "device": device}, {"etdump.0": trace, "etdump.1": trace})
    assert r.status_code == 422 and "is SME2 on, but manifest.device says my-mac has no SME2" in r.text
    r = post({"results": [off], "device": device}, {})
    assert r.status_code == 422 and "no 'etdump.0' part" in r.text
    r = post({"results": [off], "device": device}, {"etdump.0": trace, "etdump.3": trace})
    assert r.status_code == 422 and "has no manifest.results[3]" in r.text
    r = post({"results": [off]}, {"etdump.0": trace})
    assert r.status_code == 422 and "manifest.device: missing" in r.text
    r = post("{not json", {"etdump.0": trace})
    assert r.status_code == 422 and "manifest is not valid JSON" in r.text
    r = post({"results": [{"experiment": "mac_fast", "metrics": {"threads": 1}}], "device": device}, {"etdump.0": trace})
    assert r.status_code == 422 and "does not say SME2 on or off" in r.text
    # an ETRecord is checked as at submission (services/etrecords.py): one that is not one is refused naming the part
    r = post({"results": [off], "device": device}, {"etdump.0": trace, "etrecord": b"PK\x03\x04 not a zip"})
    assert r.status_code == 422 and r.json()["detail"].startswith("etrecord: not a readable ETRecord"), r.text
    r = api.client.post("/experiments/import", files=[("model", ("m.pte", pte)), ("../../etc/x", ("x", b"1"))],
                        data={"manifest": "{}"}, headers=api.auth())
    assert r.status_code == 422 and "unknown form part" in r.text
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 0


def test_an_imported_pair_is_compared_and_says_where_it_came_from(api, example_pte, portable_trace, as_user, tmp_path,
                                                                capsys):
    """A user's Mac run, both arms: the farm's SME2 off -> on comparison of that device, the
    experiment and the CLI saying the runs were measured outside the farm."""
    pte = example_pte("toy_cnn")
    real = portable_trace.read_bytes()
    d = _kit_dir_by_hand(tmp_path, pte, {"mac_sme2_off": real, "mac_sme2_on": real})
    assert as_user("import", str(d), "--sme2", "--device-model", "MacBook M4", "--serial", "my-mac") == 0, \
        capsys.readouterr().err
    [item] = api.client.get("/experiments", headers=api.auth()).json()["items"]
    rep = api.client.get(f"/experiments/{item['id']}", headers=api.auth()).json()
    assert rep["imported"]["note"] == "imported: measured outside the farm"
    assert rep["imported"]["executorch"] == {"sha": "abc123", "version": None, "dirty": False} and rep["imported"]["model"] == "toy.pte"
    assert {(r["sme2"], r["status"]) for r in rep["runs"]} == {("off", "succeeded"), ("on", "succeeded")}
    assert all(r["device"]["serial"] == "my-mac" and r["device"]["model"] == "MacBook M4" for r in rep["runs"])
    [c] = rep["comparisons"]
    assert c["kind"] == "sme2" and c["status"] == "complete" and c["device"] == "my-mac"
    assert c["device_model"] == "MacBook M4" and c["verdict"]  # a real device's arms: a verdict, not "emulated"
    assert not c.get("emulated")
    assert rep["warnings"] and "imported: measured outside the farm" in rep["warnings"][0]
    capsys.readouterr()
    assert as_user("status", str(rep["id"])) == 0
    said = capsys.readouterr().out
    assert "imported: measured outside the farm" in said
    # the runner line says what the manifest gave (its ExecuTorch sha), no empty 'sha256 …'
    runner_lines = [x for x in said.splitlines() if x.strip().startswith("runner:")]
    assert runner_lines and all("sha256" not in x and "ExecuTorch abc123)" in x for x in runner_lines), runner_lines
    # the same directory again: refused (409), naming the experiment already holding its traces; nothing more stored
    assert as_user("import", str(d), "--sme2", "--device-model", "MacBook M4", "--serial", "my-mac") == 1
    err = capsys.readouterr().err
    assert "409" in err and f"experiment {rep['id']} already holds these traces" in err, err
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 1
    assert as_user("report", str(rep["id"]), "--markdown", "-o", str(tmp_path / "r.md")) == 0
    assert ("Imported: measured outside the farm (kit run directory, toy.pte, device my-mac, ExecuTorch abc123): the "
            "farm analysed these traces, it did not run them.") in (tmp_path / "r.md").read_text()


@pytest.mark.arm64
@pytest.mark.sme2emu
def test_each_device_gets_its_own_run_directory_and_an_emulated_one_no_latency(
        api, agent, sme2_emulator, arm64_runners, example_pte, as_user, monkeypatch, tmp_path, capsys):
    """One experiment on this host (SME2 off; on is unschedulable here) and on the emulated SME2
    device (both arms): runs/linux-<serial>/ each, the host's totals its own run's alone, the
    emulated device's metrics without any latency (an emulator's times are not a CPU's)."""
    from sme2farm.agent.api import AgentApi
    from sme2farm.agent.drivers.qemu import QemuArm64Driver
    from sme2farm.agent.loop import Agent

    emu = Agent(AgentApi(api.url, api.token, retries=0), [QemuArm64Driver(str(sme2_emulator.path))], arm64_runners,
                name="emu-agent", work_dir=tmp_path / "emu")
    emu.register()
    exp = submit(api, example_pte("toy_cnn").read_bytes(), sme2="both", iterations=2, warmup=0)
    ids = dispatch(api)
    while True:  # a device takes its runs one at a time: claim, run, and dispatch again until none is left
        jobs = [(a, job) for a in (agent, emu) for job in a.api.claim(wait=0)]
        if not jobs:
            break
        for a, job in jobs:
            a.execute(job)
        ids += dispatch(api)
    ingest_all(api, ids, monkeypatch)
    rep = api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()
    ok = [r for r in rep["runs"] if r["status"] == "succeeded"]
    serials = {r["device"]["serial"] for r in ok}
    assert len(serials) == 2 and len(ok) == 3, [(r["device"]["serial"], r["sme2"], r["status"], r["reason"])
                                                for r in rep["runs"]]
    out = tmp_path / "kit"
    assert as_user("artifacts", f"E{exp['id']}", "--kit", "-o", str(out)) == 0, capsys.readouterr().err
    dirs = sorted(p.name for p in (out / "runs").iterdir())
    assert dirs == sorted(f"linux-{s}" for s in serials)
    for name in dirs:
        run_dir = out / "runs" / name
        manifest, summary = _check_kit_dir(run_dir, out)
        mine = [r for r in ok if f"linux-{r['device']['serial']}" == name]
        assert {r["metrics"]["farm_run"] for r in manifest["results"]} == {r["id"] for r in mine}
        assert manifest["device"]["serial"] == mine[0]["device"]["serial"]
        emulated = mine[0]["device"].get("emulator")
        for r in manifest["results"]:
            m = r["metrics"]
            if emulated:
                assert m["latency_ms"] == [] and m["median_ms"] is m["min_ms"] is m["max_ms"] is None
                assert "emulator" in m
            else:
                assert len(m["latency_ms"]) == m["runs"] == 2 and m["median_ms"] > 0
        # each directory's totals are its own device's runs only, as the kit sums them
        for cat, ms in summary["category_totals_ms"].items():
            assert ms == pytest.approx(sum(r["categories_ms"].get(cat, 0.0) for r in mine))
        assert ("emulator" in summary) == bool(emulated)
    assert {r["sme2"] for r in ok if r["device"].get("emulator")} == {"on", "off"}


@pytest.mark.browser
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_labels_an_imported_experiment(api, example_pte, portable_trace, as_user, browser, tmp_path):
    from _fixtures_browser import wait

    real = portable_trace.read_bytes()
    d = _kit_dir_by_hand(tmp_path, example_pte("toy_cnn"), {"mac_sme2_off": real})
    assert as_user("import", str(d), "--no-sme2", "--serial", "my-mac") == 0
    [item] = api.client.get("/experiments", headers=api.auth()).json()["items"]
    browser.get(api.url + "/")
    browser.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", api.token)
    browser.get(api.url + "/#/experiments")
    chip = wait(browser, f'tr[data-id="{item["id"]}"] .chip.imported')
    assert chip.text == "imported" and chip.get_attribute("title") == "imported: measured outside the farm"
    browser.get(f"{api.url}/#/experiments/{item['id']}")
    wait(browser, f'#experiment[data-id="{item["id"]}"]')
    label = wait(browser, ".card.spec .imported")
    assert label.text == "imported: measured outside the farm (kit run directory, device my-mac)"


def test_imported_runs_join_a_suites_series(api, example_pte, portable_trace, as_user, tmp_path, capsys):
    """A user who measures by hand each night imports into the suite holding the model: each import
    is a suite run (trigger 'import') whose runs are a point of the series, like the farm's own."""
    from sme2farm.server.services import suites as suite_service
    from sme2farm.server.store.db import session_scope

    pte = example_pte("toy_cnn")
    real = portable_trace.read_bytes()
    args = ("--no-sme2", "--device-model", "Pixel 9", "--platform", "android", "--serial", "p9")
    first = _kit_dir_by_hand(tmp_path / "n0", pte, {"mac_sme2_off": real})
    assert as_user("import", str(first), *args) == 0  # the model is stored now
    sha = api.client.get("/experiments", headers=api.auth()).json()["items"][0]["model_sha256"]
    register(api)  # a suite is created for devices that can run it: the farm's own x86 host here
    r = api.client.post("/suites", headers=api.auth(), json={"name": "by-hand", "models": [{"sha256": sha, "name": "toy"}],
                                                             "sme2": "off"})
    assert r.status_code == 201, r.text
    from _fixtures_analysis import make_real_trace

    for night in (1, 2):  # each night its own measurement: the same trace twice is refused (409)
        nightly = make_real_trace("zoo", tag=f"night{night}").read_bytes()
        d = _kit_dir_by_hand(tmp_path / f"n{night}", pte, {"mac_sme2_off": nightly})
        capsys.readouterr()
        assert as_user("import", str(d), *args, "--suite", "BY-HAND") == 0, capsys.readouterr().err
        assert "a point of suite by-hand's series" in capsys.readouterr().out
    detail = api.client.get("/suites/by-hand", headers=api.auth()).json()
    runs = detail["runs"]
    assert [x["trigger"] for x in runs] == ["import", "import"], runs
    with session_scope(api.settings.sqlalchemy_url) as s:  # the task the end_run hook asked for (recorded here)
        for x in runs:
            suite_service.analyze(s, suite_run_id=x["id"])
    series = api.client.get("/suites/by-hand/series", headers=api.auth()).json()
    [line] = series["series"]
    assert line["key"]["device_model"] == "Pixel 9" and line["key"]["sme2"] == "off" and len(line["points"]) == 2
    assert line["emulated"] is None
    assert all(p["median_ms"] > 0 for p in line["points"])
    # a suite that does not hold the model, or none of that name: refused, nothing stored
    before = api.client.get("/experiments", headers=api.auth()).json()["total"]
    capsys.readouterr()
    assert as_user("import", str(d), *args, "--suite", "nightly") == 1
    assert "suite: no suite is called 'nightly'" in capsys.readouterr().err
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == before
