"""Compare anything: `submit A.pte --vs B.pte` (two models interleaved in one experiment, per SME2
arm), `sme2-client compare BASE CAND` / GET /comparisons (any two experiments or runs, matched by
device model, SME2 arm, threads and mode), and the device noise model those verdicts use, learned
from the identical work experiments do. On the real farm (runner, ETDump, ingest), and the API's
bad-input answers on SQLite and PostgreSQL. Only the farm's tests are marked e2e: the others run in
`make test`'s parallel run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _fixtures_farm import register

VERDICTS = {"speedup", "slowdown", "no significant difference", "insufficient data"}


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.e2e
def test_vs_interleaves_two_models_and_tells_a_large_difference_apart(farm, example_pte):
    # the small model test_runner exports and the heavy one test_device_lost and test_runner_memory do
    # (one export each per run): hundreds of times the work
    small, big = example_pte("cnn_blocks", blocks=2), example_pte("cnn_blocks", blocks=20, channels=64, size=32)
    rep = _json(farm.cli("submit", str(small), "--vs", str(big), "--sme2", "off", "--sessions", "2",
                         "--iterations", "15", "--min-effect", "0.05", "--wait", "--json"))
    assert rep["vs_model_sha256"] and rep["vs_model_sha256"] != rep["model_sha256"]
    runs = sorted(rep["runs"], key=lambda r: r["id"])
    assert [r["variant"] for r in runs] == ["A", "B", "B", "A"]  # interleaved A B B A
    assert all(r["status"] == "succeeded" for r in runs), [r["reason"] for r in runs]
    # each variant ran its own model: 20 residual blocks of 64 channels on 32x32 take longer than 2 of 16 on 16x16
    med = {v: sorted(r["e2e_ms"]["median"] for r in runs if r["variant"] == v) for v in "AB"}
    assert min(med["B"]) > 3 * max(med["A"])
    [cmp] = [c for c in rep["comparisons"] if c["kind"] == "model"]
    assert cmp["status"] == "complete" and cmp["sme2"] == "off" and cmp["labels"] == ["model A", "model B"]
    assert cmp["sessions"] == [2, 2] and cmp["a_a"] is False and cmp["min_effect"] == 0.05
    # baseline A is the small model: B is slower, and with a ratio this large the verdict is sure
    assert cmp["verdict"] == "slowdown" and cmp["ci_high"] < 1.0 and cmp["speedup"] < 0.34
    assert "Convolution" in cmp["categories"] and cmp["operators"]
    assert not [c for c in rep["comparisons"] if c["kind"] == "sme2"]  # --sme2 off: no SME2 pair
    # the text report names the models and the verdict
    text = farm.cli("status", str(rep["id"]))
    assert text.returncode == 0 and "model A vs model B, SME2 off" in text.stdout and "slowdown" in text.stdout
    assert "model B, SME2 off" in text.stdout


@pytest.mark.e2e
def test_a_model_against_itself_teaches_the_device_noise_model(farm, example_pte):
    pte = example_pte("toy_cnn")
    rep = _json(farm.cli("submit", str(pte), "--vs", str(pte), "--sme2", "off", "--sessions", "2",
                         "--iterations", "20", "--wait", "--json"))
    assert rep["vs_model_sha256"] == rep["model_sha256"]
    [cmp] = [c for c in rep["comparisons"] if c["kind"] == "model"]
    assert cmp["a_a"] is True and cmp["verdict"] in VERDICTS
    assert cmp["ci_low"] is None or cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]
    # 4 identical runs of one device: the next verdict on that device uses a learned noise model
    nxt = _json(farm.cli("submit", str(pte), "--vs", str(pte), "--sme2", "off", "--iterations", "20", "--wait", "--json"))
    [cmp2] = [c for c in nxt["comparisons"] if c["kind"] == "model"]
    assert cmp2["noise"]["source"] == "learned", cmp2["noise"]
    assert cmp2["sentence"]


@pytest.mark.e2e
def test_compare_two_experiments_and_runs_matched_or_explained(farm, example_pte):
    pte = example_pte("toy_cnn")
    base = _json(farm.cli("submit", str(pte), "--sme2", "off", "--iterations", "20", "--name", "cmp-base", "--wait", "--json"))
    cand = _json(farm.cli("submit", str(pte), "--sme2", "off", "--iterations", "20", "--wait", "--json"))
    out = _json(farm.cli("compare", f"E{base['id']}", f"E{cand['id']}", "--json"))
    assert out["baseline"] == {**out["baseline"], "kind": "experiment", "id": base["id"], "name": "cmp-base"}
    [c] = out["comparisons"]
    assert c["status"] == "complete" and c["sme2"] == "off" and c["threads"] == 1 and c["mode"] == "timing"
    assert c["baseline_runs"] == [base["runs"][0]["id"]] and c["candidate_runs"] == [cand["runs"][0]["id"]]
    assert c["verdict"] in VERDICTS and c["sentence"]
    assert any("same model" in n for n in out["notes"])
    assert c["min_effect"] == 0.02
    wide = _json(farm.cli("compare", f"E{base['id']}", f"E{cand['id']}", "--min-effect", "0.5", "--json"))
    assert wide["comparisons"][0]["min_effect"] == 0.5 and wide["comparisons"][0]["verdict"] != "speedup"
    # the SME2-on arm of the base was unschedulable here: matched on neither side, not an error
    assert out["unmatched"] == []
    # runs by id
    runs = _json(farm.cli("compare", f"R{base['runs'][0]['id']}", f"r{cand['runs'][0]['id']}", "--json"))
    assert runs["baseline"]["kind"] == "run" and len(runs["comparisons"]) == 1
    text = farm.cli("compare", f"E{base['id']}", f"E{cand['id']}")
    assert text.returncode == 0 and "SME2 off, 1 thread(s), timing" in text.stdout

    # incomparable: another thread count -> 422 naming what differs; unknown ids -> 404; junk -> 422
    two = _json(farm.cli("submit", str(pte), "--sme2", "off", "--threads", "2", "--iterations", "5", "--wait", "--json"))
    bad = farm.cli("compare", f"E{base['id']}", f"E{two['id']}")
    assert bad.returncode == 1 and "422" in bad.stderr and "threads 1 vs 2" in bad.stderr
    missing = farm.cli("compare", f"E{base['id']}", "E999999")
    assert missing.returncode == 1 and "404" in missing.stderr and "candidate: experiment 999999 not found" in missing.stderr
    junk = farm.cli("compare", "x12", f"E{base['id']}")
    assert junk.returncode == 1 and "422" in junk.stderr and "baseline" in junk.stderr
    same = farm.cli("compare", f"E{base['id']}", f"e{base['id']}")
    assert same.returncode == 1 and "422" in same.stderr and f"share run(s) {base['runs'][0]['id']}" in same.stderr
    overlap = farm.cli("compare", f"E{base['id']}", f"R{base['runs'][0]['id']}")  # a run inside the experiment
    assert overlap.returncode == 1 and "422" in overlap.stderr and "share run(s)" in overlap.stderr
    no_b = farm.cli("compare", f"E{base['id']}/B", f"E{cand['id']}")
    assert no_b.returncode == 1 and "no vs_model" in no_b.stderr


@pytest.mark.parametrize("vs_body,spec,needle", [
    (b"not a program at all, long enough to be read", {"sme2": "off"}, "vs_model: not an ExecuTorch program"),
    (None, {"sme2": "off", "method": "forward"}, None),  # control: the same request with a real program succeeds
])
def test_bad_vs_model_is_a_4xx_and_stores_nothing(api, example_pte, vs_body, spec, needle):
    register(api)
    pte = example_pte("toy_cnn").read_bytes()
    files = {"model": ("a.pte", pte, "application/octet-stream"),
             "vs_model": ("b.pte", vs_body or example_pte("mlp").read_bytes(), "application/octet-stream")}
    r = api.client.post("/experiments", files=files, data={"spec": json.dumps(spec)}, headers=api.auth())
    tmp_files = [p for p in (api.settings.data_dir / "tmp").rglob("*") if p.is_file()]
    models = [p for p in (api.settings.data_dir / "models").rglob("*") if p.is_file()]
    assert not tmp_files
    if needle is None:
        assert r.status_code == 201, r.text
        assert len(models) == 2
        return
    assert r.status_code == 422 and needle in r.json()["detail"], r.text
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 0
    assert not models


def test_vs_fans_out_both_models_per_arm_and_counts_them_against_the_bound(api, example_pte):
    register(api)
    a, b = example_pte("toy_cnn").read_bytes(), example_pte("mlp").read_bytes()
    files = {"model": ("a.pte", a, "application/octet-stream"), "vs_model": ("b.pte", b, "application/octet-stream")}
    r = api.client.post("/experiments", files=files, data={"spec": json.dumps({"sme2": "both", "sessions": 2})},
                        headers=api.auth())
    assert r.status_code == 201, r.text
    rep = r.json()
    order = [(x["session"], x["sme2"], x["variant"]) for x in sorted(rep["runs"], key=lambda x: x["id"])]
    assert order == [(0, "off", "A"), (0, "off", "B"), (0, "on", "A"), (0, "on", "B"),
                     (1, "on", "B"), (1, "on", "A"), (1, "off", "B"), (1, "off", "A")]
    assert rep["vs_model_size"] == len(b)
    # the per-experiment run bound counts both models
    api.settings.max_runs_per_experiment = 4
    r = api.client.post("/experiments", files=files, data={"spec": json.dumps({"sme2": "off", "sessions": 3})},
                        headers=api.auth())
    assert r.status_code == 422 and "2 models (--vs)" in r.json()["detail"]


def test_a_young_device_noise_model_starts_from_the_default_prior(tmp_path):
    """Three calm A/A pairs must not shrink the device's sigma to ~1%: the first learning pools
    them with the default prior (10%, 4 pairs), so a later 30% jump of a two-state host is not
    called a difference. Later learning pools with what is stored."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from sme2farm.analysis.noise import DEFAULT_DF, DEFAULT_SIGMA_BETWEEN
    from sme2farm.server.store.models import Agent, Base, Device
    from sme2farm.server.services import noise

    engine = create_engine(f"sqlite:///{tmp_path / 'n.db'}")
    Base.metadata.create_all(engine)
    rng = np.random.default_rng(3)

    def report(level: float) -> dict:
        return {"iterations_ms": list(level * np.exp(rng.normal(0, 0.01, 40)))}

    with Session(engine) as s:
        s.add(Agent(id=1, name="a"))
        s.add(Device(id=1, agent_id=1, serial="host", platform="linux"))
        s.flush()
        assert noise.for_device(s, device_id=1).source == "default"
        calm = [[report(1.0), report(1.0)] for _ in range(3)]
        m = noise.learn(s, device_id=1, groups=calm)
        assert m.source == "learned" and m.n_pairs == 3 and m.df == DEFAULT_DF + 3
        assert 0.07 < m.sigma_between < DEFAULT_SIGMA_BETWEEN  # mostly the prior, a little less
        assert noise.for_device(s, device_id=1).to_dict() == m.to_dict()  # stored on the device
        m2 = noise.learn(s, device_id=1, groups=[[report(1.0), report(1.0)] for _ in range(20)])
        assert m2.df == DEFAULT_DF + 23 and m2.sigma_between < m.sigma_between
        assert noise.learn(s, device_id=1, groups=[[report(1.0)]]) is None  # a lone run teaches nothing
        assert noise.for_devices(s, device_ids={1}).to_dict() == m2.to_dict()


def test_a_device_learns_a_metric_it_has_not_seen_from_the_prior_and_keeps_the_others(tmp_path):
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from sme2farm.analysis.noise import DEFAULT_DF
    from sme2farm.server.store.models import Agent, Base, Device
    from sme2farm.server.services import noise

    engine = create_engine(f"sqlite:///{tmp_path / 'n.db'}")
    Base.metadata.create_all(engine)
    rng = np.random.default_rng(5)

    def report(op: str) -> dict:
        it = 0.05 * np.exp(rng.normal(0, 0.01, 30))
        return {"iterations_ms": list(it), "operator_iterations_ms": {op: list(it * 0.5)}}

    with Session(engine) as s:
        s.add(Agent(id=1, name="a"))
        s.add(Device(id=1, agent_id=1, serial="host", platform="linux"))
        s.flush()
        first = noise.learn(s, device_id=1, groups=[[report("conv_x"), report("conv_x")] for _ in range(10)])
        assert first.metrics["conv_x"]["df"] == DEFAULT_DF + 10        # a new metric starts from the prior
        later = noise.learn(s, device_id=1, groups=[[report("gemm_y"), report("gemm_y")] for _ in range(10)])
        assert later.metrics["conv_x"] == first.metrics["conv_x"]    # another model's runs leave it alone
        assert later.metrics["gemm_y"]["df"] == DEFAULT_DF + 10
        # runs on two different devices: the default prior, not a pool of the two
        s.add(Device(id=2, agent_id=1, serial="host2", platform="linux"))
        s.flush()
        assert noise.for_devices(s, device_ids={1, 2}).source == "default"
