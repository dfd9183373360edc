"""The scaling service over stored runs (SQLite and PostgreSQL): a device's clusters (read from
/proc/cpuinfo by runners/cpuinfo.clusters) offered back as core masks, experiments of one model
run on different clusters joined into one view that names the fastest cluster per arm, a joined
experiment of another model refused, and an emulated device's view without any speed figure."""

from __future__ import annotations

import pytest

from _fixtures_scaling import CLUSTERS, scaling_device, scaling_experiment, scaling_svg
from sme2farm.runners import cpuinfo

LITTLE = {("off", 1): 9.0, ("off", 2): 5.0, ("on", 1): 6.0, ("on", 2): 3.3}
BIG = {("off", 1): 4.0, ("off", 2): 2.2, ("on", 1): 1.5, ("on", 2): 1.45}


def test_cpuinfo_groups_cores_by_part_and_reads_sme2_per_cluster():
    assert CLUSTERS == [{"name": "cluster 0 (0xd05)", "cores": [0, 1, 2, 3], "sme2": False},
                        {"name": "cluster 1 (0xd87)", "cores": [4, 5, 6, 7], "sme2": True}]
    one_kind = "\n\n".join(f"processor\t: {i}\nCPU part\t: 0xd05" for i in range(4))
    assert cpuinfo.clusters(one_kind) == [] and cpuinfo.clusters("") == []


def test_clusters_joined_into_one_view_name_the_fastest_per_arm(db_url):
    from sme2farm.server.services import scaling
    from sme2farm.server.services.errors import Invalid
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        device = scaling_device(s)
        little = scaling_experiment(s, device, LITTLE, mask="0f")
        big = scaling_experiment(s, device, BIG, mask="F0", seed=1)
        other = scaling_experiment(s, device, {("off", 1): 1.0}, sha="b" * 64)
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
    from sme2farm.server.services import charts, scaling
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        device = scaling_device(s, emulator="qemu-aarch64 -cpu max")
        exp = scaling_experiment(s, device, LITTLE)
        [d] = scaling.for_experiment(s, experiment_id=exp.id).devices
        drawn = scaling_svg(charts.experiment_chart(s, experiment_id=exp.id, name="scaling"))
        assert d.emulated and d.emulator == "qemu-aarch64 -cpu max" and d.sme2_ratio == [] and d.fastest == []
        for arm in d.arms:
            assert arm.best_threads is None and all(p.median_ms is None and p.speedup is None for p in arm.points)
            assert [p.n for p in arm.points] == [30, 30]
    assert drawn["series"] == {} and drawn["legend"] == []
    assert drawn["empty"] == "emulated (qemu-aarch64 -cpu max): no speed figures"


def test_the_chart_draws_every_device_and_every_joined_core_mask(db_url):
    """Two measured devices run the experiment (cores 0-3), one of them also the joined one (cores
    4-7), an emulated device runs it too: the chart has one series per device x core mask x SME2
    setting, named in its legend, each with both thread counts; the emulated device is named
    under the legend, not drawn."""
    from sme2farm.server.services import charts, scaling
    from sme2farm.server.services.errors import Invalid, NotFound
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        a, b = scaling_device(s, "phone-a"), scaling_device(s, "phone-b")
        emulated = scaling_device(s, "qemu-box", emulator="qemu-aarch64 -cpu max")
        little = scaling_experiment(s, [a, b, emulated], LITTLE, mask="0f")
        big = scaling_experiment(s, [a], BIG, mask="f0", seed=1)
        other = scaling_experiment(s, [a], {("off", 1): 1.0}, sha="b" * 64)
        view = scaling.for_experiment(s, experiment_id=little.id, joined=[big.id])
        joined = scaling_svg(charts.experiment_chart(s, experiment_id=little.id, name="scaling", joined=[big.id]))
        alone = scaling_svg(charts.experiment_chart(s, experiment_id=little.id, name="scaling"))
    assert [d.device for d in view.devices] == ["phone-a", "phone-b", "qemu-box"]
    want = [f"{d.device} · {arm.name}" for d in view.devices if not d.emulated for arm in d.arms]
    assert list(joined["series"]) == joined["legend"] == want and len(want) == 6
    assert {(v["device"], v["core_mask"], v["sme2"]) for v in joined["series"].values()} == {
        ("phone-a", "f", "off"), ("phone-a", "f", "on"), ("phone-a", "f0", "off"), ("phone-a", "f0", "on"),
        ("phone-b", "f", "off"), ("phone-b", "f", "on")}
    assert "phone-b · SME2 on, cores f (cluster 0 (0xd05))" in joined["legend"]
    assert "phone-a · SME2 on, cores f0 (cluster 1 (0xd87))" in joined["legend"]
    assert all(v["threads"] == [1, 2] for v in joined["series"].values())
    assert joined["left_out"] == ["qemu-box: emulated by qemu-aarch64 -cpu max, counts only, no speed figure"]
    assert not any("qemu-box" in name for name in joined["series"])
    assert joined["title"] == f"Speedup against threads, experiment {little.id} with {big.id}"
    # without with=: both measured devices, the experiment's own mask only
    assert {(v["device"], v["core_mask"]) for v in alone["series"].values()} == {("phone-a", "f"), ("phone-b", "f")}
    assert len(alone["legend"]) == 4 and alone["title"] == f"Speedup against threads, experiment {little.id}"
    with session_scope(db_url) as s:  # what the view refuses, the chart refuses alike
        with pytest.raises(Invalid, match="ran another model"):
            charts.experiment_chart(s, experiment_id=little.id, name="scaling", joined=[other.id])
        with pytest.raises(NotFound, match="with: experiment 999999 not found"):
            charts.experiment_chart(s, experiment_id=little.id, name="scaling", joined=[999999])
        with pytest.raises(Invalid, match="only the scaling chart joins"):
            charts.experiment_chart(s, experiment_id=little.id, name="distribution", joined=[big.id])
