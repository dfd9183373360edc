"""The direct ETDump reader and the event model, checked against executorch's Inspector on
real runtime traces, and on hand-built ETDumps for the cases the runtime does not produce."""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pytest

from sme2farm.analysis import EtdumpError, analyze, category_of, read_etdump
from sme2farm.analysis.categories import CATEGORIES, NAMED


def _inspector(path):
    pytest.importorskip("executorch.devtools")
    from executorch.devtools import Inspector
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Inspector(etdump_path=str(path))


def _our_durations(data: bytes) -> dict:
    """(block name, Inspector-style event name, instruction id) -> ms per run, in run order."""
    ev = read_etdump(data)
    d = ev.duration
    out = defaultdict(list)
    for i in np.flatnonzero(ev.kind == 0):
        dstr = ev.strings[ev.dstr[i]] if ev.dstr[i] >= 0 else ""
        if dstr:
            name = dstr
        elif ev.dint[i] != -1:
            name = str(int(ev.dint[i]))
        else:
            name = ev.strings[ev.name[i]]
        out[(ev.run_names[ev.run[i]], name, int(ev.instr[i]))].append(int(d[i]) / 1e6)
    return out


def test_per_event_durations_identical_to_inspector(real_trace):
    name, path = real_trace
    data = path.read_bytes()
    ours = _our_durations(data)
    insp = _inspector(path)
    blocks = [b.name for b in insp.event_blocks]
    assert blocks.count("Execute") == 1, blocks  # every iteration has the same event signature
    theirs = {}
    for blk in insp.event_blocks:
        for e in blk.events:
            if e.perf_data is not None:
                theirs[(blk.name, e.name, e._instruction_id)] = list(e.perf_data.raw)
    assert set(theirs) == set(ours), name
    n = 0
    for key, raw in theirs.items():
        # Inspector converts delegate times as end/1e6 - start/1e6 (float noise ~1e-12 ms)
        np.testing.assert_allclose(ours[key], raw, rtol=0, atol=1e-9, err_msg=str(key))
        n += len(raw)
    assert n == sum(len(v) for v in ours.values())


def test_report_agrees_with_independent_inspector_computation(real_trace):
    """E2E per iteration, categories per iteration and load times, recomputed from Inspector's
    events (delegate events + native_call kernels; containers skipped)."""
    name, path = real_trace
    rep = analyze(path.read_bytes()).to_dict()
    insp = _inspector(path)
    blk = next(b for b in insp.event_blocks if b.name == "Execute")
    e2e = np.array(next(e for e in blk.events if e.name == "Method::execute").perf_data.raw)
    np.testing.assert_allclose(rep["iterations_ms"], e2e, rtol=1e-9)
    assert rep["e2e_ms"]["n"] == e2e.size
    assert rep["e2e_ms"]["median"] == pytest.approx(float(np.median(e2e)), rel=1e-9)
    cats = {c: np.zeros(e2e.size) for c in CATEGORIES}
    for e in blk.events:
        if e.perf_data is None:
            continue
        if e.is_delegated_op or e.name.startswith("native_call_"):
            cats[category_of(e.name)] += np.array(e.perf_data.raw)
    four = sum(cats[c] for c in NAMED)
    cats["Other"] = e2e - four
    for c in CATEGORIES:
        np.testing.assert_allclose(rep["category_iterations_ms"][c], cats[c], atol=1e-9, err_msg=c)
        assert rep["categories_ms"][c] == pytest.approx(cats[c].mean(), abs=1e-9)
    dflt = next(b for b in insp.event_blocks if b.name == "Default")
    by = {e.name: e.perf_data.raw[0] for e in dflt.events if e.perf_data}
    assert rep["load_ms"]["load_method"] == pytest.approx(by["Program::load_method"])
    assert rep["load_ms"]["init"] == pytest.approx(by["Method::init"])


def test_non_size_prefixed_reads_the_same(real_trace):
    _, path = real_trace
    data = path.read_bytes()
    assert data[8:12] == b"ED00"  # the runtime writes size-prefixed files
    a, b = read_etdump(data), read_etdump(data[4:])
    assert a.size_prefixed and not b.size_prefixed
    assert np.array_equal(a.duration, b.duration)
    assert [a.strings[i] for i in a.name if i >= 0] == [b.strings[i] for i in b.name if i >= 0]


def _both(monkeypatch, read):
    """read() with the string table read vectorised, then place by place (etdump._few_strings)."""
    from sme2farm.analysis import etdump

    monkeypatch.setattr(etdump, "_FEW_STRINGS", 0)
    vectorised = read()
    monkeypatch.setattr(etdump, "_FEW_STRINGS", 1 << 30)
    return vectorised, read()


def test_a_real_traces_strings_read_place_by_place_are_the_vectorised_reads(real_trace, monkeypatch):
    """Below _FEW_STRINGS places the string table is read place by place: the same strings in the
    same order, the same ids."""
    a, b = _both(monkeypatch, lambda: read_etdump(real_trace[1].read_bytes()))
    assert a.strings == b.strings and a.run_names == b.run_names and len(set(a.strings)) > 3
    assert np.array_equal(a.name, b.name) and np.array_equal(a.dstr, b.dstr)


def test_string_tables_read_place_by_place_are_the_vectorised_reads(monkeypatch):
    """Random tables of short, long (hashed alone), repeated and empty strings, some ending at the
    file's last byte, named from repeated places and absent ones: both reads agree, and name each
    place's own bytes."""
    from sme2farm.analysis import etdump

    rng = np.random.default_rng(7)
    for _ in range(200):
        words = [bytes(rng.integers(32, 127, int(rng.choice([0, 3, 8, 9, 40, 300])), dtype=np.uint8))
                 for _ in range(int(rng.integers(1, 20)))]
        blob, places = bytearray(), []
        for _ in range(int(rng.integers(1, 100))):
            w = words[int(rng.integers(len(words)))]
            places.append(len(blob))
            blob += len(w).to_bytes(4, "little") + w
        blob += bytes(max(0, 16 - len(blob)))
        buf = etdump._Buf(bytes(blob))
        pos = np.array(places + [int(x) for x in rng.choice(places, 50)] + [-1], dtype=np.int64)
        (ids_a, strs_a), (ids_b, strs_b) = _both(monkeypatch, lambda: buf.strings(pos, "names"))
        assert strs_a == strs_b and np.array_equal(ids_a, ids_b)
        assert [strs_a[i] for i in ids_a[:-1]] == [blob[p + 4:p + 4 + int.from_bytes(blob[p:p + 4], "little")].decode()
                                                   for p in pos[:-1]] and ids_a[-1] == -1


@pytest.mark.parametrize("blob", [b"", b"hello", b"\x00" * 64, bytes(range(256)) * 8,
                                  b"PK\x03\x04" + b"\x00" * 100])
def test_garbage_is_rejected(blob):
    with pytest.raises(EtdumpError, match="ETDump"):
        analyze(blob)


def test_pte_is_not_an_etdump(example_pte):
    # a .pte is a flatbuffer too, but with another identifier
    with pytest.raises(EtdumpError, match="identifier"):
        analyze(example_pte("toy_cnn").read_bytes())


def test_truncated_trace_is_rejected(real_trace):
    _, path = real_trace
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) - 64, len(data) // 2, 16):
        with pytest.raises(EtdumpError, match="truncated"):
            analyze(data[:cut])
    # without the size prefix the reader must notice references past the end of the file
    raw = data[4:]
    for cut in (len(raw) - 16, len(raw) * 3 // 4, len(raw) // 3, 40):
        with pytest.raises(EtdumpError):
            read_etdump(raw[:cut])


def test_corrupt_offsets_are_rejected(real_trace):
    _, path = real_trace
    data = bytearray(path.read_bytes())
    data[4:8] = (len(data) * 2).to_bytes(4, "little")  # root offset beyond the file
    with pytest.raises(EtdumpError):
        analyze(bytes(data))


def test_all_event_kinds_and_defaults(etdump_builder):
    B = etdump_builder
    runs = [("Default", [B.prof("Program::load_method", 0, 2_000_000), B.prof("Method::init", 10, 1_500_000),
                         {"alloc": {"allocator_id": 1, "size": 4096}}]),
            ("Execute", B.iteration(10_000_000, [("Convert (NC, F32, F16) #1", 30_000)]) + [
                {"alloc": {"allocator_id": 0, "size": 128}},
                {"debug": {"name": "native_call_add.out", "instruction_id": 3}},
                # 32-bit timer wrap: Inspector counts (2^32-1 - start) + end
                B.prof("custom", 2**32 - 100, 0, end=50)])]
    for prefixed in (True, False):
        data = B.build(runs, size_prefixed=prefixed, version=7)
        ev = read_etdump(data)
        assert ev.version == 7 and ev.size_prefixed is prefixed
        assert ev.run_names == ["Default", "Execute"]
        assert sorted(ev.kind.tolist()).count(1) == 2 and (ev.kind == 2).sum() == 1
        assert sorted(ev.alloc_size[ev.kind == 1].tolist()) == [128, 4096]
        dbg = np.flatnonzero(ev.kind == 2)[0]
        assert ev.strings[ev.name[dbg]] == "native_call_add.out" and ev.instr[dbg] == 3
        prof = np.flatnonzero(ev.kind == 0)
        # fields left out of the buffer read as the schema defaults
        assert set(ev.instr[prof].tolist()) >= {-1, 0}
        assert (ev.dint[prof] == -1).all()
        wrap = [i for i in prof if ev.name[i] >= 0 and ev.strings[ev.name[i]] == "custom"][0]
        assert ev.duration[wrap] == (2**32 - 1 - (2**32 - 100)) + 50
        rep = analyze(data).to_dict()
        assert rep["allocations"] == {"n_events": 2, "total_bytes": 4224}
        assert rep["n_debug_events"] == 1
        assert rep["load_ms"] == {"load_method": 2.0, "init": 1.5}
        assert rep["categories_ms"]["Data Movement"] == pytest.approx(0.03)


def test_nesting_never_double_counts(etdump_builder):
    """Delegate ops sit inside DELEGATE_CALL, native_call inside OPERATOR_CALL, everything
    inside Method::execute: only the leaves are counted, the rest is Other."""
    B = etdump_builder
    it = B.iteration(0, [("Convolution (NHWC, F32) IGEMM #1", 40_000), ("Add (ND) #1", 10_000)],
                     overhead=5_000, portable=[("cumsum.out", 20_000), ("mm.out", 7_000)])
    rep = analyze(B.build([("Execute", it)])).to_dict()
    e2e = rep["iterations_ms"][0]
    # E2E = 2*overhead + ops + portable ops + 200 ns OPERATOR_CALL overhead each
    assert e2e == pytest.approx((10_000 + 50_000 + 27_000 + 400) / 1e6)
    c = rep["categories_ms"]
    assert c["Convolution"] == pytest.approx(0.040)
    assert c["Elementwise"] == pytest.approx(0.010)
    assert c["GEMM"] == pytest.approx(0.007)  # mm by op name
    assert c["Other"] == pytest.approx(e2e - 0.057)
    assert sum(c.values()) == pytest.approx(e2e)
    names = {o["name"]: o for o in rep["operators"]}
    assert "OPERATOR_CALL" not in " ".join(names) and "DELEGATE_CALL" not in names
    assert names["native_call_cumsum.out"]["total_ms"] == pytest.approx(0.020)
    assert names["native_call_cumsum.out"]["delegated"] is False
    assert names["Add (ND)"]["delegated"] is True


def test_orphan_operator_call_counts_once(etdump_builder):
    B = etdump_builder
    evs = [B.prof("OPERATOR_CALL", 1000, 3000, instruction_id=5),
           B.prof("Method::execute", 0, 10_000, instruction_id=0)]
    rep = analyze(B.build([("Execute", evs)])).to_dict()
    assert [o["name"] for o in rep["operators"]] == ["OPERATOR_CALL (instruction 5)"]
    assert rep["operators"][0]["total_ms"] == pytest.approx(0.003)


def test_operators_exceeding_e2e_are_clamped(etdump_builder):
    B = etdump_builder
    evs = [B.xnn("Add (ND) #1", 0, 9_000), B.xnn("Add (ND) #2", 9_000, 9_000),
           B.prof("Method::execute", 0, 12_000, instruction_id=0)]
    rep = analyze(B.build([("Execute", evs)])).to_dict()
    assert min(rep["categories_ms"].values()) >= 0
    assert sum(o["total_ms"] for o in rep["operators"]) <= rep["e2e_ms"]["mean"] + 1e-12
    assert any("exceed" in w for w in rep["warnings"])


def test_skip_first_drops_warmup(real_trace):
    _, path = real_trace
    data = path.read_bytes()
    full, cut = analyze(data).to_dict(), analyze(data, skip_first=3).to_dict()
    assert cut["iterations_ms"] == full["iterations_ms"][3:]
    assert cut["e2e_ms"]["n"] == full["e2e_ms"]["n"] - 3
    assert cut["skipped_iterations"] == 3
    for c in CATEGORIES:
        assert cut["category_iterations_ms"][c] == pytest.approx(full["category_iterations_ms"][c][3:])
    none = analyze(data, skip_first=10**6).to_dict()
    assert none["e2e_ms"]["n"] == 0 and none["warnings"]
