"""The report's shape is defined once (analysis/types.py), served as it is by the wire contract
(sme2farm/protocol/runs.py, comparisons.py): here analyze()'s stored JSON holds valid against it,
with no key left out, for every bundled example, SME2 arm and dtype; a renamed field fails; a run
report served by a farm validates against the typed model and, with an off-the-shelf JSON Schema
validator, against the schema /openapi.json publishes."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from pydantic import TypeAdapter, ValidationError

from _fixtures_analysis import ANALYSIS_ITERATIONS, REAL_MODELS, _cache_dir, make_real_trace
from _fixtures_farm import dispatch, ingest_all, submit
from sme2farm.analysis import analyze, compare, compare_emulated
from sme2farm.analysis.llm import MARKER_DECODE, MARKER_PREFILL
from sme2farm.analysis.runner_memory import read_memory
from sme2farm.analysis.types import Coverage, LatencyStats, Section
from sme2farm.protocol import AnalysisReport, Comparison, ExperimentReport, RunnerMemory, RunReport, section_adapter


def _left_out(original, parsed, path: str = "") -> list[str]:
    """The keys of `original` the parsed model does not carry (read models ignore unknown keys, so
    a key the contract misses would vanish silently)."""
    out = []
    if isinstance(original, dict):
        assert isinstance(parsed, dict), f"{path}: a mapping became {type(parsed).__name__}"
        for k, v in original.items():
            if k not in parsed:
                out.append(f"{path}.{k}")
            else:
                out += _left_out(v, parsed[k], f"{path}.{k}")
    elif isinstance(original, list) and isinstance(parsed, list):
        for i, (a, b) in enumerate(zip(original, parsed)):
            out += _left_out(a, b, f"{path}[{i}]")
    return out


def _holds(model, data: dict) -> None:
    """`data` validates against `model` (a pydantic model or an analysis.types dataclass) and keeps every key."""
    adapter = TypeAdapter(model)
    parsed = adapter.validate_python(data)
    assert _left_out(data, adapter.dump_python(parsed)) == [], f"{model.__name__} leaves keys out"


def _check_arms(off: dict, on: dict) -> None:
    for report in (off, on):
        _holds(AnalysisReport, report)
    complete = compare(off, on)
    _holds(Comparison, {"status": "complete", **complete})
    assert Comparison.model_validate({"status": "complete", **complete}).categories  # typed down to the verdicts
    _holds(Comparison, {"status": "complete", **compare_emulated(off, on, emulator="qemu-aarch64 -cpu max")})


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_every_bundled_examples_analysis_is_what_the_contract_says(name):
    trace = make_real_trace(name, **REAL_MODELS[name]).read_bytes()
    off, on = analyze(trace, sme2=False, arch="arm64").to_dict(), analyze(trace, sme2=True, arch="arm64").to_dict()
    _holds(AnalysisReport, analyze(trace).to_dict())  # an offline trace: arm and architecture unknown
    _check_arms(off, on)
    parsed = section_adapter(AnalysisReport).validate_python(on)
    assert parsed.operators and all(o.kernel_path for o in parsed.operators)
    assert parsed.kernel_paths.coverage.conv_gemm_ms >= 0


def _renamed(cls: type, old: str, new: str) -> type:
    """`cls` with field `old` renamed to `new` (same type, same default): what a rename in analysis/types.py is."""
    def copied(f: dataclasses.Field) -> dataclasses.Field:  # a field of its own: make_dataclass renames what it is given
        kw = {k: getattr(f, k) for k in ("default", "default_factory") if getattr(f, k) is not dataclasses.MISSING}
        return dataclasses.field(metadata=f.metadata, **kw)

    fields = [(new if f.name == old else f.name, f.type, copied(f)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(Section,), kw_only=True,
                                      namespace={"__module__": cls.__module__})


def test_a_renamed_field_fails_the_contract_and_the_reader(etdump_builder):
    """One rename, shown once: stored JSON written before it no longer reads, in the wire's contract or
    through from_dict, and a renamed optional field is caught as a key left out."""
    trace = etdump_builder.build([("Execute", etdump_builder.iteration(i * 10**6, [("Convolution (NHWC, F32) IGEMM #1",
                                                                                   50_000)])) for i in range(3)])
    report = analyze(trace, sme2=True, arch="arm64").to_dict()
    stored = report["kernel_paths"]["coverage"]
    _holds(Coverage, stored)  # as defined, the contract holds
    renamed = _renamed(Coverage, "sme2_ms", "sme2_time_ms")
    with pytest.raises(ValidationError, match="sme2_time_ms"):
        _holds(renamed, stored)
    with pytest.raises(ValueError, match="'sme2_time_ms' is missing"):
        renamed.from_dict(stored)
    optional = _renamed(LatencyStats, "trimmed_mean", "trimmed_mean_ms")  # it has a default: a key is dropped instead
    with pytest.raises(AssertionError, match="leaves keys out"):
        _holds(optional, report["e2e_ms"])
    assert [f.name for f in dataclasses.fields(Coverage)][1] == "sme2_ms"  # the definition itself is untouched


def test_a_renamed_comparison_field_fails_the_contract_and_the_reader(etdump_builder):
    """The comparison is defined once too (analysis/comparison_types.py; the wire's Comparison is read
    from it): a field renamed there no longer holds a stored comparison, on the wire or through from_dict."""
    from sme2farm.analysis import comparison_types as ct
    from sme2farm.analysis.numerics import not_compared
    from sme2farm.protocol.comparisons import read_model

    trace = etdump_builder.build([("Execute", etdump_builder.iteration(i * 10**6, [("Convolution (NHWC, F32) IGEMM #1",
                                                                                   50_000 + 100 * i)])) for i in range(5)])
    stored = compare(analyze(trace, sme2=False, arch="arm64"), analyze(trace, sme2=True, arch="arm64"))
    _holds(Comparison, stored)
    assert ct.Comparison.from_dict(stored).categories["Convolution"].baseline_ms > 0  # read back typed
    with pytest.raises(AssertionError, match="leaves keys out"):  # every top-level field has a default
        _holds(read_model(_renamed(ct.Comparison, "speedup", "ratio")), stored)
    said = not_compared("not recorded", "numerics not recorded: no run")
    renamed = _renamed(ct.Numerics, "sentence", "said")
    with pytest.raises(ValidationError, match="said"):
        _holds(renamed, said)
    with pytest.raises(ValueError, match="'said' is missing"):
        renamed.from_dict(said)
    assert "speedup" in {f.name for f in dataclasses.fields(ct.Comparison)}  # the definition itself is untouched


def _call(etdump_builder, t0: int, marker: str, tokens: int, pos: int, ops: list[tuple[str, int]]) -> list[dict]:
    evs = etdump_builder.iteration(t0, ops)
    evs.append(etdump_builder.prof(marker, t0, 100, chain_index=tokens, instruction_id=pos))
    return evs


def test_an_llm_report_with_its_phases_and_kernel_paths_is_what_the_contract_says(etdump_builder):
    prefill = [("Fully Connected (NC, QP8, F32, QC8W) GEMM #1", 30_000), ("Softmax (NC, F32) #1", 5_000)]
    decode = [("Fully Connected (NC, QP8, F32, QB4W) GEMM #2", 20_000), ("Fully Connected (NC, F32) GEMM #3", 20_000)]
    runs = []
    for g in range(4):
        t = g * 1_000_000
        runs += [("Execute", _call(etdump_builder, t, MARKER_PREFILL, 4, 0, prefill)),
                 ("Execute", _call(etdump_builder, t + 100_000, MARKER_DECODE, 1, 4, decode)),
                 ("Execute", _call(etdump_builder, t + 200_000, MARKER_DECODE, 1, 5, decode))]
    trace = etdump_builder.build(runs)
    off, on = analyze(trace, sme2=False, arch="arm64").to_dict(), analyze(trace, sme2=True, arch="arm64").to_dict()
    _check_arms(off, on)
    llm = section_adapter(AnalysisReport).validate_python(on).llm
    assert llm is not None and llm.decode == 2 and llm.kernel_paths.decode.what_would_reach_sme2
    assert llm.categories.decode is not None and llm.ttft_ms.n == 4
    assert Comparison.model_validate({"status": "complete", **compare(off, on)}).llm.decode is not None


def test_the_runners_memory_figures_are_what_the_contract_says():
    memory = read_memory(json.dumps({"peak_rss_bytes": 9 << 20, "peak_rss_after_load_bytes": 8 << 20,
                                     "planned_bytes": 4096, "planned_buffers_bytes": [4096],
                                     "rss_source": "/proc/self/status VmHWM"}).encode())
    _holds(RunnerMemory, memory)
    assert section_adapter(RunnerMemory).validate_python(memory).execution_rss_growth_bytes == 1 << 20


def _zoo_trace(name: str, dtype: str) -> bytes:
    """A zoo model exported in `dtype` (runners/zoo.py), run ANALYSIS_ITERATIONS times by the ExecuTorch
    runtime's Python bindings with ETDump on; cached like the bundled examples' traces."""
    pytest.importorskip("torch")
    pytest.importorskip("executorch.extension.pybindings.portable_lib")
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from sme2farm.runners.zoo import build, export_zoo

    out = _cache_dir() / f"zoo-{name}-{dtype}-{ANALYSIS_ITERATIONS}it.etdump"
    if not out.exists():
        pte = export_zoo(name, dtype, _cache_dir() / f"zoo-{name}-{dtype}.{os.getpid()}.pte")
        inputs = build(name, dtype)[1]
        m = _load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
        with torch.no_grad():
            for _ in range(ANALYSIS_ITERATIONS):
                m.forward(inputs)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        m.write_etdump_result_to_file(str(tmp))
        tmp.replace(out)
        pte.unlink()
    return out.read_bytes()


@pytest.mark.models
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8"])
def test_every_dtypes_analysis_is_what_the_contract_says(dtype):
    trace = _zoo_trace("mobilenet_blocks", dtype)
    _check_arms(analyze(trace, sme2=False, arch="arm64").to_dict(), analyze(trace, sme2=True, arch="arm64").to_dict())


def _served_schema(api, name: str) -> dict:
    """The published schema of one component, with the document's components to resolve its refs."""
    doc = api.client.get("/openapi.json").json()
    return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}


def test_a_served_report_validates_against_the_model_and_the_published_schema(api, agent, example_pte, monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    exp = submit(api, example_pte("toy_cnn").read_bytes(), sme2="off", iterations=3)
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    ingest_all(api, [rid], monkeypatch)

    raw = api.client.get(f"/experiments/{exp['id']}", headers=api.auth())
    assert raw.status_code == 200, raw.text
    report = ExperimentReport.model_validate_json(raw.content)   # the stored bytes the route serves
    assert _left_out(raw.json(), report.model_dump(mode="json")) == []
    [run] = report.runs
    assert run.status == "succeeded" and run.operators and run.kernel_paths is not None
    assert run.operators[0].kernel_path and run.kernel_paths.coverage.off_sme2 is not None
    jsonschema.validate(raw.json(), _served_schema(api, "ExperimentReport"))

    one = api.client.get(f"/runs/{rid}", headers=api.auth())
    RunReport.model_validate_json(one.content)
    jsonschema.validate(one.json(), _served_schema(api, "RunReport"))
    # what a validator would catch: an operator row without its kernel path
    broken = one.json()
    del broken["operators"][0]["kernel_path"]
    with pytest.raises(jsonschema.ValidationError, match="kernel_path"):
        jsonschema.validate(broken, _served_schema(api, "RunReport"))

    cancelled = api.client.post(f"/experiments/{exp['id']}/cancel", headers=api.auth())
    jsonschema.validate(cancelled.json(), _served_schema(api, "ExperimentReport"))
    artifact = api.client.get(f"/runs/{rid}/artifacts/report.json", headers=api.auth())
    _holds(AnalysisReport, artifact.json())



def test_numerics_are_what_the_contract_says():
    import numpy as np

    from sme2farm.analysis import numerics
    from sme2farm.protocol import Numerics

    base = np.array([1.0, 2.0, np.inf], dtype=np.float32)
    compared = numerics.compare([("Float", base), ("Long", np.arange(3))],
                                [("Float", base + np.float32(1e-3)), ("Long", np.arange(3))], ("SME2 off", "SME2 on"))
    _holds(Numerics, compared)
    assert [o.within_tolerance for o in section_adapter(Numerics).validate_python(compared).outputs] == [False, True]
    _holds(Numerics, numerics.not_compared("not recorded", "numerics not recorded: no run"))
