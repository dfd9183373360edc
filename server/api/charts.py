"""Charts as SVG (image/svg+xml): an experiment's (GET /experiments/{id}/charts/{name}.svg), a
comparison of two experiments or runs (GET /comparisons/chart.svg) and a suite's series
(GET /suites/{name}/charts/series.svg?<series key>). Read scope, like the JSON
they draw. The SVG is built from escaped text only; the response forbids scripts anyway."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from sme2farm.analysis import charts
from sme2farm.protocol import DEFAULT_MIN_EFFECT
from sme2farm.server.api.comparisons import require_read_sides
from sme2farm.server.api.deps import ExperimentId, SessionDep, SettingsDep, StoreDep, SuiteName, UserDep
from sme2farm.server.api.errors import INVALID, NOT_FOUND
from sme2farm.server.api.scaling import Joined, readable_ids
from sme2farm.server.services import charts as chart_service
from sme2farm.server.services import comparisons as comparison_service
from sme2farm.server.services import owners
from sme2farm.server.services import suites as suite_service
from sme2farm.server.services.errors import NotFound

router = APIRouter(tags=["charts"])
SVG = "image/svg+xml"
# Opened directly (not inlined), an SVG is a document of this origin: no script may run in it.
HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
SVG_RESPONSE = {200: {"content": {SVG: {"schema": {"type": "string"}}}, "description": "the chart as SVG"}}
ChartName = Annotated[str, Path(pattern=r"^[a-z]{1,40}$", description="distribution, categories, verdicts or scaling")]


def svg(text: str) -> Response:
    return Response(text, media_type=SVG, headers=HEADERS)


@router.get("/experiments/{experiment_id}/charts/{name}.svg", response_class=Response,
            responses={**SVG_RESPONSE, **NOT_FOUND, **INVALID})
def experiment_chart(experiment_id: ExperimentId, name: ChartName, session: SessionDep, user: UserDep,
                     settings: SettingsDep, joined: Joined = None) -> Response:
    """`distribution`: latency per iteration of each arm (violins); `categories`: the five
    categories' ms per iteration of each arm (stacked bars); `verdicts`: the experiment's
    comparisons (SME2 off→on, model A→B) as ratio and 95% interval with the minimum-effect band;
    `scaling`: GET /experiments/{id}/scaling drawn, speedup against threads with one series per
    device x core mask x SME2 setting (emulated devices named, not drawn). `with` joins other
    experiments' runs as that view does (the scaling chart only: a 422 for the others)."""
    ids = readable_ids(session, user, settings, experiment_id, joined)
    return svg(chart_service.experiment_chart(session, experiment_id=experiment_id, name=name, joined=ids))


Ref = Annotated[str, Query(min_length=1, max_length=40, description="as for GET /comparisons")]


@router.get("/comparisons/chart.svg", response_class=Response, responses={**SVG_RESPONSE, **NOT_FOUND, **INVALID})
def comparison_chart(baseline: Ref, candidate: Ref, session: SessionDep, user: UserDep, store: StoreDep,
                     settings: SettingsDep,
                     min_effect: Annotated[float, Query(ge=0.0, le=0.5,
                                                        description="as for GET /comparisons")] = DEFAULT_MIN_EFFECT,
                     ) -> Response:
    """GET /comparisons drawn: one forest-plot row per matched device model x SME2 x threads x mode."""
    require_read_sides(session, user, settings, baseline=baseline, candidate=candidate)
    result = comparison_service.between(session, baseline=baseline, candidate=candidate, store=store,
                                        min_effect=min_effect)
    label = (lambda c: f"{c.device_model} · SME2 {c.sme2} · {c.threads} thr"
             + ("" if c.mode == "timing" else f" · {c.mode}"))
    rows, min_effect = chart_service.forest_rows(result.comparisons, label=label)
    name = chart_service.side_ref
    return svg(charts.forest_plot(rows, min_effect=min_effect,
                                  title=f"{name(result.baseline)} → {name(result.candidate)}: ratio and 95% interval"))




@router.get("/suites/{name}/charts/series.svg", response_class=Response, responses={**SVG_RESPONSE, **NOT_FOUND})
def series_chart(name: SuiteName, session: SessionDep, user: UserDep, settings: SettingsDep,
                 model_sha256: Annotated[str, Query(pattern=r"^[0-9a-f]{64}$", description="the series' model")],
                 device_model: Annotated[str, Query(min_length=1, max_length=200)],
                 sme2: Annotated[str, Query(pattern=r"^(off|on)$")],
                 threads: Annotated[int, Query(ge=1, le=1024)]) -> Response:
    """One series of GET /suites/{name}/series (picked by its key) as a line over time: each
    point's median with the 95% interval of that median (order statistics of its iterations:
    meaningful for 10 iterations, where p10..p90 is the worst sample) and the changes detected."""
    suite = suite_service.get(session, name=name)
    owners.require_read_suite(session, token=user, suite=suite, team_only=settings.reads_team_only)
    data = suite_service.series(session, suite=suite)
    key = (model_sha256, device_model, sme2, threads)
    for s in data.series:
        if (s.key.model_sha256, s.key.device_model, s.key.sme2, s.key.threads) == key:
            title = f"{s.key.model_name or model_sha256[:12]} · {device_model} · SME2 {sme2} · {threads} thr"
            points = chart_service.series_chart_points(session, suite=suite, key=s.key, points=s.points)
            return svg(charts.line_chart(points, changes=[c.model_dump(mode="json") for c in s.changes], title=title,
                                         spread=chart_service.SERIES_SPREAD, y_label="median ms"))
    raise NotFound(f"suite {name} has no series for model {model_sha256[:12]}…, {device_model}, SME2 {sme2}, "
                   f"{threads} thread(s)")
