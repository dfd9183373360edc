"""A killed agent's runner does not keep running: real `sme2-agent run` processes against the real
API (uvicorn in this process, the database and dispatch driven by the test), killed with SIGKILL.

- local host: the runner dies with the agent (PR_SET_PDEATHSIG); the lease reaper requeues the
  run and it completes once an agent is back;
- Android (loopback phone): the runner keeps running on the phone, so the next agent on the host
  kills it when it finds the phone, and removes its run directory;
- the pid records the next agent reads (the macOS case, where no death signal exists): a recorded
  runner of a dead agent is killed, a reused pid is not, a live agent's runner is not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from _fixtures_farm import dispatch, runners_under, submit, wait_for
from sme2farm.agent.drivers.leftovers import PidRecords, process_identity
from sme2farm.agent.drivers.local import LocalDriver
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run, utcnow
from sme2farm.server.services import runs as run_service

# ~10 s of runner time on an idle core, but a small trace: warm-up executions are not recorded.
LONG = {"warmup": 10_000, "iterations": 2_000}


def devices(api) -> list[dict]:
    return api.client.get("/devices", headers=api.auth()).json()


def run_status(api, run_id: int) -> dict:
    return api.client.get(f"/runs/{run_id}", headers=api.auth()).json()


def start_agent(api, work_dir: Path, manifest: Path, log: Path, *args: str) -> subprocess.Popen:
    """`sme2-agent run` as an operator starts it; its token in the environment, never argv."""
    env = {k: v for k, v in os.environ.items() if k not in ("SME2_TOKEN", "SME2_ADMIN_TOKEN")}
    env["SME2_AGENT_TOKEN"] = api.token
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sme2farm.agent.cli", *args, "--manifest", str(manifest),
                                 "--work-dir", str(work_dir), "run", "--server", api.url, "--name", "leftovers"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_agent(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_killed_agents_local_runner_dies_with_it_and_the_run_completes_after_requeue(
        api, local_runner, example_pte, tmp_path, monkeypatch):
    catalog, _ = local_runner
    work, log = tmp_path / "agent", tmp_path / "agent.log"
    agent = start_agent(api, work, catalog.manifest, log, "--drivers", "local")
    try:
        wait_for("the agent registered its device", lambda: devices(api), 60, log=log)
        exp = submit(api, example_pte("toy_cnn"), **LONG)
        [rid] = dispatch(api)
        [runner] = wait_for("the runner started", lambda: runners_under(work), 60, log=log)
        [run_dir] = [d for d in work.iterdir() if d.name.startswith(f"run{rid}-")]
        assert run_status(api, rid)["status"] == "running"

        agent.kill()
        agent.wait()
        # PR_SET_PDEATHSIG: the kernel kills the runner as its parent goes, long before it would end.
        wait_for("the runner outlived its agent", lambda: process_identity(runner) is None, 3)
        assert not (run_dir / "trace.etdump").exists()   # killed mid-run, not finished

        # The server learns of the death by the lease running out; the reaper requeues the run.
        url = api.settings.sqlalchemy_url
        with session_scope(url) as s:
            s.execute(update(Run).where(Run.id == rid).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        with session_scope(url) as s:
            assert rid in run_service.reap_expired(s, max_attempts=api.settings.max_attempts,
                                                   store=Store(api.settings.data_dir))
        assert run_status(api, rid)["status"] == "queued"

        agent = start_agent(api, work, catalog.manifest, log, "--drivers", "local")
        assert wait_for("the run was dispatched again", lambda: dispatch(api), 60, log=log) == [rid]
        wait_for("the run finished on the new agent", lambda: run_status(api, rid)["status"] == "analyzing", 120, log=log)
        # The new agent found the dead one's record (its runner already gone) and cleared it away.
        assert not run_dir.exists()
        assert [p.name for p in (work / "pids").iterdir()] == []
    finally:
        stop_agent(agent)

    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    tasks.ingest_run(rid)
    run = run_status(api, rid)
    assert run["status"] == "succeeded" and run["attempt"] == 2, run
    rep = api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()
    [done] = [r for r in rep["runs"] if r["id"] == rid]
    assert done["e2e_ms"]["n"] == LONG["iterations"]   # one result, from the second attempt


@pytest.mark.adb
@pytest.mark.android
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_killed_agents_phone_runner_is_killed_by_the_next_agent(api, adb_port, loopback, phone_runners, toy_pte,
                                                                  tmp_path, monkeypatch):
    dev = loopback()
    work, log = tmp_path / "agent", tmp_path / "agent.log"
    # The fake phone runs this host's runner as its "arm64" build: the start-up check would fail it.
    monkeypatch.setenv("SME2_AGENT_CHECK", "0")
    adb = ("--drivers", "android", "--adb-port", str(adb_port))
    agent = start_agent(api, work, phone_runners.manifest, log, *adb)
    runner = None
    try:
        wait_for("the agent registered the phone", lambda: devices(api), 60, log=log)
        submit(api, toy_pte, warmup=10_000, iterations=2_000, device={"platform": "android"})
        [rid] = dispatch(api)
        phone_runs = dev.device_path(f"/data/local/tmp/sme2farm/runs/{rid}")
        [runner] = wait_for("the runner started on the phone", lambda: runners_under(phone_runs), 60, log=log)
        # Frozen: this run takes ~2 s, less than the next agent may take to start under load, and a
        # runner that finished on its own would pass for one the next agent killed.
        os.kill(runner, signal.SIGSTOP)
        wait_for("the agent recorded the runner", lambda: list((work / "pids").glob(f"adb-{rid}-*.json")), 10, log=log)

        agent.kill()
        agent.wait()
        time.sleep(0.5)
        assert process_identity(runner) is not None   # the phone does not know its agent died

        agent = start_agent(api, work, phone_runners.manifest, log, *adb)
        wait_for("the next agent killed the leftover runner", lambda: process_identity(runner) is None, 60, log=log)
        assert any(c.startswith(f"kill -9 {runner};") for c in dev.shell_commands)   # killed, not finished
        wait_for("the leftover run directory was removed", lambda: not phone_runs.exists(), 10, log=log)
        wait_for("the record was cleared", lambda: not list((work / "pids").glob("adb-*.json")), 10, log=log)
        assert not list(work.glob(f"run{rid}-*"))   # the host side of that run too
    finally:
        stop_agent(agent)
        if runner is not None and process_identity(runner) is not None:
            os.kill(runner, signal.SIGKILL)


def _sleeper(tmp_path: Path) -> subprocess.Popen:
    """A stand-in runner: a real process in its own session, as run_subprocess starts runners."""
    return subprocess.Popen(["sleep", "300"], cwd=tmp_path, start_new_session=True)


def _dead_agent() -> dict:
    """The owner of a record whose agent is gone: a process that has exited."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return {"pid": gone.pid, "start": "not-running"}


def test_recorded_leftover_processes_are_killed_but_not_reused_pids_or_a_live_agents(tmp_path):
    records = PidRecords(tmp_path / "pids")
    driver = LocalDriver()
    driver.pids = records
    leftover, innocent, running = _sleeper(tmp_path), _sleeper(tmp_path), _sleeper(tmp_path)
    try:
        workdir = tmp_path / "run7-x"
        workdir.mkdir()

        def write(name: str, owner: dict, proc: subprocess.Popen, start: str | None, run_id: int, **extra) -> Path:
            path = records.dir / f"process-{run_id}-{name}.json"
            path.write_text(json.dumps({"kind": "process", "run_id": run_id, "owner": owner, "pid": proc.pid,
                                        "start": start, **extra}))
            return path

        write("dead", _dead_agent(), leftover, process_identity(leftover.pid), 7, workdir=str(workdir))
        # The pid was reused: same number, another start time. Never kill on the pid alone.
        write("reused", _dead_agent(), innocent, "0:1", 8)
        live = records.add("process", 9, pid=running.pid, start=process_identity(running.pid))  # this agent's

        done = driver.reap_leftovers({"host"})
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert done == [f"killed runner pid {leftover.pid} left running by run 7"]
        assert innocent.poll() is None and running.poll() is None
        assert not workdir.exists()   # the dead run's directory under the agent's work dir went with it
        assert sorted(p.name for p in records.dir.iterdir()) == [f"{live}.json"]
        assert (records.dir / f"{live}.json").stat().st_mode & 0o777 == 0o600
    finally:
        for p in (leftover, innocent, running):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_run_subprocess_records_the_runner_while_it_runs_and_sets_its_death_signal(tmp_path):
    import threading

    from sme2farm.agent.drivers.local import run_subprocess

    records = PidRecords(tmp_path / "pids")
    child = ("import ctypes, os, sys; sig = ctypes.c_int(); "
             "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0); "   # PR_GET_PDEATHSIG
             "print(sig.value); print(*os.listdir(sys.argv[1]))")
    code, _ = run_subprocess([sys.executable, "-c", child, str(records.dir)], tmp_path, tmp_path / "log", 60,
                             threading.Event(), pids=records, run_id=5)
    assert code == 0
    sig, listed = (tmp_path / "log").read_text().splitlines()
    assert int(sig) == signal.SIGKILL                                   # dies with the agent
    assert listed.startswith("process-5-") and listed.endswith(".json")  # recorded while running
    assert list(records.dir.iterdir()) == []                             # forgotten once it ended
