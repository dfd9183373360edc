"""The scaling service over stored runs (SQLite and PostgreSQL): a device's clusters (read from
/proc/cpuinfo by runners/cpuinfo.clusters) offered back as core masks, experiments of one model
run on different clusters joined into one view that names the fastest cluster per arm, a joined
experiment of another model refused, and an emulated device's view without any speed figure."""

from __future__ import annotations

import numpy as np
import pytest

from sme2farm.runners import cpuinfo

BIG_LITTLE = "\n\n".join(
    f"processor\t: {i}\nFeatures\t: fp asimd{' sme sme2' if i >= 4 else ''}\nCPU implementer\t: 0x41\n"
    f"CPU part\t: {'0xd05' if i < 4 else '0xd87'}" for i in range(8))
CLUSTERS = cpuinfo.clusters(BIG_LITTLE)


def test_cpuinfo_groups_cores_by_part_and_reads_sme2_per_cluster():
    assert CLUSTERS == [{"name": "cluster 0 (0xd05)", "cores": [0, 1, 2, 3], "sme2": False},
                        {"name": "cluster 1 (0xd87)", "cores": [4, 5, 6, 7], "sme2": True}]
    one_kind = "\n\n".join(f"processor\t: {i}\nCPU part\t: 0xd05" for i in range(4))
    assert cpuinfo.clusters(one_kind) == [] and cpuinfo.clusters("") == []


def _rows(session, *, emulator=None):
    from sme2farm.server.store.models import Agent, Device, Model

    agent = Agent(name="lab", hostname="h")
    session.add(agent)
    session.flush()
    info = {"serial": "phone", "platform": "android", "model": "Big Little", "cpu_cores": 8, "clusters": CLUSTERS,
            "emulator": emulator}
    device = Device(agent_id=agent.id, serial="phone", platform="android", sme2=True, info=info)
    session.add(device)
    session.add_all([Model(sha256="a" * 64, size=1), Model(sha256="b" * 64, size=1)])
    session.flush()
    return device


def _experiment(session, device, medians: dict[tuple[str, int], float], *, mask=None, sha="a" * 64, seed=0):
    from sme2farm.server.store.models import Experiment, Run, RunResult

    rng = np.random.default_rng(seed)
    threads = sorted({t for _, t in medians})
    exp = Experiment(model_sha256=sha, spec={"sme2": "both", "threads": threads, "core_mask": mask}, labels={})
    session.add(exp)
    session.flush()
    for (sme2, t), ms in medians.items():
        run = Run(experiment_id=exp.id, device_id=device.id, sme2=sme2, threads=t, mode="timing", status="succeeded",
                  device_snapshot=device.info)
        session.add(run)
        session.flush()
        x = (ms * np.exp(rng.normal(0, 0.01, 30))).tolist()
        session.add(RunResult(run_id=run.id, e2e_median_ms=float(np.median(x)), e2e_mean_ms=float(np.mean(x)),
                              e2e_p10_ms=min(x), e2e_p90_ms=max(x), e2e_cv=0.01, n=30, categories_ms={},
                              analysis={"iterations_ms": x}))
    session.flush()
    return exp


def test_clusters_joined_into_one_view_name_the_fastest_per_arm(db_url):
    from sme2farm.server.services import scaling
    from sme2farm.server.services.errors import Invalid
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        device = _rows(s)
        little = _experiment(s, device, {("off", 1): 9.0, ("off", 2): 5.0, ("on", 1): 6.0, ("on", 2): 3.3}, mask="0f")
        big = _experiment(s, device, {("off", 1): 4.0, ("off", 2): 2.2, ("on", 1): 1.5, ("on", 2): 1.45}, mask="F0",
                          seed=1)
        other = _experiment(s, device, {("off", 1): 1.0}, sha="b" * 64)
        alone = scaling.for_experiment(s, experiment_id=little.id)
        assert [c.mask for c in alone.devices[0].clusters] == ["f", "f0"]
        assert any("--core-mask f0 (SME2)" in line for line in alone.devices[0].sentences)
        view = scaling.for_experiment(s, experiment_id=little.id, joined=[big.id])
        assert view.joined == [big.id] and view.core_mask == "f"
        [d] = view.devices
        assert {(a.sme2, a.core_mask) for a in d.arms} == {("off", "f"), ("on", "f"), ("off", "f0"), ("on", "f0")}
        assert {a.cluster for a in d.arms} == {"cluster 0 (0xd05)", "cluster 1 (0xd87)"}
        fastest = {f.sme2: f for f in d.fastest}
        assert (fastest["off"].core_mask, fastest["off"].threads) == ("f0", 2)
        assert fastest["on"].core_mask == "f0" and fastest["on"].cluster == "cluster 1 (0xd87)"
        assert "SME2 on is fastest at" in fastest["on"].sentence
        assert "cores f0 (cluster 1 (0xd87))" in fastest["on"].sentence
        ratios = {(r.core_mask, r.threads): r.estimate for r in d.sme2_ratio}
        assert ratios[("f0", 1)] == pytest.approx(4.0 / 1.5, rel=0.03)
        with pytest.raises(Invalid, match="ran another model"):
            scaling.for_experiment(s, experiment_id=little.id, joined=[other.id])


def test_an_emulated_device_gives_counts_and_no_speed(db_url):
    from sme2farm.server.services import scaling
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        device = _rows(s, emulator="qemu-aarch64 -cpu max")
        exp = _experiment(s, device, {("off", 1): 9.0, ("off", 2): 5.0, ("on", 1): 6.0, ("on", 2): 3.3})
        [d] = scaling.for_experiment(s, experiment_id=exp.id).devices
        assert d.emulated and d.emulator == "qemu-aarch64 -cpu max" and d.sme2_ratio == [] and d.fastest == []
        for arm in d.arms:
            assert arm.best_threads is None and all(p.median_ms is None and p.speedup is None for p in arm.points)
            assert [p.n for p in arm.points] == [30, 30]
