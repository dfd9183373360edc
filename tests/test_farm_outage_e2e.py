"""No device is lost to the farm's own absence, on real processes: `sme2-farm up` on
the embedded default and a second agent on "another host" (its own UTS namespace, so its local
device has its own serial), with bounds short enough for a test and respecting each other
(docs/operations.md, "Outages and bounds").

- The API server killed with SIGKILL and kept down longer than the lost bound (its supervisor
  frozen meanwhile, the worker reaping on), the second agent frozen with SIGSTOP through the
  outage and let go longer than the lost bound after the farm is back: no queued run of either
  device is ended, and an experiment and a night's suite run queued across the outage all run.
- A device unplugged while its agent talks on (the second host renamed: its agent reports
  another device) has its queued runs ended within its bound, naming it.

The pieces (the liveness record, the lost clock, jitter) are tested in tests/test_farm_outage.py."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import FarmProbe, farm_on, runners_under, wait_for

LOST_S, OFFLINE_S, LEASE_S, CAP_S = 8.0, 6.0, 5.0, 2.0   # lost >= offline, lost >= cap + lease
SETTLE_S = CAP_S + 5.0
ENV = {"SME2_DEVICE_LOST_S": str(LOST_S), "SME2_AGENT_OFFLINE_S": str(OFFLINE_S), "SME2_LEASE_S": str(LEASE_S),
       "SME2_AGENT_BACKOFF_CAP_S": str(CAP_S), "SME2_HEARTBEAT_INTERVAL_S": "1", "SME2_POLL_TIMEOUT_S": "2"}
TERMINAL = {"succeeded", "failed", "cancelled", "unschedulable"}
HELD = {"assigned", "running"}   # protocol 2: a run is running from its first heartbeat
# ~1-2 s of runner time per run (warm-up executions are not recorded: a small trace)
SLOW = {"sme2": "off", "warmup": 6000, "iterations": 100}
QUICK = {"sme2": "off", "warmup": 2, "iterations": 20}

# The real agent loop in its own process, with a device sync interval of our choosing (the CLI's is 30 s).
AGENT = """
import logging, sys
from pathlib import Path
from sme2farm.agent.api import AgentApi
from sme2farm.agent.drivers.local import LocalDriver
from sme2farm.agent.loop import Agent
from sme2farm.runners.catalog import Catalog
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
server, token, manifest, work, name, sync_s = sys.argv[1:7]
Agent(AgentApi(server, token), [LocalDriver()], Catalog.load(manifest), name=name, work_dir=Path(work),
      device_sync_s=float(sync_s)).serve()
"""

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not __import__("shutil").which("unshare") or not __import__("shutil").which("nsenter"),
                       reason="needs unshare and nsenter (a second host name)"),
]


@contextlib.contextmanager
def second_agent(farm, manifest: Path, workdir: Path, host: str, sync_s: float = 5.0):
    """The agent on "another host" `host`: the process is the agent itself (exec), so a signal
    sent to it reaches the agent, not a shell."""
    if os.geteuid() != 0:
        pytest.skip("a UTS namespace needs root")
    log = open(workdir / f"{host}.log", "w")
    argv = [sys.executable, "-c", AGENT, farm.url, farm.token, str(manifest), str(workdir / host), host, str(sync_s)]
    proc = subprocess.Popen(["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *argv],
                            env=farm.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for pid in runners_under(workdir / host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()


def stopped(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "T"
    return False


def thaw(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def device_of(probe: FarmProbe, serial: str) -> tuple:
    rows = probe.sql("SELECT state, offline_since FROM devices WHERE serial = :s", s=serial)
    return rows[0] if rows else None


def runs_by_device(probe: FarmProbe, experiment_ids: list[int]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for eid in experiment_ids:
        for rid, status, serial, reason, attempt in probe.sql(
                "SELECT r.id, r.status, d.serial, r.reason, r.attempt FROM runs r JOIN devices d ON d.id = r.device_id "
                "WHERE r.experiment_id = :e ORDER BY r.id", e=eid):
            out.setdefault(serial, []).append((rid, status, reason, attempt))
    return out


def none_ended_lost(probe: FarmProbe) -> None:
    lost = probe.sql("SELECT id, reason FROM runs WHERE status = 'unschedulable'")
    assert lost == [], f"runs ended for a device the farm's own outage made look lost: {lost}\n{probe.logs()}"


def test_an_outage_longer_than_the_lost_bound_ends_no_queued_run(request, tmp_path, example_pte):
    """kill -9 of the API server, kept down (its supervisor frozen) past the lost bound while the
    worker reaps on; the second agent frozen through it and let go past the lost bound after the
    farm is back. An experiment and a night's suite run queued across it all run."""
    catalog, _ = request.getfixturevalue("local_runner")
    with farm_on("embedded", request, tmp_path, **ENV) as (running, url, _), \
            second_agent(running, catalog.manifest, tmp_path, "sme2-frozen") as frozen:
        probe = FarmProbe(running, url)
        wait_for("the second agent's device", lambda: device_of(probe, "host-sme2-frozen"), 60, log=probe.logs)
        model = example_pte("toy_cnn")
        exp = probe.submit(model, **SLOW, sessions=2)
        sha = hashlib.sha256(model.read_bytes()).hexdigest()
        r = probe.http.post("/suites", json={"name": "night", "models": [{"sha256": sha, "name": "toy"}],
                                             **QUICK, "sessions": 2})
        assert r.status_code == 201, r.text
        r = probe.http.post("/suites/night/run")
        assert r.status_code == 201, r.text
        experiments = [exp["id"], *r.json()["experiment_ids"]]
        serials = {"host-sme2-frozen"} | set(runs_by_device(probe, experiments))
        assert len(serials) == 2, serials

        # Each device's held run has its runner frozen, so both stay mid-experiment (a run
        # running, others queued) through the outage however loaded the machine is.
        workdirs = {"host-sme2-frozen": tmp_path / "sme2-frozen"}
        workdirs.update({s: running.data_dir / "agent" for s in serials - set(workdirs)})
        runners: dict[str, list[int]] = {}

        def both_frozen_mid_experiment():
            per = runs_by_device(probe, experiments)
            for serial, runs in per.items():
                statuses = {r[1] for r in runs}
                if serial in runners or not statuses & HELD or "queued" not in statuses:
                    continue
                pids = runners_under(workdirs[serial])
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):   # it may have just finished
                        os.kill(pid, signal.SIGSTOP)
                if pids and all(stopped(p) for p in pids):
                    runners[serial] = pids
            return len(runners) == 2

        wait_for("a run held, its runner frozen, others queued, on both devices", both_frozen_mid_experiment, 90,
                 every=0.05, log=lambda: f"{runners} {runs_by_device(probe, experiments)}\n{probe.logs()}")
        os.kill(frozen.pid, signal.SIGSTOP)              # the second agent: silent through the outage
        supervisor = running.proc.pid
        os.kill(supervisor, signal.SIGSTOP)              # nothing restarts the server ...
        try:
            probe.kill("server")                         # ... killed with SIGKILL
            killed = time.monotonic()
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{running.url}/health", timeout=2)
            # Down past the lost bound (and past 3 liveness beats) while the worker reaps on.
            while time.monotonic() - killed < LOST_S + 3:
                none_ended_lost(probe)
                time.sleep(0.5)
        finally:
            os.kill(supervisor, signal.SIGCONT)
        wait_for("the server answers again", lambda: _healthy(running.url), 60, every=0.1, log=probe.logs)
        back = time.monotonic()
        # The farm's own agent reconnects within its cap; the second stays frozen past the lost bound.
        thaw(runners.pop(next(s for s in runners if s != "host-sme2-frozen")))   # the farm's own device runs on
        while time.monotonic() - back < LOST_S + 1:
            none_ended_lost(probe)
            time.sleep(0.5)
        os.kill(frozen.pid, signal.SIGCONT)
        thaw(runners.pop("host-sme2-frozen"))
        let_go = time.monotonic() - back

        def all_done():
            per = runs_by_device(probe, experiments)
            flat = [r for runs in per.values() for r in runs]
            return per if all(r[1] in TERMINAL for r in flat) else None

        per = wait_for("every run queued across the outage to end", all_done, 120, every=0.2, log=probe.logs)
        none_ended_lost(probe)
        flat = [r for runs in per.values() for r in runs]
        assert [r[1] for r in flat] == ["succeeded"] * len(flat), flat
        assert {s: len(runs) for s, runs in per.items()} == {s: 4 for s in serials}   # 2 + the suite's 2 each
        print(f"\nAPI down {back - killed:.1f} s (SIGKILL, supervisor frozen), second agent let go {let_go:.1f} s "
              f"after the farm was back (SME2_DEVICE_LOST_S={LOST_S:g}, settle {SETTLE_S:g} s): "
              f"{len(flat)} runs all succeeded, attempts {sorted(r[3] for r in flat)}")
        probe.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_a_device_unplugged_while_its_agent_talks_on_is_lost_within_its_bound(request, tmp_path, example_pte):
    """The second host renamed under its agent: the agent reports another device, and the one it
    no longer reports has its queued runs ended within the lost bound, though the agent talks on."""
    catalog, _ = request.getfixturevalue("local_runner")
    with farm_on("embedded", request, tmp_path, **ENV) as (running, url, _), \
            second_agent(running, catalog.manifest, tmp_path, "sme2-unplug", sync_s=2.0) as agent:
        probe = FarmProbe(running, url)
        wait_for("the second agent's device", lambda: device_of(probe, "host-sme2-unplug"), 60, log=probe.logs)
        exp = probe.submit(example_pte("toy_cnn"), **SLOW, sessions=3, device={"serial": "host-sme2-unplug"})
        assert len(exp["runs"]) == 3

        def frozen_mid_experiment():   # its runner frozen: the device stays busy, the other runs queued
            statuses = {r[1] for r in probe.runs(exp["id"])}
            if not statuses & HELD or "queued" not in statuses:
                return False
            pids = runners_under(tmp_path / "sme2-unplug")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            return bool(pids) and all(stopped(p) for p in pids) and pids

        runner_pids = wait_for("a run held, its runner frozen, others queued", frozen_mid_experiment, 60,
                               every=0.05, log=probe.logs)
        subprocess.run(["nsenter", "--uts", "-t", str(agent.pid), "hostname", "sme2-replug"], check=True, timeout=10)
        unplugged = time.monotonic()
        wait_for("the agent to report the other device", lambda: device_of(probe, "host-sme2-replug"), 30,
                 log=probe.logs)

        def queued_ended():
            runs = probe.runs(exp["id"])
            return runs if all(r[1] != "queued" for r in runs) else None

        runs = wait_for("the unplugged device's queued runs to end", queued_ended, LOST_S + 15, every=0.2,
                        log=probe.logs)
        took = time.monotonic() - unplugged
        lost = [r for r in runs if r[1] == "unschedulable"]
        assert len(lost) == 2, runs
        for r in lost:
            assert r[4].startswith("device host-sme2-unplug (") and " offline since " in r[4], r[4]
            assert f"(offline longer than SME2_DEVICE_LOST_S={LOST_S:g} s)" in r[4], r[4]
        # Its agent talked on all along: heard within the last few seconds, its new device online.
        [(last_seen,)] = probe.sql("SELECT last_seen FROM agents WHERE name = 'sme2-unplug'")
        heard = datetime.fromisoformat(str(last_seen)).replace(tzinfo=timezone.utc)
        assert (datetime.now(timezone.utc) - heard).total_seconds() < OFFLINE_S, last_seen
        state, _ = device_of(probe, "host-sme2-replug")
        assert state in ("idle", "busy"), state
        assert agent.poll() is None
        print(f"\ndevice unplugged while its agent talks on: its 2 queued runs ended {took:.1f} s later "
              f"(SME2_DEVICE_LOST_S={LOST_S:g})")
        for pid in runner_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        probe.close()
