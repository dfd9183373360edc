"""analysis/charts.py: every chart is well-formed SVG (parsed by xml.etree), escapes text, has
an accessible title, and draws what it is given (or says there is nothing) for empty and NaN data."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from sme2farm.analysis import charts
from sme2farm.analysis.categories import CATEGORIES

NS = "{http://www.w3.org/2000/svg}"
EVIL = '<script>alert("x")</script> & \'q\''


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    assert re.fullmatch(r"0 0 \d+ \d+", root.get("viewBox"))
    assert root.get("role") == "img"
    assert root[0].tag == NS + "title" and root[0].text  # accessible name first
    assert root[1].tag == NS + "desc"
    assert not root.findall(f".//{NS}script")
    return root


def cls(root: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in root.iter() if name in (e.get("class") or "").split()]


def texts(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in root.iter(NS + "text")]


def test_distribution_violins_per_arm_on_one_axis():
    rng = np.random.default_rng(1)
    off, on = rng.normal(10, 0.5, 200), rng.normal(4, 0.2, 150)
    root = parse(charts.distribution_chart([("SME2 off", off), ("SME2 on", on)]))
    arms = cls(root, "arm")
    assert [a.get("data-label") for a in arms] == ["SME2 off", "SME2 on"]
    assert [a.get("data-n") for a in arms] == ["200", "150"]
    assert len(cls(root, "violin")) == 2
    # the faster arm's median is drawn lower (larger y) on the shared axis
    y_off, y_on = (float(cls(a, "median")[0].get("y1")) for a in arms)
    assert y_on > y_off
    assert ["".join(cls(a, "median-label")[0].itertext()) for a in arms] == \
        [charts.fmt(float(np.median(off))), charts.fmt(float(np.median(on)))]


def test_distribution_nan_empty_and_tiny():
    root = parse(charts.distribution_chart([("a", [float("nan"), None, "x", math.inf, 1.0, 2.0]), ("b", [])]))
    a, b = cls(root, "arm")
    assert a.get("data-n") == "2" and len(cls(a, "sample")) == 2  # too few for a density: the points
    assert "no samples" in texts(b)
    empty = parse(charts.distribution_chart([]))
    assert "no latency samples" in texts(empty)
    same = parse(charts.distribution_chart([("flat", [3.0] * 50)]))  # zero spread: no division by zero
    assert cls(same, "arm")[0].get("data-n") == "50"


def test_text_is_escaped_everywhere():
    svgs = [
        charts.distribution_chart([(EVIL, [1, 2, 3, 4])], title=EVIL),
        charts.category_bars([(EVIL, {"GEMM": 1.0})], title=EVIL),
        charts.forest_plot([{"label": EVIL, "ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3, "verdict": EVIL,
                             "sentence": EVIL}], title=EVIL),
        charts.line_chart([{"median_ms": 1, "at": EVIL}], changes=[{"point_index": 0, "direction": EVIL}], title=EVIL),
    ]
    for svg in svgs:
        assert "<script>" not in svg
        root = parse(svg)
        assert root[0].text == EVIL  # round-trips as text
        assert any(EVIL in t for t in texts(root)) or any(EVIL == e.get("data-label") for e in root.iter())


def test_category_bars_share_one_scale():
    a = {"Convolution": 4.0, "GEMM": 2.0, "Data Movement": 1.0, "Elementwise": 0.5, "Other": 0.5}
    b = {"Convolution": 1.0, "GEMM": 1.0, "Other": float("nan"), "bogus": 99}
    root = parse(charts.category_bars([("off", a), ("on", b)]))
    bars = cls(root, "bar")
    assert [float(x.get("data-total")) for x in bars] == [8.0, 2.0]
    segs = [cls(x, "segment") for x in bars]
    assert [s.get("data-category") for s in segs[0]] == list(CATEGORIES)
    assert [s.get("data-category") for s in segs[1]] == ["Convolution", "GEMM"]  # zero/NaN/unknown not drawn
    width = lambda seg: float(seg.get("width"))  # noqa: E731
    assert width(segs[0][0]) == pytest.approx(4 * width(segs[1][0]), rel=0.01)
    assert [t for t in texts(root) if t in CATEGORIES] == list(CATEGORIES)  # the legend
    assert "no category timings" in texts(parse(charts.category_bars([("x", {})])))


def test_forest_plot_rows_band_and_missing_intervals():
    rows = [
        {"label": "SME2 off→on", "ratio": 3.9, "ci_low": 3.7, "ci_high": 4.1, "verdict": "speedup"},
        {"label": "A→B", "ratio": 1.01, "ci_low": None, "ci_high": None, "verdict": "no significant difference"},
        {"label": "C→D", "ratio": None, "ci_low": None, "ci_high": None, "verdict": "insufficient data"},
        {"label": "E→F", "ratio": 0.8, "ci_low": 0.75, "ci_high": 0.85, "verdict": "slowdown"},
    ]
    root = parse(charts.forest_plot(rows, min_effect=0.02))
    got = cls(root, "row")
    assert [g.get("data-verdict") for g in got] == [r["verdict"] for r in rows]
    assert len(cls(got[0], "interval")) == 1 and len(cls(got[1], "interval")) == 0
    assert "no interval" in " ".join(texts(got[1]))
    assert "no ratio" in texts(got[2])
    band = cls(root, "min-effect")[0]
    assert float(band.get("width")) > 0
    # log axis: the speedup point is right of the band, the slowdown left of it
    px = lambda g: float(cls(g, "point")[0].get("x")) + 5  # the square's centre  # noqa: E731
    assert px(got[3]) < float(band.get("x")) < px(got[1]) < float(band.get("x")) + float(band.get("width")) < px(got[0])
    assert "no comparisons" in texts(parse(charts.forest_plot([])))


def test_line_chart_points_spread_gaps_and_changes():
    pts = [{"median_ms": 10 + 0.1 * i, "low_ms": 9.8 + 0.1 * i, "high_ms": 10.2 + 0.1 * i,
            "at": f"2026-11-{i + 1:02d}T03:00:00", "experiment_id": 100 + i} for i in range(6)]
    pts[3] = {"median_ms": float("nan"), "at": "2026-11-04"}
    pts[5].update(median_ms=11.0, low_ms=10.8, high_ms=11.2)
    changes = [{"point_index": 5, "direction": "regression", "status": "candidate", "ratio": 0.93,
                "experiment_id": 105, "baseline_experiment_id": 104},
               {"point_index": 99, "direction": "improvement"}]  # out of range: ignored
    root = parse(charts.line_chart(pts, changes=changes, spread="95% interval"))
    assert [p.get("data-index") for p in cls(root, "point")] == ["0", "1", "2", "4", "5"]
    assert len(cls(root, "line")) == 2  # broken at the NaN point
    assert len(cls(root, "spread")) == 2
    [mark] = cls(root, "change")
    assert mark.get("data-direction") == "regression" and mark.get("data-point-index") == "5"
    assert "2026-11-01" in texts(root) and "95% interval" in root[1].text
    # higher latency is drawn higher up
    cy = lambda i: float(cls(root, "point")[i].find(NS + "circle").get("cy"))  # noqa: E731
    assert cy(4) < cy(0)
    assert "no points yet" in texts(parse(charts.line_chart([])))
    one = parse(charts.line_chart([{"median_ms": 5.0}]))  # a single point, no spread: still a chart
    assert len(cls(one, "point")) == 1


def test_nice_ticks_and_fmt():
    assert charts.nice_ticks(0, 10) == [0, 2.5, 5, 7.5, 10]
    assert charts.nice_ticks(0.93, 1.07)[0] >= 0.93
    assert charts.nice_ticks(1, 1) == [1]
    assert charts.fmt(0.042151) == "0.04215" and charts.fmt(12.345) in ("12.35", "12.34")
    assert charts.fmt(None) == "—" and charts.fmt(float("nan")) == "—"


def test_distribution_far_outlier_counted_not_stretching_the_axis():
    x = list(np.random.default_rng(2).normal(0.055, 0.001, 59)) + [1.9]  # a cold first iteration
    root = parse(charts.distribution_chart([("off", x)]))
    [mark] = cls(root, "outliers")
    assert mark.get("data-side") == "above" and mark.get("data-count") == "1"
    ticks = [float(t) for t in texts(root) if re.fullmatch(r"[0-9.]+", t)]
    assert max(ticks) < 0.1  # the axis is the bulk's, not the outlier's
    assert cls(root, "arm")[0].get("data-n") == "60"  # still counted in n


def test_line_chart_labels_tell_same_day_points_apart():
    same_minute = [{"median_ms": 1.0, "at": f"2026-11-22T10:46:0{i}+00:00"} for i in range(3)]
    assert [t for t in texts(parse(charts.line_chart(same_minute))) if t.startswith("10:46")] == ["10:46:00", "10:46:01", "10:46:02"]
    nights = [{"median_ms": 1.0, "at": f"2026-11-{d:02d}T03:00:00"} for d in (1, 2)]
    assert "2026-11-02" in texts(parse(charts.line_chart(nights)))


def test_quantiles_and_binned_density_match_numpy(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.gamma(3, 1, 1001)
    s = np.sort(x)
    for p in (5, 10, 25, 50, 75, 90, 95):
        for method in ("linear", "lower", "higher"):
            assert charts._sorted_percentile(s, p, method) == pytest.approx(float(np.percentile(x, p, method=method)), abs=1e-12)
    # a long arm is binned before the density: same shape as the exact sum over samples
    big = np.sort(rng.normal(10, 1, charts.KDE_BINS * 3))
    grid = np.linspace(6, 14, 96)
    binned = charts._kde(big, grid)
    monkeypatch.setattr(charts, "KDE_BINS", 10**9)
    exact = charts._kde(big, grid)
    assert np.max(np.abs(binned - exact)) < 1e-3 * exact.max()
    assert np.trapezoid(exact, grid) == pytest.approx(1.0, abs=0.01)


def _ticks(root) -> list[float]:
    return [float(t) for t in texts(root) if re.fullmatch(r"[0-9.]+", t)]


def test_distribution_axis_ignores_a_tenth_of_outliers_and_labels_sit_beside_the_violin():
    """The tester's case: medians 0.04-0.06 ms, a few 3 ms iterations (10% of an arm): the axis is
    the bulk's (both violins drawn with height), the slow ones counted at the edge."""
    rng = np.random.default_rng(5)
    a = list(rng.normal(0.055, 0.002, 18)) + [3.0, 2.9]
    b = list(rng.normal(0.041, 0.0015, 20))
    root = parse(charts.distribution_chart([("SME2 off · 1 thr", a), ("SME2 off · 4 thr", b)]))
    assert max(_ticks(root)) < 0.1
    [mark] = cls(root, "outliers")
    assert mark.get("data-count") == "2"
    for arm in cls(root, "arm"):
        [poly] = cls(arm, "violin")
        pts = [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
        ys = [y for _, y in pts]
        assert max(ys) - min(ys) > 20  # a violin, not a flat line
        label = cls(arm, "median-label")[0]
        y_med = float(cls(arm, "median")[0].get("y1"))
        near = [x for x, y in pts if abs(y - y_med) < 4]
        assert float(label.get("x")) > max(near), "the median label overlaps the violin"


def shown_lines(text: ET.Element) -> list[str]:
    """What a <text> draws: its <tspan> lines, or its own text (never its <title>)."""
    spans = text.findall(NS + "tspan")
    return [t.text or "" for t in spans] if spans else [text.text or ""]


def test_long_labels_wrap_and_what_does_not_fit_is_cut_with_the_full_text_in_a_title():
    label = "model B · SME2 off · 16 thr · a-very-long-device-serial-number-0123456789"
    dist = parse(charts.distribution_chart([(label, [1.0, 1.1, 1.2, 1.3]), ("b", [1.0]), ("c", [1.0]), ("d", [1.0])]))
    [cut] = [t for t in dist.iter(NS + "text") if t.get("data-full") == label]
    lines = shown_lines(cut)
    assert len(lines) == charts.LABEL_LINES and lines[0].startswith("model B ·") and lines[-1].endswith("…")
    assert cut.find(NS + "title").text == label
    slot = (640 - 76) / 4
    assert all(charts.text_px(line, bold=True) <= slot - 10 for line in lines)  # each line fits its slot
    # a name that fits two lines is wrapped whole, not cut
    arm = "SME2 on · qemu-arm64-vm · emulated"
    dist = parse(charts.distribution_chart([(arm, [1.0, 1.1, 1.2]), ("b", [1.0]), ("c", [1.0]), ("d", [1.0])]))
    [text] = [t for t in dist.iter(NS + "text") if "".join(t.itertext()).startswith("SME2 on")]
    assert " ".join(shown_lines(text)) == arm and text.get("data-full") is None
    bars = parse(charts.category_bars([(label, {"GEMM": 1.0})]))
    [cut] = [t for t in bars.iter(NS + "text") if t.get("data-full") == label]
    assert cut.find(NS + "title").text == label and len(" ".join(shown_lines(cut))) < len(label)
    short = parse(charts.category_bars([("SME2 off · 1 thr", {"GEMM": 1.0})]))
    assert "SME2 off · 1 thr" in texts(short)  # what fits is not cut


def test_text_width_is_measured_per_character():
    assert charts.text_px("iiii") < charts.text_px("MMMM") < charts.text_px("MMMM", bold=True)
    assert charts.text_px("M", 24) == 2 * charts.text_px("M", 12)


def test_line_chart_axis_follows_the_medians_not_p90_of_ten_iterations():
    """A +38% median step with p90 near the worst of 10 iterations: the axis is the medians', the
    far whisker ends clipped and marked, the step spans a good part of the plot."""
    meds = [0.050, 0.051, 0.050, 0.069, 0.069]
    pts = [{"median_ms": m, "low_ms": m * 0.97, "high_ms": h, "at": f"2026-11-{i + 1:02d}T03:00:00"}
           for i, (m, h) in enumerate(zip(meds, [0.052, 0.38, 0.77, 0.071, 1.3]))]
    root = parse(charts.line_chart(pts, spread="95% interval of the median"))
    assert max(_ticks(root)) < 0.12
    cy = [float(p.find(NS + "circle").get("cy")) for p in cls(root, "point")]
    assert cy[2] - cy[3] > 0.25 * (280 - 44 - 34)  # the step is plain to see
    assert {c.get("data-side") for c in cls(root, "clipped")} == {"above"} and len(cls(root, "clipped")) == 3
    [legend] = cls(root, "legend")
    assert legend.get("data-spread") == "95% interval of the median"
    assert "band and whiskers: 95% interval of the median" in texts(root)


def test_line_chart_points_without_samples_say_so():
    root = parse(charts.line_chart([{"median_ms": None, "at": "2026-11-22"}] * 2))
    assert "2 point(s), none with samples" in texts(root) and "no points yet" not in texts(root)


def test_median_interval_order_statistics():
    from sme2farm.server.services.charts import median_interval

    assert median_interval([[1, 2, 3, 4, 5]]) is None  # no 95% interval from 5 values
    assert median_interval([list(range(1, 11))]) == (2.0, 9.0)  # x(2)..x(9): 97.9%
    assert median_interval([list(range(1, 11)), list(range(11, 21))]) == (6.0, 15.0)  # sessions pooled
    assert median_interval([list(range(1, 101))]) == (40.0, 61.0)
    x = [0.05] * 9 + [3.0]  # one slow iteration of ten does not make the interval
    assert median_interval([x]) == (0.05, 0.05)
    # coverage close to 95% by simulation, for small n
    rng = np.random.default_rng(0)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (median_interval([rng.normal(0, 1, 12)]) for _ in range(400)))
    assert 0.92 <= hits / 400 <= 1.0


def test_category_bars_of_an_arm_are_trimmed_means_so_one_preempted_iteration_does_not_stack_them():
    """A new user's A/B page showed model B's bar at 0.70 ms per iteration beside a 0.056 ms
    median latency: a 12 ms iteration in the plain mean."""
    from types import SimpleNamespace

    from sme2farm.server.services.charts import _categories

    rng = np.random.default_rng(1)
    gemm = list(0.04 * np.exp(rng.normal(0, 0.02, 20)))
    gemm[10] = 12.0
    other = list(0.01 * np.exp(rng.normal(0, 0.02, 20)))
    cats = {"GEMM": gemm, "Other": other, "Convolution": [0.0] * 20, "Data Movement": [0.0] * 20, "Elementwise": [0.0] * 20}
    run = SimpleNamespace(result=SimpleNamespace(analysis={"category_iterations_ms": cats},
                                                 categories_ms={c: float(np.mean(v)) for c, v in cats.items()}))
    bars = _categories([run, run])
    assert bars["GEMM"] == pytest.approx(0.04, rel=0.05) and bars["Other"] == pytest.approx(0.01, rel=0.05)
    legacy = SimpleNamespace(result=SimpleNamespace(analysis={}, categories_ms={"GEMM": 0.5}))
    assert _categories([legacy])["GEMM"] == 0.5  # stored without samples: their means
