"""What `sme2-client report` fetches for its document: the experiment's typed report (every run
and comparison in full, whatever its size), the server's charts as SVG (GET
/experiments/{id}/charts/{name}.svg, drawn by analysis/charts.py, so the document shows exactly
what the dashboard shows) and, where the experiment scales, its thread scaling view."""

from __future__ import annotations

from typing import NamedTuple

from sme2farm.client.api import FarmClient
from sme2farm.client.document_blocks import CHARTS, scales
from sme2farm.protocol import ExperimentReport, ScalingRead


class Fetched(NamedTuple):
    """The experiment's report, {chart name: SVG text or None}, {chart name (or "scaling", the
    view): why it is missing}, and its scaling view (None: it has none, or the server refused it)."""

    report: ExperimentReport
    svgs: dict[str, str | None]
    missing: dict[str, str]
    scaling: ScalingRead | None = None


def fetch(client: FarmClient, experiment_id: int, joined: list[int] | None = None) -> Fetched:
    """The report, its charts and its scaling view. `joined`: other experiments of the same model
    whose runs join the scaling view and chart (?with=); a list the server refuses (another model,
    an unknown id) is a FarmError, not a gap."""
    # every run and every comparison in full, whatever the experiment's size: the document's latency,
    # categories and kernel-path sections are built from the runs (a summary, the default answer above
    # 2,000 runs, has none) and its comparisons show operators, narrative and numerics per output
    rep = client.experiment(experiment_id, runs="full")
    view = client.scaling(experiment_id, joined) if joined else None
    svgs: dict[str, str | None] = {}
    missing: dict[str, str] = {}
    for name, _ in CHARTS:
        if name == "verdicts" and not rep.comparisons or name == "scaling" and not scales(rep, joined):
            svgs[name] = None
            continue
        if name == "scaling" and joined:
            svgs[name] = client.scaling_chart(experiment_id, joined)
            continue
        r = client.http.get(f"/experiments/{experiment_id}/charts/{name}.svg")
        if r.status_code == 200 and r.text.lstrip().startswith("<svg"):
            svgs[name] = r.text
        else:
            svgs[name] = None
            missing[name] = f"the server answered {r.status_code} for the {name} chart"
    if view is None and scales(rep):
        r = client.http.get(f"/experiments/{experiment_id}/scaling")
        if r.status_code == 200:
            view = ScalingRead.model_validate(r.json())
        else:
            missing["scaling"] = f"the server answered {r.status_code} for the scaling view"
    return Fetched(rep, svgs, missing, view)
