"""An experiment's charts as SVG (analysis/charts.py draws; this picks the data from stored rows).

The same SVG goes to the dashboard (inserted inline), to `sme2-client report` documents and to
anyone who GETs it, so every view of an experiment shows one drawing of it.

- ``distribution``: per arm (device x threads x mode x model variant x SME2 setting) the pooled
  per-iteration latencies of its succeeded runs (all sessions); an emulated arm is named under
  the chart, never drawn on the measured axis (an emulator's time is no CPU's);
- ``categories``: per arm the mean ms per iteration of each category over its sessions; emulated
  arms in a panel of their own, as shares of the emulator's time (no ms);
- ``verdicts``: the experiment's comparisons (kind sme2 and kind model) as a forest plot;
  incomplete ones are listed with their verdict "incomplete" and no ratio, emulated ones with
  "no speed verdict";
- ``scaling``: speedup against threads (services/scaling.py), one series per device x core mask
  x SME2 setting (x model variant) of every device the view covers, experiments joined with
  ``joined`` (GET ...?with=) included; an emulated device is named under the legend, not drawn.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from sqlalchemy.orm import Session

from sme2farm.analysis import charts
from sme2farm.analysis.categories import CATEGORIES
from sme2farm.analysis.stats import pooled, trimmed_mean
from sme2farm.protocol import Comparison, ComparisonSide, RunStatus, SeriesKey, SeriesPoint
from sme2farm.server.store.models import Experiment, Run
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import scaling as scaling_service
from sme2farm.server.services import suites as suite_service
from sme2farm.server.services.errors import Invalid, NotFound
from sme2farm.server.services.stored import device_kind, report_samples

NAMES = ("distribution", "categories", "verdicts", "scaling")


def _key(run: Run) -> tuple:
    serial = device_kind(run.device_snapshot).serial or ""
    return (serial, run.threads, run.mode, getattr(run, "variant", None) or "A", run.sme2)


def arm_label(key: tuple, varying: set[int], two_models: bool) -> str:
    """'SME2 on', or with what else tells arms apart: 'B · SME2 on · 4 threads · <serial>'."""
    serial, threads, mode, variant, sme2 = key
    parts = []
    if two_models:
        parts.append(f"model {variant}")
    parts.append(f"SME2 {sme2}")
    if 1 in varying:
        parts.append(f"{threads} thr")
    if 2 in varying:
        parts.append(mode)
    if 0 in varying:
        parts.append(serial)
    return " · ".join(parts)


def arms(exp: Experiment) -> list[tuple[str, list[Run], str | None]]:
    """The experiment's arms with at least one succeeded run, in a stable order, labelled, each
    with the emulator that ran it (None: hardware)."""
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in exp.runs:
        if r.status == RunStatus.succeeded and r.result is not None:
            groups[_key(r)].append(r)
    keys = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], k[4] != "off"))
    varying = {i for i in range(5) if len({k[i] for k in keys}) > 1}
    two_models = exp.vs_model_sha256 is not None if hasattr(exp, "vs_model_sha256") else False
    return [(arm_label(k, varying, two_models), groups[k],
             next((e for r in groups[k] if (e := device_service.emulator_of(r.device_snapshot))), None))
            for k in keys]


def _iterations(run: Run) -> list[float]:
    return list(report_samples(run.result.analysis).iterations_ms or [])


def _categories(runs: list[Run]) -> dict[str, float]:
    """Each category's 10% trimmed mean per iteration over the arm's iterations, as the verdicts
    and shares of analysis.compare use: a plain mean let one preempted iteration stack a bar 12x
    taller than the median latency. Runs stored without per-iteration samples use their means."""
    out = {}
    for c in CATEGORIES:
        samples = pooled([(report_samples(r.result.analysis).category_iterations_ms or {}).get(c) or [] for r in runs])
        if samples.size:
            out[c] = trimmed_mean(samples)
        else:
            vals = [float((r.result.categories_ms or {}).get(c) or 0.0) for r in runs]
            out[c] = sum(vals) / len(vals) if vals else 0.0
    return out


def comparison_label(c: Comparison, multi_where: bool) -> str:
    if c.kind == "model":
        head = f"A→B · SME2 {c.sme2}" + (" (A/A)" if c.a_a else "")
    else:
        head = "SME2 off→on" + (f" · model {c.variant}" if c.variant == "B" else "")
    if multi_where:
        head += f" · {c.threads} thr · {c.device or c.device_model or '?'}"
    return head


def side_ref(side: ComparisonSide) -> str:
    """A side of GET /comparisons as it was asked for: R34, E12, or E12/B (model B of a --vs experiment)."""
    if side.kind == "run":
        return f"R{side.id}"
    return f"E{side.id}" + ("/B" if side.variant == "B" else "")


def forest_rows(comparisons: list[Comparison | dict], *, label=None) -> tuple[list[dict], float | None]:
    """Forest-plot rows of comparison entries (experiment comparisons or GET /comparisons entries;
    stored JSON is read through the contract once here) and the minimum effect they were judged at
    (None if none says). `label`: a Comparison's row label."""
    comps = [c if isinstance(c, Comparison) else Comparison.model_validate(c) for c in comparisons]
    wheres = {(c.threads, c.device or c.device_model, c.mode) for c in comps}
    label = label or (lambda c: comparison_label(c, len(wheres) > 1))
    rows, min_effect = [], None
    for c in comps:
        if c.emulated:  # no ratio (analysis.compare_emulated): a row that says so, with its sentence
            rows.append({"label": f"{label(c)} · emulated", "ratio": None, "ci_low": None, "ci_high": None,
                         "verdict": "emulated", "note": "no speed verdict", "emulated": True,
                         "sentence": c.sentence})
            continue
        complete = c.status == "complete"
        rows.append({"label": label(c), "ratio": c.speedup if complete else None,
                     "ci_low": c.ci_low if complete else None, "ci_high": c.ci_high if complete else None,
                     "verdict": (c.verdict or "no verdict") if complete else "incomplete",
                     "sentence": c.sentence if complete else c.reason})
        if complete and min_effect is None and c.min_effect is not None:
            min_effect = float(c.min_effect)
    return rows, min_effect


SERIES_SPREAD = "95% interval of the median"


def median_interval(samples, level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free interval of the median of the pooled iterations: the order statistics
    x(k)..x(n+1-k) with k the largest rank whose binomial tail P(Bin(n, 1/2) < k) stays within
    (1 - level) / 2. Meaningful for 10 iterations (x(2)..x(9), 97.9%), unlike p10..p90 which is
    then the worst sample or two. None below 6 iterations (no 95% interval exists)."""
    x = np.sort(pooled([s for s in (samples or []) if s is not None]))
    n = x.size
    if n < 6:
        return None
    tail = (1.0 - level) / 2
    if n <= 1000:  # exact, in integers: the largest k with sum_{i<k} C(n, i) <= tail * 2^n
        budget, below, k = tail * 2 ** n, 0, 0
        while below + math.comb(n, k) <= budget:
            below += math.comb(n, k)
            k += 1
    else:
        k = int(math.floor(n / 2 - 1.959963985 * math.sqrt(n) / 2))
    k = max(k, 1)
    return float(x[k - 1]), float(x[n - k])


def series_chart_points(session: Session, *, suite, key: SeriesKey, points: list[SeriesPoint]) -> list[dict]:
    """The series' points (as JSON) with low_ms/high_ms replaced by each point's 95% interval of
    the median (from its stored samples), for the chart; a point without one keeps no spread."""
    dumped = [p.model_dump(mode="json") for p in points]
    stored = suite_service.series_points(session, suite_id=suite.id,
                                         key=(key.model_sha256, key.device_model, key.sme2, key.threads))
    if len(stored) != len(points):  # written while we read: draw what the JSON says
        return dumped
    out = []
    for point, p, sp in zip(points, dumped, stored):
        iv = median_interval(sp.samples) if point.median_ms is not None else None
        out.append({**p, "low_ms": iv[0] if iv else None, "high_ms": iv[1] if iv else None})
    return out


def render(exp: Experiment, name: str) -> str:
    """One chart of a loaded experiment (runs and results loaded)."""
    title_of = f"experiment {exp.id}" + (f" · {exp.name}" if exp.name else "")
    every = arms(exp)
    measured = [(label, runs) for label, runs, emulator in every if emulator is None]
    emulated = [(label, runs, emulator) for label, runs, emulator in every if emulator is not None]
    emulators = ", ".join(dict.fromkeys(e for _, _, e in emulated)) or None
    if name == "distribution":
        by_emulator: dict[str, list[str]] = defaultdict(list)
        for label, _, emulator in emulated:
            by_emulator[emulator].append(label)
        left_out = [f"Not drawn, emulated by {emulator} (an emulator's time is no CPU's latency): {', '.join(labels)}"
                    for emulator, labels in by_emulator.items()] if measured else []
        return charts.distribution_chart([(label, np.concatenate([np.asarray(_iterations(r), dtype=np.float64) for r in runs]))
                                          for label, runs in measured],
                                         title=f"Latency per iteration, {title_of}", emulated=emulators,
                                         left_out=left_out)
    if name == "categories":
        return charts.category_bars([(label, _categories(runs)) for label, runs in measured],
                                    emulated=[(label, _categories(runs)) for label, runs, _ in emulated],
                                    emulator=emulators,
                                    title=f"Where the time goes (ms per iteration, 10% trimmed mean), {title_of}")
    if name == "verdicts":
        rows, min_effect = forest_rows(list(exp.comparisons or []))
        return charts.forest_plot(rows, min_effect=min_effect, title=f"Verdicts, {title_of}")
    raise NotFound(f"no chart {name!r}; charts are {', '.join(NAMES)}")


def experiment_chart(session: Session, *, experiment_id: int, name: str, joined: list[int] | None = None) -> str:
    """One chart of an experiment. `joined` (other experiments of the same model) is for the
    scaling chart only: Invalid for any other chart."""
    if name not in NAMES:
        raise NotFound(f"no chart {name!r}; charts are {', '.join(NAMES)}")
    if name == "scaling":
        return scaling_chart(session, experiment_id=experiment_id, joined=joined)
    if joined:
        raise Invalid(f"with: only the scaling chart joins other experiments, not the {name} chart")
    exp = experiment_service.get(session, experiment_id=experiment_id)
    if exp is None:
        raise NotFound(f"experiment {experiment_id} not found")
    return render(exp, name)


def scaling_chart(session: Session, *, experiment_id: int, joined: list[int] | None = None) -> str:
    """The scaling view (services/scaling.py, with `joined`'s runs) drawn: one series per device
    and arm, named '<device> · <arm>' in the legend. An emulated device's runs give no speed
    figure: it is named under the legend, not drawn (every device emulated: the chart says so)."""
    view = scaling_service.for_experiment(session, experiment_id=experiment_id, joined=joined)
    title = f"Speedup against threads, experiment {experiment_id}"
    if view.joined:
        title += f" with {', '.join(map(str, view.joined))}"
    masked = any(a.core_mask is not None for d in view.devices for a in d.arms)
    series, left_out, emulators = [], [], []
    for d in view.devices:
        where = d.device or d.device_model or "?"
        if d.emulated:
            emulators.append(d.emulator or "an emulator")
            left_out.append(f"{where}: emulated by {d.emulator or 'an emulator'}, counts only, no speed figure")
            continue
        for a in d.arms:
            name = a.name + (", no core mask" if masked and a.core_mask is None else "")
            series.append({**a.model_dump(mode="json"), "name": f"{where} · {name}", "device": where})
    if view.devices and not series:
        return charts.scaling_chart([], title=title, emulated=", ".join(dict.fromkeys(emulators)))
    return charts.scaling_chart(series, title=title, left_out=left_out)
