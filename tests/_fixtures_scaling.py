"""Stored rows for the scaling view and its chart: a big.LITTLE Arm device (its clusters read from
/proc/cpuinfo text by runners/cpuinfo.clusters) and experiments whose succeeded runs carry
synthetic iteration times of known medians, written straight into a farm's database (SQLite or
PostgreSQL) so the service and the API draw what the data asks for; and the scaling chart read
back: its series, its legend and what it left out, from the SVG's elements (not its pixels)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from sme2farm.runners import cpuinfo

__all__ = ["BIG_LITTLE", "CLUSTERS", "scaling_device", "scaling_experiment", "scaling_svg"]

BIG_LITTLE = "\n\n".join(
    f"processor\t: {i}\nFeatures\t: fp asimd{' sme sme2' if i >= 4 else ''}\nCPU implementer\t: 0x41\n"
    f"CPU part\t: {'0xd05' if i < 4 else '0xd87'}" for i in range(8))
CLUSTERS = cpuinfo.clusters(BIG_LITTLE)


def scaling_device(session, serial: str = "phone", *, emulator: str | None = None):
    """A device (on an agent of its own) with the BIG_LITTLE clusters; `emulator`: what runs it."""
    from sme2farm.server.store.models import Agent, Device

    agent = Agent(name=f"lab-{serial}", hostname="h")
    session.add(agent)
    session.flush()
    info = {"serial": serial, "platform": "android", "model": "Big Little", "cpu_cores": 8, "clusters": CLUSTERS,
            "emulator": emulator}
    device = Device(agent_id=agent.id, serial=serial, platform="android", sme2=True, info=info)
    session.add(device)
    session.flush()
    return device


def scaling_experiment(session, devices, medians: dict[tuple[str, int], float], *, mask: str | None = None,
                       sha: str = "a" * 64, seed: int = 0):
    """An experiment of model `sha` (stored when new) with one succeeded run per (SME2 setting,
    threads) of `medians` on each of `devices` (one device or a list): 30 iterations around the
    median (1% noise), as ingest stores them."""
    from sme2farm.server.store.models import Experiment, Model, Run, RunResult

    if session.get(Model, sha) is None:
        session.add(Model(sha256=sha, size=1))
        session.flush()
    rng = np.random.default_rng(seed)
    threads = sorted({t for _, t in medians})
    exp = Experiment(model_sha256=sha, spec={"sme2": "both", "threads": threads, "core_mask": mask}, labels={})
    session.add(exp)
    session.flush()
    for device in devices if isinstance(devices, list) else [devices]:
        for (sme2, t), ms in medians.items():
            run = Run(experiment_id=exp.id, device_id=device.id, sme2=sme2, threads=t, mode="timing",
                      status="succeeded", device_snapshot=device.info)
            session.add(run)
            session.flush()
            x = (ms * np.exp(rng.normal(0, 0.01, 30))).tolist()
            session.add(RunResult(run_id=run.id, e2e_median_ms=float(np.median(x)), e2e_mean_ms=float(np.mean(x)),
                                  e2e_p10_ms=min(x), e2e_p90_ms=max(x), e2e_cv=0.01, n=30, categories_ms={},
                                  analysis={"iterations_ms": x}))
    session.flush()
    return exp


NS = "{http://www.w3.org/2000/svg}"


def scaling_svg(svg: str) -> dict:
    """The scaling chart (analysis/charts.scaling_chart) as data: its title; series: {name:
    {device, core_mask, sme2, threads (each point's)}} in drawing order; legend: the names the
    legend entries show, in order; left_out: the lines naming what was not drawn; empty: the
    message of a chart with nothing drawn (else None)."""
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg" and root.get("data-chart") == "scaling", svg[:200]
    series = {}
    legend = []
    for g in root.iter(NS + "g"):
        if g.get("class") == "arm":
            series[g.get("data-arm")] = {
                "device": g.get("data-device"), "core_mask": g.get("data-core-mask"), "sme2": g.get("data-sme2"),
                "threads": [int(p.get("data-threads")) for p in g.iter(NS + "g") if p.get("class") == "point"]}
        elif g.get("class") == "legend-entry":
            [label] = g.iter(NS + "text")
            assert g.get("data-series") == (label.get("data-full") or label.text), "the legend says another name"
            legend.append(g.get("data-series"))
    texts = list(root.iter(NS + "text"))
    empty = [t.text for t in texts if t.get("class") == "empty"]
    return {"title": root.find(NS + "title").text, "series": series, "legend": legend,
            "left_out": [t.get("data-full") or t.text for t in texts if t.get("class") == "left-out"],
            "empty": empty[0] if empty else None}
