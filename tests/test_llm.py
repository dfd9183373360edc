"""LLM mode: a tiny KV-cache Llama (runners/tiny_llama.py, transformers' random weights) run by the
farm's runner as prefill + decode, its phases read from the ETDump (analysis/llm.py) and checked
against ExecuTorch's own flatcc deserializer on the same trace; ExecuTorch's own Llama export (built
apart from ours) prefilled in several calls or token by token, its logits against ExecuTorch's Python
bindings; the submission's checks (a program without a token input, decode past the cache it declares,
a prompt over one call where it declares none) and the runner's;
and the farm end to end on the host (fp32, fp16) and on the emulated SME2 device (both arms, no
speed verdict; select with -k emulated_sme2)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from sme2farm.analysis import analyze
from sme2farm.analysis.categories import CATEGORIES, NAMED, OTHER, category_of
from sme2farm.analysis.llm import MARKER_DECODE, MARKER_PREFILL
from sme2farm.runners import inputs as containers

from _fixtures_farm import post_experiment
from _helpers_runner import fed_tokens, run_local_runner

pytestmark = pytest.mark.models


def _check_greedy(fed: list[int], logits, prompt: int, margin: float) -> None:
    """Each fed token is the argmax of the reference logits at the position before it (teacher
    forcing on the runner's own tokens), where the reference's top two are more than `margin` apart."""
    for j, token in enumerate(fed):
        row = np.asarray(logits[prompt - 1 + j], dtype=np.float64)
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > margin:
            assert token == int(row.argmax()), (j, token, int(row.argmax()))


@pytest.mark.parametrize("name,atol", [("tiny_llama", 1e-4), ("tiny_llama_fp16", 2e-2)])
def test_runner_prefill_and_decode_give_transformers_logits(local_runner, example_pte, tmp_path, name, atol):
    """Prefill 5 tokens (id 1), decode 3 one at a time, each the greedy pick of the call before:
    the fed tokens are transformers' own argmax, and the last call's logits are those its forward
    gives at position 8 of the same 8 tokens."""
    from sme2farm.runners.tiny_llama import TinyLlamaConfig, reference_logits

    done = run_local_runner(local_runner, tmp_path, f"--model_path={example_pte(name)}", "--llm_prompt=5",
                            "--llm_decode=3", "--num_executions=2", "--warmup=1", "--outputs_file=out.bin")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LLM mode: prompt 5 tokens, decode 3 tokens, at most 64 tokens per call, cache 64 positions" in done.stdout
    fed = fed_tokens(done.stdout)
    assert len(fed) == 3
    [logits] = containers.read((tmp_path / "out.bin").read_bytes(), item="output")
    assert tuple(logits.sizes) == (1, 1, 256)
    got = logits.numpy().reshape(-1).astype(np.float64)
    want = reference_logits(TinyLlamaConfig(), [1] * 5 + fed)[0].double().numpy()
    np.testing.assert_allclose(got, want[-1], atol=atol)
    _check_greedy(fed, want, 5, margin=4 * atol)


@pytest.fixture(scope="module")
def undeclared_llama(tmp_path_factory) -> Path:
    """A tiny Llama (16 tokens per call, a cache of 16) whose program declares no cache length."""
    from sme2farm.runners.tiny_llama import TinyLlamaConfig, export_tiny_llama

    cfg = TinyLlamaConfig(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_seq_len=16)
    return export_tiny_llama(tmp_path_factory.mktemp("undeclared") / "llama.pte", cfg, declare_cache=False)


@pytest.mark.parametrize("name,prompt,decode,chunk", [("executorch_llama", 40, 6, 31),
                                                      ("executorch_llama_static", 12, 4, 1)])
def test_executorchs_own_llama_export_is_prefilled_in_calls_and_decoded(local_runner, example_pte, tmp_path, name,
                                                                        prompt, decode, chunk):
    """ExecuTorch's own Llama and LLM export, built apart from ours: a prompt longer than one call
    takes (31 tokens; 1 for the static export) is prefilled in calls of at most that. The last
    logits equal ExecuTorch's Python bindings making the same calls, and its eager model on the
    whole sequence; the phases equal the flatcc reading of the runner's trace."""
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from sme2farm.runners.examples import executorch_llama_model

    pte = example_pte(name)
    done = run_local_runner(local_runner, tmp_path, f"--model_path={pte}", f"--llm_prompt={prompt}",
                            f"--llm_decode={decode}", "--num_executions=3", "--warmup=1", "--etdump_path=t.etdump",
                            "--outputs_file=out.bin")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"at most {chunk} tokens per call, cache 64 positions" in done.stdout
    assert f"Prefill in {-(-prompt // chunk)} calls of at most {chunk} tokens" in done.stdout

    fed = fed_tokens(done.stdout)
    assert len(fed) == decode
    method = _load_for_executorch(str(pte))
    for pos in range(0, prompt, chunk):
        n = min(chunk, prompt - pos)
        want = method.forward((torch.ones(1, n, dtype=torch.long), torch.tensor([pos], dtype=torch.long)))
    for j, token in enumerate(fed):
        _check_greedy([token], want[0].reshape(1, -1).numpy(), 1, margin=1e-3)   # the bindings' own argmax
        want = method.forward((torch.tensor([[token]], dtype=torch.long),
                               torch.tensor([prompt + j], dtype=torch.long)))
    [got] = containers.read((tmp_path / "out.bin").read_bytes(), item="output")
    assert tuple(got.sizes) == tuple(want[0].shape) == (1, 512)
    got = got.numpy().reshape(-1)
    assert np.isfinite(got).all() and got.std() > 0.1   # real logits, not uninitialised weights' NaN or zeros
    np.testing.assert_allclose(got, want[0].numpy().reshape(-1), rtol=1e-4, atol=1e-5, equal_nan=False)
    # and ExecuTorch's Llama in eager PyTorch, on the whole sequence at once (its last position)
    with torch.no_grad():
        tokens = torch.tensor([[1] * prompt + fed], dtype=torch.long)
        eager = executorch_llama_model()(tokens).reshape(-1).numpy()
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4, equal_nan=False)

    trace = (tmp_path / "t.etdump").read_bytes()
    _check_against_flatcc(analyze(trace).to_dict(), trace, prompt, decode, 3, chunk)


@pytest.mark.parametrize("flags,model,error", [
    (("--llm_prompt=4", "--llm_decode=2"), "toy_cnn",
     "error: LLM mode needs method 'forward' to take tokens Long [1, S] and either input_pos Long [1] or "
     "cache_position Long [S]; it takes Float [1, 3, 32, 32]"),
    (("--llm_prompt=65", "--llm_decode=0"), "tiny_llama",
     "error: a prompt of 65 tokens and 0 decoded run past the cache: the program holds 64 positions"),
    (("--llm_prompt=17", "--llm_decode=1"), "undeclared",
     "error: a prompt of 17 tokens is longer than the 16 tokens method 'forward' takes in one call, and the program "
     "declares no cache length (get_max_context_len) to prefill it in several calls"),
    (("--llm_prompt=60", "--llm_decode=8"), "tiny_llama",
     "error: a prompt of 60 tokens and 8 decoded run past the cache: the program holds 64 positions"),
    (("--llm_prompt=4",), "tiny_llama", "error: --llm_prompt and --llm_decode go together"),
])
def test_runner_refuses_what_llm_mode_cannot_run(local_runner, example_pte, undeclared_llama, tmp_path, flags, model,
                                                 error):
    pte = undeclared_llama if model == "undeclared" else example_pte(model)
    done = run_local_runner(local_runner, tmp_path, f"--model_path={pte}", *flags)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(error), done.stderr[-1000:]


def flatcc_phases(trace: bytes) -> dict:
    """Per call, from ExecuTorch's own flatcc deserializer: the phase marker's name, tokens
    (chain_index) and input_pos (instruction_id), Method::execute ms, and the five categories
    (leaf operators: delegate events and native_call_* kernels; Other = E2E - the named four)."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    calls = []
    for block in deserialize_from_etdump_flatcc(trace).run_data:
        if block.name != "Execute":
            continue
        events = [e.profile_event for e in block.events or [] if e.profile_event is not None]
        [marker] = [e for e in events if e.name in (MARKER_PREFILL, MARKER_DECODE)]
        [e2e] = [(e.end_time - e.start_time) / 1e6 for e in events if e.name == "Method::execute"]
        cats = dict.fromkeys(CATEGORIES, 0.0)
        for e in events:
            if e.delegate_debug_id_str or e.delegate_debug_id_int not in (None, -1):
                name = e.delegate_debug_id_str or str(e.delegate_debug_id_int)
            elif (e.name or "").startswith("native_call_"):
                name = e.name
            else:
                continue
            if category_of(name) != OTHER:
                cats[category_of(name)] += (e.end_time - e.start_time) / 1e6
        cats[OTHER] = e2e - sum(cats[c] for c in NAMED)
        calls.append({"phase": marker.name, "tokens": marker.chain_index, "pos": marker.instruction_id,
                      "e2e": e2e, "categories": cats})
    return {"calls": calls}


def _check_against_flatcc(report: dict, trace: bytes, prompt: int, decode: int, iterations: int,
                          chunk: int | None = None) -> None:
    """The report's LLM figures against the flatcc reading of the same trace; a prompt over `chunk`
    tokens is prefilled in calls of at most `chunk` tokens (input_pos 0, chunk, 2 chunk, ...)."""
    chunk = chunk or prompt
    prefill = [(MARKER_PREFILL, min(chunk, prompt - k), k) for k in range(0, prompt, chunk)]
    calls = flatcc_phases(trace)["calls"]
    per = len(prefill) + decode
    assert len(calls) == iterations * per
    gens = [calls[i * per:(i + 1) * per] for i in range(iterations)]
    for g in gens:
        assert [(c["phase"], c["tokens"], c["pos"]) for c in g] == \
            prefill + [(MARKER_DECODE, 1, prompt + j) for j in range(decode)]
    llm = report["llm"]
    assert (llm["prompt"], llm["decode"], llm["iterations"]) == (prompt, decode, iterations)
    assert llm["warnings"] == []
    np_ = len(prefill)
    ttft = [sum(c["e2e"] for c in g[:np_]) for g in gens]
    prefill_tps = [prompt / (t / 1e3) for t in ttft]
    decode_tps = [decode / (sum(c["e2e"] for c in g[np_:]) / 1e3) for g in gens]
    assert llm["samples"]["ttft_ms"] == pytest.approx(ttft, rel=1e-9)
    assert llm["samples"]["prefill_tokens_per_s"] == pytest.approx(prefill_tps, rel=1e-9)
    assert llm["samples"]["decode_tokens_per_s"] == pytest.approx(decode_tps, rel=1e-9)
    for key, samples in (("ttft_ms", ttft), ("prefill_tokens_per_s", prefill_tps), ("decode_tokens_per_s", decode_tps)):
        v = llm[key]
        assert v["median"] == pytest.approx(float(np.median(samples)), rel=1e-9)
        assert v["ci_low"] <= v["median"] <= v["ci_high"] and v["n"] == iterations
    for c in CATEGORIES:
        pre = [sum(x["categories"][c] for x in g[:np_]) for g in gens]
        dec = [sum(x["categories"][c] for x in g[np_:]) / decode for g in gens]
        assert llm["categories"]["prefill"]["ms"][c] == pytest.approx(np.mean(pre), rel=1e-9, abs=1e-9), c
        assert llm["categories"]["decode"]["ms"][c] == pytest.approx(np.mean(dec), rel=1e-9, abs=1e-9), c
    # the run's own E2E is per generation: the prefill and its decode calls
    assert report["e2e_ms"]["n"] == iterations
    assert report["e2e_ms"]["mean"] == pytest.approx(np.mean([sum(c["e2e"] for c in g) for g in gens]), rel=1e-9)
    assert llm["categories"]["prefill"]["ms"]["GEMM"] > 0 and llm["categories"]["decode"]["ms"]["GEMM"] > 0


def test_phases_match_executorchs_flatcc_deserializer(local_runner, example_pte, tmp_path):
    done = run_local_runner(local_runner, tmp_path, f"--model_path={example_pte('tiny_llama')}", "--llm_prompt=12",
                            "--llm_decode=5", "--num_executions=4", "--warmup=1", "--etdump_path=t.etdump")
    assert done.returncode == 0, done.stderr[-2000:]
    trace = (tmp_path / "t.etdump").read_bytes()
    _check_against_flatcc(analyze(trace).to_dict(), trace, 12, 5, 4)


def test_a_trace_without_markers_has_no_llm_section(local_runner, example_pte, tmp_path):
    done = run_local_runner(local_runner, tmp_path, f"--model_path={example_pte('toy_cnn')}", "--num_executions=2",
                            "--etdump_path=t.etdump")
    assert done.returncode == 0, done.stderr[-2000:]
    report = analyze((tmp_path / "t.etdump").read_bytes()).to_dict()
    assert report["llm"] is None and report["n_iterations"] == 2


def test_a_build_without_llm_mode_fails_the_run_naming_it(local_runner, example_pte, tmp_path):
    import dataclasses

    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.local import LocalDriver

    catalog, build = local_runner
    old = dataclasses.replace(build, path=str(catalog.resolve(build)), supports_llm=False)
    job = Job(run_id=1, model_path=example_pte("tiny_llama"), runner=old, threads=1, iterations=1, warmup=0,
              timeout_s=60, workdir=tmp_path, llm={"prompt": 4, "decode": 2})
    assert ["--llm_prompt=4", "--llm_decode=2"] == [a for a in job.runner_args if a.startswith("--llm")]
    [dev] = LocalDriver().discover()
    result = LocalDriver().execute(dev.serial, job)
    assert not result.ok
    assert result.reason == (f"runner {old.id} (local-build) has no LLM mode (prefill and decode); register a build of "
                             "runners/runner.cpp for this platform")


# ---- submission: detected, checked, refused -----------------------------------------------------


def test_submission_detects_llm_mode_and_refuses_what_cannot_run(api, example_pte, undeclared_llama):
    from _fixtures_farm import register

    register(api)
    llama, cnn = example_pte("tiny_llama").read_bytes(), example_pte("toy_cnn").read_bytes()
    r = post_experiment(api, llama, {"sme2": "off"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["llm"] == {"prompt": 32, "decode": 16}  # min(128, 64/2), min(64, 64/4)
    r = post_experiment(api, llama, {"sme2": "off", "llm": {"prompt": 20, "decode": 3}})
    assert r.status_code == 201 and r.json()["spec"]["llm"] == {"prompt": 20, "decode": 3}
    r = post_experiment(api, cnn, {"sme2": "off"})
    assert r.status_code == 201 and r.json()["spec"]["llm"] is None
    r = post_experiment(api, cnn, {"sme2": "off", "llm": {"prompt": 8, "decode": 2}})
    assert r.status_code == 422
    assert r.json()["detail"] == ("spec.llm: LLM mode needs method 'forward' to take tokens Long[1, S] and either "
                                  "input_pos Long[1] or cache_position Long[S]; it takes Float[1, 3, 32, 32]")
    r = post_experiment(api, llama, {"sme2": "off", "llm": {"prompt": 65, "decode": 0}})
    assert r.status_code == 422
    assert r.json()["detail"] == ("spec.llm: a prompt of 65 tokens and 0 decoded run past the cache: the program "
                                  "holds 64 positions (prompt + decode must be at most that)")
    r = post_experiment(api, llama, {"sme2": "off", "llm": {"prompt": 60, "decode": 8}})
    assert r.status_code == 422 and "a prompt of 60 tokens and 8 decoded run past the cache" in r.json()["detail"]
    undeclared = undeclared_llama.read_bytes()
    r = post_experiment(api, undeclared, {"sme2": "off", "llm": {"prompt": 17, "decode": 1}})
    assert r.status_code == 422
    assert r.json()["detail"] == ("spec.llm.prompt: a prompt of 17 tokens is longer than the 16 tokens method "
                                  "'forward' takes in one call, and the program declares no cache length "
                                  "(get_max_context_len) to prefill it in several calls")
    r = post_experiment(api, llama, {"sme2": "off", "llm": {"prompt": 0, "decode": 1}})
    assert r.status_code == 422 and "spec.llm.prompt" in r.json()["detail"]
    buf = io.BytesIO()
    np.savez(buf, **{"0": np.ones((1, 4), dtype=np.int64), "1": np.zeros(1, dtype=np.int64)})
    r = post_experiment(api, llama, {"sme2": "off", "llm": {"prompt": 4, "decode": 1}}, inputs=buf.getvalue())
    assert r.status_code == 422
    assert r.json()["detail"] == ("spec.llm: LLM mode feeds the tokens itself: send no inputs (.npz or .bpte) with "
                                  "spec.llm")
    # ExecuTorch's own export: a prompt of one call's 31 tokens, or token by token where a call takes
    # one; a prompt over one call is prefilled in several, within the declared cache of 64
    for name, want in (("executorch_llama", {"prompt": 31, "decode": 16}),
                       ("executorch_llama_static", {"prompt": 32, "decode": 16})):
        r = post_experiment(api, example_pte(name).read_bytes(), {"sme2": "off"})
        assert r.status_code == 201 and r.json()["spec"]["llm"] == want, (name, r.text)
    r = post_experiment(api, example_pte("executorch_llama").read_bytes(),
                        {"sme2": "off", "llm": {"prompt": 50, "decode": 14}})
    assert r.status_code == 201 and r.json()["spec"]["llm"] == {"prompt": 50, "decode": 14}
    r = post_experiment(api, example_pte("executorch_llama_static").read_bytes(),
                        {"sme2": "off", "llm": {"prompt": 50, "decode": 15}})
    assert r.status_code == 422 and "a prompt of 50 tokens and 15 decoded run past the cache: the program holds 64" \
        in r.text
    # nothing of the refused submissions was stored
    listed = api.client.get("/experiments", headers=api.auth()).json()
    assert listed["total"] == 6


@pytest.mark.parametrize("cache,llm,want", [
    (1, None, None),                                  # no room for a prompt and a token: a plain program
    (0, None, {"prompt": 4, "decode": 2}),            # a declared 0 is no declaration: S = 8 counts
    (3, None, {"prompt": 1, "decode": 1}),
    (3, {"prompt": 2, "decode": 1}, {"prompt": 2, "decode": 1}),
    (3, {"prompt": 3, "decode": 1}, "a prompt of 3 tokens and 1 decoded run past the cache: the program holds 3"),
])
def test_llm_mode_follows_the_declared_cache_however_small(monkeypatch, cache, llm, want):
    """What the constant methods declare decides; a cache with no room is no LLM mode, not a 500."""
    from sme2farm.analysis.pte import DYNAMIC_BOUND, InputSpec, MethodSignature
    from sme2farm.protocol import LlmSpec
    from sme2farm.server.services import programs

    methods = {"forward": MethodSignature("forward", (InputSpec("tensor", 4, (1, 8), DYNAMIC_BOUND),
                                                      InputSpec("tensor", 4, (1,)))),
               "get_max_context_len": MethodSignature("get_max_context_len", (), (InputSpec("int", value=cache),))}
    monkeypatch.setattr(programs, "_read_methods", lambda path, field: methods)
    ask = LlmSpec(**llm) if llm else None
    if isinstance(want, str):
        with pytest.raises(programs.InvalidInputs, match=want):
            programs.llm_mode(Path("m.pte"), method="forward", llm=ask, has_inputs=False)
        return
    got = programs.llm_mode(Path("m.pte"), method="forward", llm=ask, has_inputs=False)
    assert (got.model_dump() if got else None) == want


def test_a_suite_runs_an_llm_in_the_mode_its_upload_got(api, example_pte):
    from _fixtures_farm import register

    register(api)
    llm = {"prompt": 10, "decode": 4}
    up = post_experiment(api, example_pte("tiny_llama").read_bytes(), {"sme2": "off", "llm": llm})
    cnn = post_experiment(api, example_pte("toy_cnn").read_bytes(), {"sme2": "off"})
    assert up.status_code == 201 and cnn.status_code == 201
    models = [{"sha256": up.json()["model_sha256"], "name": "llama"},
              {"sha256": cnn.json()["model_sha256"], "name": "cnn"}]
    r = api.client.post("/suites", json={"name": "nightly-llm", "models": models, "sme2": "off", "iterations": 5,
                                         "schedule": "0 3 * * *"}, headers=api.auth())
    assert r.status_code == 201, r.text
    started = api.client.post("/suites/nightly-llm/run", headers=api.auth())
    assert started.status_code in (200, 201, 202), started.text
    [srun] = api.client.get("/suites/nightly-llm", headers=api.auth()).json()["runs"]
    specs = {}
    for eid in srun["experiment_ids"]:
        rep = api.client.get(f"/experiments/{eid}", headers=api.auth()).json()
        specs[rep["model_sha256"]] = rep["spec"]["llm"]
    assert specs == {models[0]["sha256"]: llm, models[1]["sha256"]: None}


def test_cli_llm_flag_is_checked_before_anything_is_sent():
    from sme2farm.client.cli import parse_llm

    assert parse_llm("prompt=128,decode=64").model_dump() == {"prompt": 128, "decode": 64}
    for bad, why in (("prompt=12", "needs both"), ("prompt=a,decode=1", "whole number"), ("tokens=3", "takes prompt")):
        with pytest.raises(ValueError, match=why):
            parse_llm(bad)


# ---- the farm, end to end -----------------------------------------------------------------------


def _artifact(farm, run_id: int, name: str) -> bytes:
    import httpx

    r = httpx.get(f"{farm.url}/runs/{run_id}/artifacts/{name}", headers={"Authorization": f"Bearer {farm.token}"},
                  timeout=30)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.e2e
@pytest.mark.parametrize("name,prompt,decode,chunk", [("tiny_llama", 16, 8, None), ("tiny_llama_fp16", 16, 8, None),
                                                      ("executorch_llama_static", 12, 4, 1)])
def test_farm_runs_the_tiny_llama_and_reports_its_phases(farm, example_pte, name, prompt, decode, chunk):
    done = farm.cli("submit", str(example_pte(name)), "--sme2", "off", "--iterations", "3", "--warmup", "1",
                    "--llm", f"prompt={prompt},decode={decode}", "--wait", "--json")
    assert done.returncode == 0, done.stderr + farm.log("agent")
    rep = json.loads(done.stdout)
    assert rep["spec"]["llm"] == {"prompt": prompt, "decode": decode}
    [run] = rep["runs"]
    assert run["status"] == "succeeded", run["reason"]
    report = json.loads(_artifact(farm, run["id"], "report.json"))
    _check_against_flatcc(report, _artifact(farm, run["id"], "trace.etdump"), prompt, decode, 3, chunk)
    assert run["llm"]["prefill_tokens_per_s"]["median"] == report["llm"]["prefill_tokens_per_s"]["median"]
    assert run["memory"]["peak_rss_bytes"] > 0
    shown = farm.cli("status", str(rep["id"]))
    assert f"LLM: prompt {prompt} tokens, decode {decode} tokens, 3 generation(s)" in shown.stdout, shown.stdout
    assert "decode categories (ms per token)" in shown.stdout
    print(f"{name}: TTFT {run['llm']['ttft_ms']['median']:.3f} ms, prefill "
          f"{run['llm']['prefill_tokens_per_s']['median']:.0f} tok/s, decode "
          f"{run['llm']['decode_tokens_per_s']['median']:.0f} tok/s")


# ---- the emulated SME2 device: both arms, no speed verdict --------------------------------------


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.e2e
def test_emulated_sme2_llm_both_arms_complete_without_a_speed_verdict(emulated_farm, tmp_path):
    from sme2farm.runners.tiny_llama import TinyLlamaConfig, export_tiny_llama

    cfg = TinyLlamaConfig(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_seq_len=16)
    pte = export_tiny_llama(tmp_path / "emu_llama.pte", cfg)
    done = emulated_farm.cli("submit", str(pte), "--sme2", "both", "--iterations", "2", "--warmup", "0",
                             "--llm", "prompt=6,decode=3", "--wait", "--json", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + emulated_farm.log("agent")
    rep = json.loads(done.stdout)
    runs = {r["sme2"]: r for r in rep["runs"]}
    assert set(runs) == {"off", "on"}
    for arm, run in runs.items():
        assert run["status"] == "succeeded", (arm, run["reason"])
        assert run["device"]["emulator"]
        llm = run["llm"]
        assert (llm["prompt"], llm["decode"], llm["iterations"]) == (6, 3, 2) and llm["warnings"] == []
        assert llm["decode_tokens_per_s"]["median"] > 0
        assert run["memory"]["peak_rss_bytes"] > 0  # the emulator process's own
    [c] = [c for c in rep["comparisons"] if c["kind"] == "sme2"]
    assert c["emulated"] is True and c["verdict"] == "emulated" and c["speedup"] is None
    assert not c.get("llm")  # no per-phase speed figure either
    shown = emulated_farm.cli("status", str(rep["id"]))
    assert "LLM (emulated: the emulator's time, not a CPU's): prompt 6 tokens" in shown.stdout, shown.stdout


# ---- the verdict per phase ------------------------------------------------------------------------


def _llm_report(rng, ttft_ms: float, decode_tps: float, n: int = 10, decode: int = 8) -> dict:
    ttft = ttft_ms * (1 + 0.01 * rng.standard_normal(n))
    tps = decode_tps * (1 + 0.01 * rng.standard_normal(n))
    e2e = ttft + decode * 1e3 / tps
    return {"iterations_ms": [float(x) for x in e2e], "e2e_ms": {"median": float(np.median(e2e))},
            "llm": {"samples": {"ttft_ms": [float(x) for x in ttft], "prefill_tokens_per_s": [16e3 / x for x in ttft],
                                "decode_tokens_per_s": [float(x) for x in tps]}}}


def test_compare_gives_each_phase_its_own_verdict():
    """The candidate prefills twice as fast and decodes at the same speed: the prefill verdict is a
    2x speedup with its interval, the decode one claims nothing, and the comparison's text says both."""
    from sme2farm.analysis import compare
    from sme2farm.analysis.wording import comparison_fact_lines

    rng = np.random.default_rng(3)
    base = [_llm_report(rng, 1.0, 1000) for _ in range(3)]
    cand = [_llm_report(rng, 0.5, 1000) for _ in range(3)]
    phases = compare(base, cand)["llm"]
    pre, dec = phases["prefill"], phases["decode"]
    assert pre["verdict"] == "speedup" and pre["ci_low"] < 2.0 < pre["ci_high"] and pre["ci_low"] > 1.5
    assert pre["baseline_ms"] == pytest.approx(1.0, rel=0.02) and pre["candidate_ms"] == pytest.approx(0.5, rel=0.02)
    assert dec["verdict"] not in ("speedup", "slowdown") and dec["ci_low"] < 1.0 < dec["ci_high"]
    assert dec["metric"] == "ms per decoded token"
    lines = comparison_fact_lines(compare(base, cand))
    assert any(line.startswith("prefill (time to first token): SME2 on is 2.00x faster") for line in lines), lines
    # runs that are not LLM runs get no phase verdict
    plain = [{k: v for k, v in r.items() if k != "llm"} for r in base]
    assert compare(plain, plain)["llm"] is None
