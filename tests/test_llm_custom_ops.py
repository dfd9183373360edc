"""ExecuTorch's LLM custom ops (llama::custom_sdpa.out, llama::update_cache.out): the recipe builds
them into its runners (the CMake option, checked in the generated arguments: no ExecuTorch
checkout here), a trace that holds them puts their time under what they are (attention: GEMM; the
KV-cache update: Data Movement), never Other, and the wheel runner's refusal of such an export says
which export flags give a program it runs and which build runs this one."""

from __future__ import annotations

import subprocess

import pytest

from sme2farm.analysis import analyze
from sme2farm.analysis.categories import DATA, GEMM, OTHER, category_of
from sme2farm.runners.recipe import LLM_CUSTOM_OPS_OPTION, plan


def test_every_recipe_variant_builds_the_llm_custom_ops_in(tmp_path):
    src = tmp_path / "executorch"
    (src / "examples/portable/executor_runner").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(executorch)\n")
    for platform in ("linux-arm64", "macos-arm64"):
        plans = plan(src, platform)
        assert len(plans) == 4
        for p in plans:
            defines = dict(a[2:].split("=", 1) for a in p.configure if a.startswith("-D"))
            # the option that adds extension/llm/custom_ops and links it into executor_runner
            assert defines["EXECUTORCH_BUILD_KERNELS_LLM"] == "ON"
            assert defines["EXECUTORCH_BUILD_KERNELS_OPTIMIZED"] == "ON"  # which it requires
            assert p.configure.count(LLM_CUSTOM_OPS_OPTION) == 1


def test_custom_op_names_are_categorised_by_what_they_are():
    assert category_of("llama::custom_sdpa.out") == GEMM
    assert category_of("llama::sdpa_with_kv_cache.out") == GEMM
    assert category_of("llama::update_cache.out") == DATA
    assert category_of("llama::some_future_op.out") == OTHER
    assert category_of("native_call_update_cache.out") == OTHER  # not ours to guess without the namespace


def test_a_trace_with_custom_ops_reports_attention_and_the_cache_update(etdump_builder):
    """The kernel event inside OPERATOR_CALL is the operator (its wrapper is not counted twice), and
    its hint says what it is."""
    p = etdump_builder.prof
    events = [p("llama::update_cache.out", 1_100, 2_000, instruction_id=1),
              p("OPERATOR_CALL", 1_000, 2_300, instruction_id=1),
              p("llama::custom_sdpa.out", 3_600, 6_000, instruction_id=2),
              p("OPERATOR_CALL", 3_500, 6_300, instruction_id=2),
              p("Method::execute", 0, 12_000)]
    rep = analyze(etdump_builder.build([("Execute", events)])).to_dict()
    ops = {o["name"]: o for o in rep["operators"]}
    assert set(ops) == {"llama::update_cache.out", "llama::custom_sdpa.out"}
    assert ops["llama::custom_sdpa.out"]["category"] == GEMM
    assert ops["llama::custom_sdpa.out"]["kernel_hint"].startswith("attention: scaled dot-product")
    assert ops["llama::update_cache.out"]["category"] == DATA
    assert ops["llama::update_cache.out"]["kernel_hint"].startswith("KV-cache update")
    assert rep["categories_ms"][GEMM] == pytest.approx(0.006)
    assert rep["categories_ms"][DATA] == pytest.approx(0.002)
    assert rep["categories_ms"][OTHER] == pytest.approx(0.004)


@pytest.mark.models
def test_the_wheel_runner_refuses_a_custom_op_export_naming_the_flags_and_the_build(local_runner, tmp_path):
    """ExecuTorch's own Llama exported with --use_sdpa_with_kv_cache (its custom ops, loaded from
    the wheel's custom_ops_aot_lib at export time)."""
    pytest.importorskip("executorch.extension.llm.custom_ops")
    import json

    import torch
    from executorch.examples.models.llama.export_llama_lib import export_llama
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    from sme2farm.runners.examples import EXECUTORCH_LLAMA_PARAMS, executorch_llama_model

    params, checkpoint = tmp_path / "params.json", tmp_path / "model.pth"
    params.write_text(json.dumps(EXECUTORCH_LLAMA_PARAMS))
    torch.save(executorch_llama_model().state_dict(), checkpoint)
    config = LlmConfig()
    config.base.params, config.base.checkpoint = str(params), str(checkpoint)
    config.model.use_kv_cache = True
    config.model.use_sdpa_with_kv_cache = True
    config.export.max_seq_length, config.export.max_context_length = 16, 32
    config.export.output_dir = str(tmp_path)
    config.export.output_name = str(tmp_path / "custom.pte")  # a bare name is written to the working directory
    config.backend.xnnpack.enabled = True
    export_llama(config)
    pte = tmp_path / "custom.pte"
    catalog, build = local_runner
    r = subprocess.run([str(catalog.resolve(build)), f"--model_path={pte}", "--llm_prompt=4", "--llm_decode=2"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("error: this runner has no kernel for operator(s) ")
    assert "llama::custom_sdpa.out" in err and "llama::update_cache.out" in err
    assert ("these are ExecuTorch's LLM custom ops (extension/llm/custom_ops), which this runner build does not "
            "carry") in err
    assert ("optimum-executorch: without --use_custom_sdpa and --use_custom_kv_cache; ExecuTorch's export_llama: "
            "without --use_sdpa_with_kv_cache") in err
    assert ("python -m sme2farm.runners.recipe from an ExecuTorch checkout, which builds the custom_ops library into "
            "upstream executor_runner (which has no LLM mode: one forward call per iteration)") in err
