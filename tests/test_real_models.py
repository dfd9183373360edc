"""Real architectures through the real farm, in fp32, fp16 and PT2E int8.

Tiny Hugging Face `transformers` models (random weights, built from Config objects) and a
torch-only MobileNetV2-style net, exported by runners/zoo.py the way the learning path's kit
does it, are submitted with `sme2-client submit --wait --json` to `sme2-farm up`. Each run must
succeed, and every figure in its report must match figures computed here, independently, from
the farm's own trace artifact with ExecuTorch's flatcc deserializer. Not with `Inspector`: it
keys delegate events by name within a block, and these models repeat names (BERT logs
`Fully Connected (NC, F32) GEMM #1` many times per iteration), so Inspector would under-count
(docs/design.md, "ETDump event model"). The per-iteration delegate event count is checked against the
farm's operator counts for exactly that reason.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from sme2farm.analysis.categories import CATEGORIES, NAMED, OTHER, category_of, operator_type

pytestmark = pytest.mark.e2e

ITERATIONS = 8

# (zoo model, dtype, the category its heavy operators must land in, text every delegated
# GEMM/convolution type string carries for this dtype (int8: QC8, per-channel weights):
# proof the dtype reached XNNPACK,
# whether delegate event names repeat within an iteration: the transformers are cut into
# several XNNPACK subgraphs by their non-delegated ops, and each subgraph numbers its
# operators from #1 again; a fully delegated CNN is one subgraph with unique names)
CASES = [
    ("bert", "fp32", "GEMM", "F32", True),
    ("bert", "int8", "GEMM", "QC8", True),
    ("vit", "fp16", "GEMM", "F16", True),
    ("mobilenet_blocks", "fp16", "Convolution", "F16", False),
    ("mobilenet_blocks", "int8", "Convolution", "QC8", False),
]


@pytest.fixture(scope="session")
def zoo_pte(tmp_path_factory, request):
    """zoo_pte(name, dtype) -> Path. The export of every selected case starts at once in two
    worker processes (an export is seconds of single-threaded CPU; the farm starts meanwhile),
    each test waits for its own. Spawned, not forked: this process may already hold torch's
    threads."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pytest.importorskip("transformers")
    from sme2farm.runners.zoo import export_zoo

    out = tmp_path_factory.mktemp("zoo")
    pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))
    selected = {(item.callspec.params["name"], item.callspec.params["dtype"]) for item in request.session.items
                if item.originalname == "test_real_model_runs_and_matches_flatcc"}
    jobs = {(n, d): pool.submit(export_zoo, n, d, out / f"{n}-{d}.pte")
            for n, d, *_ in CASES if (n, d) in selected}  # in the order the tests run
    yield lambda name, dtype: jobs[(name, dtype)].result()
    pool.shutdown(cancel_futures=True)


def flatcc_figures(trace: bytes) -> dict:
    """Per-iteration figures from ExecuTorch's own flatcc deserializer, every event kept.

    One iteration = one "Execute" run block; its E2E = its Method::execute span. Operators are
    the leaf events: delegate events (a delegate debug id is set) and portable kernels
    (native_call_*); the OPERATOR_CALL / DELEGATE_CALL / Method::execute containers around them
    are not operators. A category's time = the sum of its operators; Other = E2E - the four
    named categories. Times are ns in this runtime's clock.
    """
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    etdump = deserialize_from_etdump_flatcc(trace)
    iterations = []
    for block in etdump.run_data:
        if block.name != "Execute":
            continue
        events = [e.profile_event for e in block.events or [] if e.profile_event is not None]
        e2e = [(e.end_time - e.start_time) / 1e6 for e in events if e.name == "Method::execute"]
        assert len(e2e) == 1, f"an Execute block with {len(e2e)} Method::execute events"
        categories = dict.fromkeys(CATEGORIES, 0.0)
        delegate_types: Counter = Counter()
        kernels: Counter = Counter()
        for e in events:
            ms = (e.end_time - e.start_time) / 1e6
            if e.delegate_debug_id_str or e.delegate_debug_id_int not in (None, -1):
                name = e.delegate_debug_id_str or str(e.delegate_debug_id_int)
                delegate_types[operator_type(name)] += 1
            elif (e.name or "").startswith("native_call_"):
                name = e.name
                kernels[name] += 1
            else:
                continue  # a container
            cat = category_of(name)
            if cat != OTHER:
                categories[cat] += ms
        categories[OTHER] = e2e[0] - sum(categories[c] for c in NAMED)
        iterations.append({"e2e": e2e[0], "categories": categories, "delegate_types": delegate_types,
                           "kernels": kernels, "delegate_events": sum(delegate_types.values()),
                           "delegate_names": [e.delegate_debug_id_str for e in events if e.delegate_debug_id_str]})
    return {"iterations": iterations}


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


@pytest.mark.parametrize("name,dtype,heavy,dtype_tag,names_repeat", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
# zoo_pte before farm: pytest sets fixtures up in argument order, so the exports run while the farm starts
def test_real_model_runs_and_matches_flatcc(zoo_pte, farm, name, dtype, heavy, dtype_tag, names_repeat):
    pte = zoo_pte(name, dtype)
    [run] = farm.submit_json(str(pte), "--sme2", "off", "--iterations", str(ITERATIONS), "--warmup", "1",
                             "--name", f"zoo-{name}-{dtype}")["runs"]
    assert run["status"] == "succeeded", run["reason"]

    r = httpx.get(f"{farm.url}/runs/{run['id']}/artifacts/trace.etdump",
                  headers={"Authorization": f"Bearer {farm.token}"}, timeout=30)
    assert r.status_code == 200, r.text
    its = flatcc_figures(r.content)["iterations"]
    assert len(its) == ITERATIONS  # warm-up executions are not in the trace

    # E2E and every category: the farm's report == the flatcc computation
    assert run["e2e_ms"]["n"] == ITERATIONS
    assert run["e2e_ms"]["mean"] == pytest.approx(mean(i["e2e"] for i in its), rel=1e-9)
    cats = run["categories_ms"]
    assert set(cats) == set(CATEGORIES)
    for c in CATEGORIES:
        assert cats[c] == pytest.approx(mean(i["categories"][c] for i in its), rel=1e-9, abs=1e-9), c
    # The heavy category's operators ran in every iteration. Their time is not asserted > 0: bert-int8's
    # quantized linears take about a microsecond each, and in some runner processes every one of them reads
    # 0 in the ETDump (seen here in 1 of 3 direct runs and in a whole farm run; not yet explained).
    assert sum(op["count"] for op in run["operators"] if category_of(op["name"]) == heavy) > 0
    assert sum(cats.values()) == pytest.approx(run["e2e_ms"]["mean"], rel=1e-9)

    # Every delegate event counted, repeats included: the same number in every iteration, and
    # equal to the farm's delegated operator counts, in total and per operator type.
    counts = {i["delegate_events"] for i in its}
    assert len(counts) == 1, f"delegate events per iteration vary: {sorted(counts)}"
    [per_iteration] = counts
    delegated = [op for op in run["operators"] if op["delegated"]]
    assert sum(op["count"] for op in delegated) == pytest.approx(per_iteration)
    assert {op["name"]: op["count"] for op in delegated} == pytest.approx(dict(its[0]["delegate_types"]))
    portable = [op for op in run["operators"] if not op["delegated"] and op["name"].startswith("native_call_")]
    assert {op["name"]: op["count"] for op in portable} == pytest.approx(dict(its[0]["kernels"]))
    # where names repeat, a reader keyed by name (Inspector) would merge events: the count
    # check above is what catches that
    names = its[0]["delegate_names"]
    assert (len(set(names)) < len(names)) == names_repeat, Counter(names).most_common(3)

    # the dtype reached XNNPACK: its heavy operators carry the dtype in their type string
    heavy_types = [t for t in its[0]["delegate_types"] if category_of(t) == heavy]
    assert heavy_types and all(dtype_tag in t for t in heavy_types if "Batch Matrix Multiply" not in t), heavy_types


def test_zoo_import_is_light_and_names_are_checked():
    import subprocess
    import sys

    # agents and clients import sme2farm.runners: the zoo must not pull torch or transformers in
    code = "import sys, sme2farm.runners.zoo as z; print(len(z.ZOO), 'torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[1:] == ["False", "False"]
    from sme2farm.runners.zoo import build

    with pytest.raises(KeyError, match="bert"):
        build("resnet9000", "fp32")
    with pytest.raises(ValueError, match="fp16"):
        build("bert", "bf16")
