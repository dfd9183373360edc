"""Memory in comparisons: the runner's peak RSS per arm (median over runs, analysis/memory.py,
carried by analysis.compare into every comparison and its text) and two programs' planned memory
compared exactly (GET /comparisons, both experiments)."""

from __future__ import annotations

import pytest

from _fixtures_farm import register, submit

from sme2farm.analysis import compare, compare_emulated
from sme2farm.analysis.memory import arm_memory, planned_compared, runs_compared
from sme2farm.analysis.wording import comparison_fact_lines


def _report(ms: float, rss: int | None, allocated: int | None = 1000) -> dict:
    out = {"iterations_ms": [ms * (1 + 0.01 * (i % 5)) for i in range(20)], "e2e_ms": {"median": ms}}
    if rss is not None:
        out["memory"] = {"peak_rss_bytes": rss, "runtime_allocated_bytes": allocated}
    return out


def test_arm_memory_is_the_median_over_runs_and_skips_runs_without_it():
    arm = arm_memory([_report(1, 100), _report(1, 300), _report(1, 200), _report(1, None)])
    assert arm["runs"] == 3 and arm["peak_rss_bytes"] == 200 and arm["peak_rss_bytes_range"] == [100, 300]
    assert arm_memory([_report(1, None)]) is None


def test_compare_carries_both_arms_memory_into_its_facts():
    c = compare([_report(2.0, 40_000_000), _report(2.0, 42_000_000)], [_report(1.0, 46_200_000)])
    m = c["memory"]
    assert m["baseline"]["peak_rss_bytes"] == 41_000_000 and m["candidate"]["peak_rss_bytes"] == 46_200_000
    assert m["peak_rss_change"] == pytest.approx(46.2 / 41 - 1)
    assert "peak RSS SME2 off 41.0 MB, SME2 on 46.2 MB (+12.7%)" in m["sentence"]
    assert m["sentence"] in comparison_fact_lines(c)
    assert compare([_report(2.0, None)], [_report(1.0, None)])["memory"] is None
    emulated = compare_emulated([_report(2.0, 10_000_000)], [_report(1.0, 10_000_000)], emulator="qemu")
    assert "unchanged" in emulated["memory"]["sentence"] and "emulator's process" in emulated["memory"]["sentence"]


def test_planned_memory_changes_are_exact():
    a = {"planned_bytes": 4000, "weights_bytes": 1_000_000}
    b = {"planned_bytes": 4480, "weights_bytes": 1_000_000}
    p = planned_compared(a, b, labels=("E1", "E2"))
    assert p["change"]["planned_bytes"] == pytest.approx(0.12) and p["change"]["weights_bytes"] == 0
    assert p["sentence"] == "E1 -> E2: planned memory +12.0% (4.0 kB -> 4.5 kB); weights unchanged (1.0 MB)."
    assert "not recorded on one side" in planned_compared(a, None)["sentence"]
    assert planned_compared(None, None) is None
    assert runs_compared([_report(1, None)], [_report(1, None)]) is None


def test_compare_endpoint_gives_both_experiments_planned_memory(api, example_pte):
    register(api)
    a = submit(api, example_pte("toy_cnn"), threads=[1])
    b = submit(api, example_pte("mlp"), threads=[1])
    r = api.client.get("/comparisons", params={"baseline": f"E{a['id']}", "candidate": f"E{b['id']}"},
                       headers=api.auth())
    assert r.status_code == 200, r.text
    pm = r.json()["program_memory"]
    assert pm["baseline"] == a["program_memory"] and pm["candidate"] == b["program_memory"]
    before, after = a["program_memory"]["planned_bytes"], b["program_memory"]["planned_bytes"]
    assert pm["change"]["planned_bytes"] == pytest.approx(after / before - 1)
    assert pm["sentence"].startswith(f"E{a['id']} -> E{b['id']}: planned memory ")


def test_a_program_whose_delegate_names_a_missing_segment_is_refused_with_nothing_stored(api, example_pte):
    import struct

    from _fixtures_farm import post_experiment

    from sme2farm.analysis import pte
    from sme2farm.analysis.flatbuffer import Flat

    register(api)
    data = bytearray(example_pte("mlp").read_bytes())
    fb = Flat(bytes(data), "program", pte.program_end(data))
    [plan] = fb.root().tables(1, "execution_plan", "ExecutionPlan")
    ref = plan.tables(7, "delegates", "BackendDelegate")[0].table(1, "processed", "BackendDelegateDataReference")
    assert ref.scalar(0, "<b", 0, "location") == 1  # the delegate's blob is a segment
    vtable = ref.pos - struct.unpack_from("<i", data, ref.pos)[0]
    index_at = ref.pos + struct.unpack_from("<H", data, vtable + 4 + 2 * 1)[0]  # field 1: index
    struct.pack_into("<I", data, index_at, 99)
    assert list(pte.program_methods(bytes(data), end=pte.program_end(data))) == ["forward"]  # methods still read
    r = post_experiment(api, bytes(data), {"sme2": "off"})
    assert r.status_code == 422, r.text
    assert "model: cannot read the program's memory plan" in r.json()["detail"] and "segment 99" in r.json()["detail"]
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 0
