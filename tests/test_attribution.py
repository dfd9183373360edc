"""Attribution from an ETRecord (analysis/attribution.py) on models whose answer is known by
construction, exported with ExecuTorch and run for real in the farm's host runner; ETDump events
cross-checked against ExecuTorch's own flatcc deserializer."""

from __future__ import annotations

import json
import subprocess

import pytest

from _fixtures_attribution import attributed_model  # noqa: F401
from _fixtures_runtime import resolved_runner
from sme2farm.analysis.attribution import EXPORT_HINT, NOT_ATTRIBUTED
from sme2farm.analysis.etrecord import read_etrecord
from sme2farm.analysis.report import analyze


@pytest.fixture(scope="module")
def traced(attributed_model, local_runner, tmp_path_factory):  # noqa: F811
    """traced(name, dtype) -> (pte bytes, ETRecord, ETDump bytes): 30 timed iterations."""
    cache = {}
    out = tmp_path_factory.mktemp("attr-traces")

    def make(name: str, dtype: str = "fp32"):
        if (name, dtype) not in cache:
            pte, record = attributed_model(name, dtype)
            trace = out / f"{name}-{dtype}.etdump"
            subprocess.run([resolved_runner(local_runner), f"--model_path={pte}", "--num_executions=30",
                            "--warmup=2", f"--etdump_path={trace}"], check=True, capture_output=True, timeout=120)
            cache[name, dtype] = (pte.read_bytes(), read_etrecord(record.read_bytes()), trace.read_bytes())
        return cache[name, dtype]

    return make


def _report(traced, name, dtype="fp32"):
    program, et, trace = traced(name, dtype)
    return analyze(trace, etrecord=et, program=program).to_dict()


def _module_ms(r) -> dict[str, float]:
    return {m["module"]: m["ms"] for m in r["by_module"]}


def _checks_that_hold_for_every_model(r):
    e2e = r["e2e_ms"]["mean"]
    depth0 = [m for m in r["by_module"] if m["depth"] == 0]
    assert {m["module"] for m in depth0} == {"", NOT_ATTRIBUTED}
    assert sum(m["ms"] for m in depth0) == pytest.approx(e2e, rel=1e-9)
    for depth in {m["depth"] for m in r["by_module"]}:  # no depth holds more than the model
        assert sum(m["ms"] for m in r["by_module"] if m["depth"] == depth) <= e2e * (1 + 1e-9)
    op_ms = sum(row["ms"] for row in r["by_source"])
    assert op_ms == pytest.approx(sum(o["total_ms"] for o in r["operators"]), rel=1e-9)
    assert r["attribution"]["attributed_share"] >= 0.8
    assert json.loads(json.dumps(r))["by_source"] == r["by_source"]  # the rows survive ingest's JSON


def test_the_dominant_layer_gets_the_slowest_convolution_and_the_heaviest_module(traced):
    r = _report(traced, "dominant")
    _checks_that_hold_for_every_model(r)
    assert r["attribution"]["status"] == "attributed"
    convs = [row for row in r["by_source"] if row["category"] == "Convolution"]
    slowest = max(convs, key=lambda row: row["ms"])
    assert (slowest["module"], slowest["module_class"]) == ("features.big", "Conv2d")
    assert slowest["aten"] == ["aten.convolution.default"] and "features(x)" in slowest["code"]
    top = max((m for m in r["by_module"] if m["depth"] == 1), key=lambda m: m["ms"])
    assert top["module"] == "features"
    # the 1x1 projection runs as Fully Connected and is the Conv2d's
    (proj,) = [row for row in r["by_source"] if row["module"] == "features.proj"]
    assert proj["operator"].startswith("Fully Connected") and proj["module_class"] == "Conv2d"
    head = [row for row in r["by_source"] if row["module"] == "head"]
    assert [row["module_class"] for row in head] == ["Linear"]


def test_portable_layer_norms_and_the_transposes_around_them(traced):
    r = _report(traced, "ln_net")
    _checks_that_hold_for_every_model(r)
    assert r["attribution"]["status"] == "attributed" and r["attribution"]["attributed_share"] == pytest.approx(1.0)
    norms = [row for row in r["by_source"] if row["operator"] == "native_call_native_layer_norm.out"]
    assert [(n["module"], n["module_class"], n["delegated"]) for n in norms] == [
        ("blocks.0.norm", "LayerNorm", False), ("blocks.1.norm", "LayerNorm", False)]
    assert all(n["aten"] == ["aten.native_layer_norm.default"] and "self.norm(" in n["code"] for n in norms)
    transposes = [row for row in r["by_source"] if row["operator"].startswith("Transpose")]
    inserted = [t for t in transposes if t["inserted_by"]]
    # the user's two permutes per block are theirs (no inserted_by); XNNPACK's layout ones are inserted
    assert len(transposes) - len(inserted) == 4 and len(inserted) >= 4
    assert all(t["module"] is not None for t in transposes)
    (mean,) = [row for row in r["by_source"] if row["operator"] == "native_call_mean.out"]
    assert (mean["module"], mean["module_class"]) == ("", "Net")  # the model's own forward
    ms = _module_ms(r)
    assert ms["blocks"] == pytest.approx(ms["blocks.0"] + ms["blocks.1"])
    assert ms["blocks.0"] >= ms["blocks.0.conv"] + ms["blocks.0.norm"]


def test_pointwise_convolutions_run_as_fully_connected_rows_of_their_conv2d(traced):
    r = _report(traced, "pointwise")
    _checks_that_hold_for_every_model(r)
    fc = [row for row in r["by_source"] if row["operator"].startswith("Fully Connected")]
    assert [(row["module"], row["module_class"]) for row in fc] == [("expand", "Conv2d"), ("reduce", "Conv2d")]
    (act,) = [row for row in r["by_source"] if row["operator"].startswith("HardSwish")]
    assert act["module_class"] == "Hardswish"


@pytest.mark.parametrize("name, dtype", [("dominant", "fp16"), ("dominant", "int8"), ("half_inside", "fp32")])
def test_fp16_and_int8_exports(traced, name, dtype):
    r = _report(traced, name, dtype)
    _checks_that_hold_for_every_model(r)
    assert r["attribution"]["status"] == "attributed"
    convs = [row for row in r["by_source"] if row["category"] == "Convolution"]
    assert convs and all(row["module_class"] == "Conv2d" for row in convs)
    if name == "dominant":
        assert max(convs, key=lambda row: row["ms"])["module"] == "features.big"
    if dtype == "int8":  # quantize/dequantize run as XNNPACK Converts, attributed, never a convolution
        converts = [row for row in r["by_source"] if row["operator"].startswith("Convert")]
        assert converts and all(row["category"] == "Data Movement" and row["module"] is not None for row in converts)
        assert any("quantize" in a for row in converts for a in row["aten"])
    if name == "half_inside":  # x.half() and .float() are portable copies in the model's forward
        copies = [row for row in r["by_source"] if "to_dim_order_copy" in row["operator"]]
        assert len(copies) == 2 and all(row["module_class"] == "Net" for row in copies)


def test_without_an_etrecord_no_module_is_named_and_one_line_says_how_to_export_one(traced):
    program, _, trace = traced("ln_net")
    r = analyze(trace, program=program).to_dict()
    assert r["attribution"] == {"status": "no etrecord", "attributed_share": 0.0, "etrecord_sha256": None}
    assert r["by_source"] == [] and r["by_module"] == []
    assert r["warnings"].count(EXPORT_HINT) == 1 and "generate_etrecord=True" in EXPORT_HINT


def test_another_models_etrecord_is_a_mismatch_and_names_nothing(traced):
    program, _, trace = traced("ln_net")
    _, other, _ = traced("dominant")
    r = analyze(trace, etrecord=other, program=program).to_dict()
    assert r["attribution"]["status"] == "mismatch" and r["attribution"]["etrecord_sha256"] == other.sha256
    assert r["by_source"] == [] and r["by_module"] == []
    assert any("does not belong to this model" in w for w in r["warnings"])
    # without the program the ETRecord cannot be checked: not used either
    r = analyze(trace, etrecord=traced("ln_net")[1]).to_dict()
    assert r["attribution"]["status"] == "mismatch" and r["by_source"] == []


def test_the_events_attributed_are_the_ones_executorchs_flatcc_reader_sees(traced):
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    program, et, trace = traced("ln_net")
    r = analyze(trace, etrecord=et, program=program).to_dict()
    blocks = [b for b in deserialize_from_etdump_flatcc(trace).run_data if b.name == "Execute"]
    per_iteration = []
    for b in blocks:
        names = []
        for e in b.events:
            pe = e.profile_event
            if pe is None:
                continue
            if pe.delegate_debug_id_str:
                names.append((pe.delegate_debug_id_str, pe.end_time - pe.start_time))
            elif pe.name.startswith("native_call_"):
                names.append((pe.name, pe.end_time - pe.start_time))
        per_iteration.append(names)
    first = [n for n, _ in per_iteration[0]]
    assert [row["operator"] + (f" #{row['instance']}" if row["instance"] else "") for row in r["by_source"]] == first
    for k, row in enumerate(r["by_source"]):  # mean ms per call site over the iterations
        assert row["ms"] == pytest.approx(sum(it[k][1] for it in per_iteration) / len(per_iteration) / 1e6, rel=1e-6)


def _client(*args, cwd=None):
    import sys

    code = ("import sys; from sme2farm.client import main; rc = main.main(sys.argv[1:]); "
            "assert not {'httpx', 'pydantic', 'torch', 'executorch'} & set(sys.modules), 'heavy import'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "analyze", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_client_analyze_with_the_model_shows_time_by_module_and_flags_another_models_etrecord(
        traced, attributed_model, tmp_path):  # noqa: F811
    traced("dominant")
    pte, record = attributed_model("dominant")
    trace = tmp_path / "t.etdump"
    trace.write_bytes(traced("dominant")[2])
    r = _client(trace, "--model", pte)  # the ETRecord beside the model is found and said
    assert r.returncode == 0, r.stderr
    assert f"using the ETRecord beside the model: {record}" in r.stderr
    assert "time by module (attributed" in r.stdout
    big = next(line for line in r.stdout.splitlines() if "Convolution" in line and "#" in line)
    assert "features.big (Conv2d)" in big  # the top call site is the dominant layer
    r = _client(trace, "--model", pte, "--json")
    report = json.loads(r.stdout)
    assert report["attribution"]["status"] == "attributed" and report["attribution"]["etrecord_sha256"]
    _, other = attributed_model("ln_net")
    r = _client(trace, "--model", pte, "--etrecord", other)
    assert r.returncode == 0 and f"warning: {other} is not used: it does not belong to this model: " in r.stderr
    assert r.stderr.count("not used") == 1, r.stderr  # the mismatch said once
    assert "time by module" not in r.stdout and "features.big" not in r.stdout
    r = _client(trace, "--etrecord", record)
    assert r.returncode == 2 and "--etrecord needs --model" in r.stderr
    garbage = tmp_path / "bad.etrecord"
    garbage.write_bytes(b"PK\x03\x04 not really")
    r = _client(trace, "--model", pte, "--etrecord", garbage)
    assert r.returncode == 2 and "not a zip" in r.stderr
    r = _client(trace)  # no model: no module, the report says how to export an ETRecord
    assert r.returncode == 0 and "time by module" not in r.stdout and "generate_etrecord=True" in r.stdout


CONV_CLASSES = {"Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d"}


@pytest.fixture(scope="module")
def zoo_traced(local_runner, tmp_path_factory):
    """zoo_traced(name, dtype) -> analyze()'s report of a zoo architecture run with its ETRecord."""
    from _fixtures_runtime import export_once, shared_exports_dir

    out = shared_exports_dir(tmp_path_factory)

    def make(name: str, dtype: str) -> dict:
        from sme2farm.runners.examples import write_xnnpack_pte
        from sme2farm.runners.zoo import build

        pte = out / f"attr-zoo-{name}-{dtype}.pte"
        record = pte.with_name(pte.name + ".etrecord")

        def export(partial):
            model, inputs = build(name, dtype)
            write_xnnpack_pte(model, inputs, partial, etrecord=record)

        export_once(pte, export)
        trace = tmp_path_factory.mktemp("zoo-attr") / "t.etdump"
        subprocess.run([resolved_runner(local_runner), f"--model_path={pte}", "--num_executions=10", "--warmup=1",
                        f"--etdump_path={trace}"], check=True, capture_output=True, timeout=300)
        return analyze(trace.read_bytes(), etrecord=read_etrecord(record.read_bytes()), program=pte.read_bytes()).to_dict()

    return make


@pytest.mark.models
@pytest.mark.parametrize("name, dtype", [("bert", "fp32"), ("resnet", "fp32"), ("resnet", "int8"), ("vit", "fp16")])
def test_real_architectures_attribute_convolutions_and_gemms_to_their_modules(zoo_traced, name, dtype):
    r = zoo_traced(name, dtype)
    _checks_that_hold_for_every_model(r)
    assert r["attribution"]["status"] == "attributed"  # ResNet fp32: the Add's ReLU runs as a Clamp after it
    for x in r["by_source"]:
        if x["operator"].startswith("Clamp") and x["inserted_by"]:
            assert x["aten"] == ["aten.add.Tensor"]
    rows = r["by_source"]
    convs = [x for x in rows if x["category"] == "Convolution"]
    assert all(x["module_class"] in CONV_CLASSES for x in convs), [x for x in convs if x["module_class"] not in CONV_CLASSES]
    gemms = [x for x in rows if x["category"] == "GEMM" and x["delegated"]]
    assert gemms or convs
    for x in gemms:  # a Linear, a 1x1 convolution, or a matmul in some module's forward
        assert x["module_class"] in {"Linear"} | CONV_CLASSES or any(
            a.split(".")[-2] in ("mm", "bmm", "matmul", "addmm", "linear") for a in x["aten"]), x
    delegated = sum(x["ms"] for x in rows if x["delegated"])
    assert sum(x["ms"] for x in rows if x["delegated"] and x["module"] is not None) >= 0.95 * delegated


@pytest.fixture(scope="module")
def llama_traced(local_runner, tmp_path_factory):
    """The tiny KV-cache Llama with its ETRecord, run in the runner's LLM mode: (pte, ETRecord, ETDump)."""
    pytest.importorskip("torch")
    from sme2farm.runners.tiny_llama import export_tiny_llama

    out = tmp_path_factory.mktemp("attr-llama")
    pte, record, trace = out / "llama.pte", out / "llama.pte.etrecord", out / "llama.etdump"
    export_tiny_llama(pte, etrecord=record)
    subprocess.run([resolved_runner(local_runner), f"--model_path={pte}", "--llm_prompt=5", "--llm_decode=3",
                    "--num_executions=2", f"--etdump_path={trace}"], check=True, capture_output=True, timeout=300)
    return pte.read_bytes(), read_etrecord(record.read_bytes()), trace.read_bytes()


def test_llm_prefill_and_decode_calls_each_get_time_by_module(llama_traced):
    program, et, trace = llama_traced
    r = analyze(trace, etrecord=et, program=program).to_dict()
    assert r["attribution"]["status"] in ("attributed", "ambiguous")
    assert not [w for w in r["warnings"] if "iterations run" in w]
    phases = r["llm"]["by_module"]
    assert set(phases) == {"prefill", "decode"}
    from sme2farm.protocol.runs import LlmReport, section_adapter

    assert section_adapter(LlmReport).validate_python(r["llm"]).by_module["decode"][0].module == ""  # the contract holds it
    for rows in phases.values():
        mods = {x["module"]: x for x in rows}
        assert {"", NOT_ATTRIBUTED, "layers.0", "layers.1", "lm_head"} <= set(mods)
        assert mods["lm_head"]["module_class"] == "Linear" and mods["lm_head"]["ms"] > 0
        assert mods["layers.0"]["ms"] <= mods[""]["ms"] * (1 + 1e-9)
        assert sum(x["ms"] for x in rows if x["depth"] == 1) <= mods[""]["ms"] * (1 + 1e-9)
    # the two phases are different calls: their times are not one table twice
    assert [x["ms"] for x in phases["prefill"]] != [x["ms"] for x in phases["decode"]]


def test_iterations_with_other_event_sequences_are_aligned_on_their_own(llama_traced, monkeypatch):
    """One iteration's events cut short (its last delegate call dropped): a second distinct
    sequence, aligned by itself; past the cap of sequences, the rest is ambiguous."""
    import numpy as np

    from sme2farm.analysis import attribution as attr
    from sme2farm.analysis.report import _Model
    from sme2farm.analysis.etdump import read_etdump

    program, et, trace = llama_traced
    calls = _Model(read_etdump(trace))
    assert calls.n_it >= 4
    whole = attr.attribute(calls, et, program, operators=[])
    first = np.flatnonzero(calls.op_it == 0)
    last_call = attr._call_of_events(calls, first)
    drop = first[(last_call == last_call[calls.delegated[first]].max()) & calls.delegated[first]]
    assert 0 < drop.size < first.size
    keep = np.ones(calls.op_idx.size, bool)
    keep[drop] = False
    cut = attr._subset(calls, np.arange(calls.n_it))
    for f in ("op_idx", "delegated", "op_it", "label_id", "op_ms", "type_id", "cat"):
        setattr(cut, f, getattr(cut, f)[keep])
    r = attr.attribute(cut, et, program, operators=[])
    assert not r.warnings or all("iterations" not in w for w in r.warnings)
    assert r.attribution.status == whole.attribution.status
    # every event's time is in a row, and as much of it is attributed as in the whole trace
    assert sum(x.ms for x in r.by_source) == pytest.approx(cut.op_ms.sum() / cut.n_it, rel=1e-9)
    assert r.attribution.attributed_share >= whole.attribution.attributed_share - 0.05
    cut_rows = [x for x in r.by_source if x.instruction == int(last_call[drop[0] - first[0]])]
    assert cut_rows and all(x.module is not None or x.ambiguous for x in cut_rows)

    monkeypatch.setattr(attr, "_MAX_SEQUENCES", 1)
    attr._PLANS.clear()
    capped = attr.attribute(cut, et, program, operators=[])
    assert capped.attribution.status == "ambiguous"
    assert any("more distinct operator sequences" in w for w in capped.warnings)
    assert sum(x.ms for x in capped.by_source) < cut.op_ms.sum() / cut.n_it
