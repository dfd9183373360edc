"""Hugging Face's LLM exports in LLM mode: tiny random Llamas exported with optimum-executorch's
xnnpack recipe (runners/hf_llama.py), held out from the bundled hf_llama examples (another seed),
in both position conventions ExecuTorch's LLM runner serves (the default dynamic export feeds
cache_position [S], the static one input_pos-like [1]) and quantized (8da4w, 8da8w). The runner
drives each with --llm_prompt/--llm_decode and says which convention it used; the unquantized
ones decode exactly the eager model's own greedy tokens; the submission detects LLM mode, takes
`--llm prompt=P,decode=D`, and says in its notes which convention it feeds. The unit tests of the
signature rules (conventions, why a decoder-like method runs as a plain model) need no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from sme2farm.analysis import analyze
from sme2farm.analysis.llm import CACHE_POSITIONS, START_POS, llm_signature, not_llm_reason
from sme2farm.analysis.pte import DYNAMIC_BOUND, InputSpec, MethodSignature

from _fixtures_farm import post_experiment
from _fixtures_runtime import export_once, shared_exports_dir
from _helpers_runner import fed_tokens, run_local_runner

HELD_OUT_SEED = 7   # the examples use seed 0
PROMPT, DECODE = 8, 6

KINDS = {"dynamic": {"dynamic": True}, "static": {"dynamic": False},
         "8da4w": {"dynamic": True, "qlinear": "8da4w"}, "8da8w": {"dynamic": True, "qlinear": "8da8w"}}


@pytest.fixture(scope="session")
def hf_export(tmp_path_factory):
    """hf_export(kind) -> Path: a held-out optimum-executorch export, made once per run."""
    pytest.importorskip("optimum.exporters.executorch")
    from sme2farm.runners.hf_llama import export_hf_llama

    out_dir = shared_exports_dir(tmp_path_factory)   # shared by the run's workers and make test's two runs
    made: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in made:
            made[kind] = export_once(out_dir / f"hf-{kind}-seed{HELD_OUT_SEED}.pte", lambda partial: export_hf_llama(
                partial, seed=HELD_OUT_SEED, **KINDS[kind]))
        return made[kind]

    return make


def _sig(*inputs: InputSpec, out=InputSpec("tensor", 6, (1, 63, 256), DYNAMIC_BOUND)) -> MethodSignature:
    return MethodSignature("forward", inputs, (out,))


def test_the_position_convention_is_decided_as_executorchs_runner_decides():
    tokens = InputSpec("tensor", 4, (1, 63), DYNAMIC_BOUND)
    # Hugging Face's default export: cache_position [S], dynamic with the tokens
    assert llm_signature(_sig(tokens, InputSpec("tensor", 4, (63,), DYNAMIC_BOUND))) == (63, True, CACHE_POSITIONS)
    # ExecuTorch's own Llama export: input_pos [1]
    assert llm_signature(_sig(tokens, InputSpec("tensor", 4, (1,)))) == (63, True, START_POS)
    # a static export of one token per call: a declared [1] is the start position
    one = InputSpec("tensor", 4, (1, 1))
    assert llm_signature(_sig(one, InputSpec("tensor", 4, (1,)))) == (1, False, START_POS)
    # static S = 4 with positions [4]
    assert llm_signature(_sig(InputSpec("tensor", 4, (1, 4)), InputSpec("tensor", 4, (4,)))) == (4, False,
                                                                                                 CACHE_POSITIONS)
    # positions neither one nor one per token: no LLM shape, and the reason says so
    odd = _sig(tokens, InputSpec("tensor", 4, (8,)))
    assert llm_signature(odd) is None
    assert "neither hold one start position nor one position per token" in not_llm_reason(odd)


def test_a_decoder_like_method_the_farm_cannot_drive_is_explained():
    tokens = InputSpec("tensor", 4, (1, 16), DYNAMIC_BOUND)
    mask = InputSpec("tensor", 4, (1, 16), DYNAMIC_BOUND)
    three = _sig(tokens, InputSpec("tensor", 4, (16,), DYNAMIC_BOUND), mask)
    reason = not_llm_reason(three)
    assert reason.startswith("method 'forward' looks like a decoder (it takes Long[1, 16] (dynamic, upper bounds)")
    assert "it takes 3 input(s), not two (tokens and positions): it ran as a plain model" in reason
    # inputs sent with a drivable decoder: said too
    drivable = _sig(tokens, InputSpec("tensor", 4, (1,)))
    assert not_llm_reason(drivable) is None
    assert "inputs were sent with it" in not_llm_reason(drivable, has_inputs=True)
    # an image model is no decoder: nothing to explain
    cnn = MethodSignature("forward", (InputSpec("tensor", 6, (1, 3, 32, 32)),), (InputSpec("tensor", 6, (1, 10)),))
    assert not_llm_reason(cnn) is None


@pytest.mark.models
@pytest.mark.parametrize("kind,positions", [("dynamic", "cache_position [S]"), ("static", "input_pos [1]"),
                                            ("8da4w", "cache_position [S]"), ("8da8w", "cache_position [S]")])
def test_hf_exports_run_in_llm_mode_in_their_convention(local_runner, hf_export, tmp_path, kind, positions):
    """Prompt 8 and decode 6 on each held-out export; the unquantized ones decode the eager model's
    own greedy generation token for token, and the trace splits into the phases."""
    from sme2farm.runners.hf_llama import greedy_tokens

    r = run_local_runner(local_runner, tmp_path, f"--model_path={hf_export(kind)}", f"--llm_prompt={PROMPT}",
                         f"--llm_decode={DECODE}", "--num_executions=2", "--etdump_path=t.etdump")
    assert r.returncode == 0, r.stderr
    assert f"LLM positions: {positions}" in r.stdout
    calls = PROMPT if kind == "static" else 1   # the static export takes one token per call
    assert (f"Prefill in {calls} calls of at most 1 tokens" in r.stdout) == (kind == "static")
    fed = fed_tokens(r.stdout)
    assert len(fed) == DECODE
    if kind in ("dynamic", "static"):
        # the runner feeds decode step i the pick after step i-1: the eager generation's first DECODE tokens
        assert fed == greedy_tokens([1] * PROMPT, DECODE, seed=HELD_OUT_SEED)
    llm = analyze((tmp_path / "t.etdump").read_bytes()).to_dict()["llm"]
    assert llm["prompt"] == PROMPT and llm["decode"] == DECODE and llm["iterations"] == 2
    assert not llm["warnings"], llm["warnings"]


@pytest.mark.models
def test_hf_exports_are_submitted_in_llm_mode(api, hf_export):
    """Detected without asking (the dynamic export: min(128, 64/2) prompt, 64/4 decoded), asked
    for with prompt/decode (what `sme2-client submit --llm prompt=P,decode=D` sends), and the
    experiment's notes name the convention; a static export of one token per call too."""
    from _fixtures_farm import register

    register(api)
    dynamic, static = hf_export("dynamic").read_bytes(), hf_export("static").read_bytes()
    r = post_experiment(api, dynamic, {"sme2": "off"})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["llm"] == {"prompt": 32, "decode": 16}
    assert any("cache_position Long[S] (the positions start .. start+S-1)" in w for w in r.json()["warnings"])
    r = post_experiment(api, dynamic, {"sme2": "off", "llm": {"prompt": PROMPT, "decode": DECODE}})
    assert r.status_code == 201 and r.json()["spec"]["llm"] == {"prompt": PROMPT, "decode": DECODE}
    r = post_experiment(api, static, {"sme2": "off", "llm": {"prompt": PROMPT, "decode": DECODE}})
    assert r.status_code == 201 and r.json()["spec"]["llm"] == {"prompt": PROMPT, "decode": DECODE}
    assert any("input_pos Long[1] (the start position)" in w for w in r.json()["warnings"])
    r = post_experiment(api, dynamic, {"sme2": "off", "llm": {"prompt": 60, "decode": 8}})
    assert r.status_code == 422 and "run past the cache: the program holds 64 positions" in r.json()["detail"]
    for q in ("8da4w", "8da8w"):
        r = post_experiment(api, hf_export(q).read_bytes(), {"sme2": "off", "llm": {"prompt": PROMPT,
                                                                                   "decode": DECODE}})
        assert r.status_code == 201 and r.json()["spec"]["llm"] == {"prompt": PROMPT, "decode": DECODE}, q


@pytest.mark.models
@pytest.mark.parametrize("name,positions", [("hf_llama", "cache_position [S]"), ("hf_llama_static", "input_pos [1]")])
def test_the_bundled_hf_examples_run_in_llm_mode(local_runner, example_pte, tmp_path, name, positions):
    """`sme2-client examples hf_llama[_static]`: each convention's example, as the runner drives it."""
    pytest.importorskip("optimum.exporters.executorch")
    from sme2farm.runners.hf_llama import greedy_tokens

    r = run_local_runner(local_runner, tmp_path, f"--model_path={example_pte(name)}", "--llm_prompt=4",
                         "--llm_decode=3")
    assert r.returncode == 0, r.stderr
    assert f"LLM positions: {positions}" in r.stdout
    assert fed_tokens(r.stdout) == greedy_tokens([1] * 4, 3)


def test_examples_lists_the_hf_exports_and_names_what_exporting_them_needs(capsys, monkeypatch, tmp_path):
    import argparse

    from sme2farm.client import examples_cmd

    assert examples_cmd.run(argparse.Namespace(name=None, out=None)) == 0
    listed = capsys.readouterr().out
    assert "hf_llama         Hugging Face's export (optimum-executorch" in listed
    assert "hf_llama_static  the same with disable_dynamic_shapes" in listed
    # without optimum-executorch: one line naming it, nothing exported
    monkeypatch.setattr(examples_cmd, "_importable", lambda m: not m.startswith("optimum"))
    out = tmp_path / "m.pte"
    assert examples_cmd.run(argparse.Namespace(name="hf_llama", out=str(out))) == 1
    err = capsys.readouterr().err
    assert err.startswith("sme2-client: exporting hf_llama needs optimum.exporters.executorch: pip install "
                          "'sme2-farm[hf]' and then optimum-executorch==1.1.0 with --no-deps")
    assert not out.exists()


# --- quantized LLMs on the emulated SME2 CPU: which linears reach SME2, per arm and phase ---------

@pytest.fixture(scope="module")
def emulated_quantized(arm64_runners, sme2_emulator, hf_export, tmp_path_factory):
    """{(qlinear, arm): report} of the held-out 8da8w and 8da4w exports in LLM mode (prompt 8,
    decode 4), cross-built runner on the emulated SME2 CPU, both arms."""
    import dataclasses

    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver
    from sme2farm.analysis.kernel_paths import arch_of

    tmp = tmp_path_factory.mktemp("emu_q")
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    assert dev.sme2 and dev.emulator, dev
    out, run_id = {}, 0
    for q in ("8da8w", "8da4w"):
        for arm in ("off", "on"):
            run_id += 1
            build = arm64_runners.find("linux-arm64", arm)
            build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)))
            work = tmp / f"{q}-{arm}"
            work.mkdir()
            r = driver.execute(dev.serial, Job(run_id=run_id, model_path=hf_export(q), runner=build, threads=1,
                                               iterations=1, warmup=0, timeout_s=600, workdir=work,
                                               llm={"prompt": 8, "decode": 4}))
            assert r.ok, (q, arm, r.reason)
            out[(q, arm)] = analyze(r.etdump_path.read_bytes(), sme2=arm == "on", arch=arch_of(dev.runner_platform)).to_dict()
    return out


def _linears(rep: dict) -> list[dict]:
    return [o for o in rep["operators"] if o["name"].startswith("Fully Connected")]


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.models
def test_emulated_8da8w_linears_take_sme2_in_the_on_arm_only(emulated_quantized):
    on, off = emulated_quantized[("8da8w", "on")], emulated_quantized[("8da8w", "off")]
    assert {o["name"] for o in _linears(on)} == {"Fully Connected (NC, QP8, F32, QC8W) GEMM"}
    assert {o["kernel_path"] for o in _linears(on)} == {"SME2"}
    assert _linears(off) and {o["kernel_path"] for o in _linears(off)} == {"NEON"}
    assert off["kernel_paths"]["coverage"]["share"] == 0
    for phase in ("prefill", "decode"):
        cov_on, cov_off = on["llm"]["kernel_paths"][phase], off["llm"]["kernel_paths"][phase]
        assert "Fully Connected (NC, QP8, F32, QC8W) GEMM" in cov_on["sme2_operators"], phase
        assert cov_on["share"] > 0 and cov_off["share"] == 0 and not cov_off["sme2_operators"]
        assert not [d for d in cov_on["what_would_reach_sme2"] if "QC8W" in d["datatypes"]]


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.models
def test_emulated_8da4w_linears_stay_on_neon_and_the_report_says_what_would_reach_sme2(emulated_quantized):
    for arm in ("on", "off"):
        rep = emulated_quantized[("8da4w", arm)]
        assert {o["name"] for o in _linears(rep)} == {"Fully Connected (NC, QP8, F32, QB4W) GEMM"}, arm
        assert {o["kernel_path"] for o in _linears(rep)} == {"NEON"}, arm
    on = emulated_quantized[("8da4w", "on")]
    for phase in ("prefill", "decode"):
        cov = on["llm"]["kernel_paths"][phase]
        assert "Fully Connected (NC, QP8, F32, QB4W) GEMM" in [d["name"] for d in cov["off_sme2"]], phase
        [qb4w] = [d for d in cov["what_would_reach_sme2"] if d["datatypes"] == "QP8, F32, QB4W"]
        assert "int4 block-quantized weights (QB4W) have no SME2 kernel in this build" in qb4w["sentence"]
        assert "int8 per-channel weights" in qb4w["sentence"] and "(8da8w: QP8, F32, QC8W)" in qb4w["sentence"]
        assert qb4w["source"].startswith("google/XNNPACK src/configs/gemm-config.c at 92a7ad50")


# --- the farm end to end: sme2-client submit --llm prompt=P,decode=D ----------------------------

@pytest.mark.e2e
@pytest.mark.models
@pytest.mark.parametrize("kind,words", [("dynamic", "cache_position Long[S]"), ("static", "input_pos Long[1]")])
def test_farm_runs_hf_exports_in_llm_mode(farm, hf_export, kind, words):
    import json

    done = farm.cli("submit", str(hf_export(kind)), "--sme2", "off", "--iterations", "2", "--warmup", "1",
                    "--llm", "prompt=10,decode=5", "--wait", "--json")
    assert done.returncode == 0, done.stderr + farm.log("agent")
    rep = json.loads(done.stdout)
    assert rep["spec"]["llm"] == {"prompt": 10, "decode": 5}
    [run] = rep["runs"]
    assert run["status"] == "succeeded", run["reason"]
    assert (run["llm"]["prompt"], run["llm"]["decode"], run["llm"]["iterations"]) == (10, 5, 2)
    assert run["llm"]["warnings"] == []
    shown = farm.cli("status", str(rep["id"])).stdout
    assert f"note: LLM mode: method 'forward' takes tokens Long[1, S] and {words}" in shown, shown
    assert "LLM: prompt 10 tokens, decode 5 tokens, 2 generation(s)" in shown, shown


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.e2e
@pytest.mark.models
def test_emulated_farm_says_what_would_take_an_8da4w_llm_to_sme2(emulated_farm, hf_export):
    import json

    done = emulated_farm.cli("submit", str(hf_export("8da4w")), "--sme2", "both", "--iterations", "1",
                             "--warmup", "0", "--llm", "prompt=6,decode=3", "--wait", "--json", timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + emulated_farm.log("agent")
    rep = json.loads(done.stdout)
    runs = {r["sme2"]: r for r in rep["runs"]}
    assert {a: r["status"] for a, r in runs.items()} == {"off": "succeeded", "on": "succeeded"}
    on = runs["on"]["llm"]["kernel_paths"]
    for phase in ("prefill", "decode"):
        assert "Fully Connected (NC, QP8, F32, QB4W) GEMM" in [d["name"] for d in on[phase]["off_sme2"]]
        assert runs["off"]["llm"]["kernel_paths"][phase]["share"] == 0
    shown = emulated_farm.cli("status", str(rep["id"])).stdout
    assert "prefill SME2 coverage" in shown and "decode SME2 coverage" in shown, shown
    assert "int4 block-quantized weights (QB4W) have no SME2 kernel in this build" in shown, shown


def test_the_submission_notes_say_why_a_decoder_runs_as_a_plain_model(monkeypatch):
    """programs.llm_note, what server/api/experiments.py adds to the experiment's notes."""
    from sme2farm.server.services import programs

    tokens = InputSpec("tensor", 4, (1, 16), DYNAMIC_BOUND)
    cases = {
        "three": _sig(tokens, InputSpec("tensor", 4, (16,), DYNAMIC_BOUND), InputSpec("tensor", 4, (1, 16),
                                                                                     DYNAMIC_BOUND)),
        "static4": _sig(InputSpec("tensor", 4, (1, 4)), InputSpec("tensor", 4, (4,))),
        "one_no_cache": _sig(InputSpec("tensor", 4, (1, 1)), InputSpec("tensor", 4, (1,))),
        "cnn": MethodSignature("forward", (InputSpec("tensor", 6, (1, 3, 8, 8)),), (InputSpec("tensor", 6, (1, 10)),)),
    }
    for name, sig in cases.items():
        monkeypatch.setattr(programs, "_read_methods", lambda path, field, sig=sig: {"forward": sig})
        llm = programs.llm_mode(Path("m.pte"), method="forward", llm=None, has_inputs=False)
        assert llm is None, name
        note = programs.llm_note(Path("m.pte"), method="forward", llm=llm, has_inputs=False)
        if name == "cnn":
            assert note is None
            continue
        assert note.endswith("it ran as a plain model (one forward call on the default inputs, no prefill/decode "
                             "split)"), (name, note)
        assert {"three": "it takes 3 input(s), not two",
                "static4": "it takes exactly 4 tokens per call (a static length), so it cannot decode one token at a "
                           "time",
                "one_no_cache": "it takes one token per call and declares no cache length"}[name] in note, note


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.models
def test_emulated_translation_log_proves_which_gemm_kernels_the_quantized_linears_ran(
        arm64_runners, sme2_emulator, hf_export, tmp_path):
    """The emulator's translation log (the microkernels that really executed), the SME2-on arm in LLM
    mode: 8da8w's int8 weights run a KleidiAI SME2 matmul, 8da4w's int4 block weights (qsi4c32) only
    NEON ones."""
    import dataclasses

    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    driver = QemuArm64Driver(str(sme2_emulator.path))
    [dev] = driver.discover()
    names = {}
    for q in ("8da8w", "8da4w"):
        build = arm64_runners.find("linux-arm64", "on", driver.runner_flavour("trace"))
        work = tmp_path / q
        work.mkdir()
        job = Job(run_id=1, model_path=hf_export(q), runner=dataclasses.replace(build, path=str(
            arm64_runners.resolve(build))), threads=1, iterations=1, warmup=0, timeout_s=600, workdir=work,
            mode="trace", llm={"prompt": 4, "decode": 2})
        r = driver.execute(dev.serial, job)
        assert r.ok, r.reason
        kernels = analyze(r.etdump_path.read_bytes(), kernel_log=r.kernel_log_path.read_text()).to_dict()["kernels"]
        assert kernels["status"] == "ok", kernels
        names[q] = [(d["name"], d["isa"]) for ks in kernels["by_kind"].values() for d in ks]
    int8 = [n for n, isa in names["8da8w"] if "matmul" in n and "qsi8cx" in n]
    assert any("sme2" in n for n in int8), names["8da8w"]
    int4 = [(n, isa) for n, isa in names["8da4w"] if "matmul" in n and "qsi4c32" in n]
    assert int4 and all(isa == "NEON" and "sme" not in n for n, isa in int4), names["8da4w"]
