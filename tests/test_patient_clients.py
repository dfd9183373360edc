"""Patient agents and clients, tested for real on one `sme2-farm up` (PostgreSQL behind a TCP
proxy the tests cut, the data dir on a small tmpfs the tests fill, the API server killed with -9):

- an artifact upload the farm's full disk refuses (507) is retried while the heartbeats keep the
  lease, then the run ends `failed` once with the server's reason, not re-run into the same refusal;
- a transient 503 during an upload (the database away) is retried and the run succeeds;
- `sme2-client submit --wait` sits through a database outage and a server restart and exits 0
  with the report; `--timeout` gives up with one sentence saying what it waited for and saw.

The farm runs with a 10 s lease (reaped every 2.5 s) and the agent retries an upload for 15 s
(SME2_AGENT_UPLOAD_RETRY_S), longer than the lease: only the heartbeats can keep the run its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import (REQUIRE_SERVICES, TERMINAL, PrivateRedis, TcpProxy, create_database, register, runners_under, start_farm,
                            stop_farm, submit, wait_for)
from sme2farm.client.common import server_healthy

LEASE_S = 10.0
UPLOAD_RETRY_S = 15.0
TMPFS_MB = 32
SHORT = {"sme2": "off", "warmup": 2, "iterations": 20}
# ~1-3 s of runner time per run (warm-up executions are not recorded: a small trace)
SLOW = {"sme2": "off", "warmup": 6000, "iterations": 20}



def on_the_farm(test):
    """The tests on the module's farm: a whole farm, on PostgreSQL."""
    return pytest.mark.e2e(pytest.mark.postgres(test))


class PatientFarm:
    """The farm under test and the test's own ways to look at it (straight to PostgreSQL, not
    through the proxy the tests cut)."""

    def __init__(self, running, db_url: str, proxy: TcpProxy, tmpfs: Path | None):
        from sqlalchemy import create_engine

        self.f, self.url, self.proxy, self.tmpfs = running, running.url, proxy, tmpfs
        self.http = httpx.Client(base_url=running.url, timeout=30, headers={"Authorization": f"Bearer {running.token}"})
        self.db = create_engine(db_url)

    def logs(self) -> str:
        return "\n".join(f"--- {n}.log ---\n{self.f.log(n)[-2000:]}" for n in ("server", "agent", "supervisor"))

    def submit(self, model: Path, **spec) -> dict:
        return submit(self.http, model, **spec)

    def runs(self, experiment_id: int) -> list[tuple]:
        from sqlalchemy import text

        with self.db.connect() as c:
            return [tuple(r) for r in c.execute(text(
                "SELECT id, status, attempt, reason FROM runs WHERE experiment_id = :e ORDER BY id"), {"e": experiment_id})]

    def wait_status(self, experiment_id: int, statuses: set[str], timeout_s: float) -> list[tuple]:
        return wait_for(f"experiment {experiment_id} has a run in {statuses}",
                        lambda: (runs := self.runs(experiment_id)) and any(r[1] in statuses for r in runs) and runs,
                        timeout_s, every=0.02, log=self.logs)

    def wait_done(self, experiment_id: int, timeout_s: float) -> list[tuple]:
        return wait_for(f"experiment {experiment_id} ended",
                        lambda: (runs := self.runs(experiment_id)) and all(r[1] in TERMINAL for r in runs) and runs,
                        timeout_s, every=0.1, log=self.logs)

    def server_pid(self) -> int:
        return json.loads((self.f.data_dir / "supervisor.json").read_text())["children"]["server"]["pid"]

    def cli(self, *args: str, out: Path) -> subprocess.Popen:
        """sme2-client as a user runs it, in its own process; stdout and stderr to files."""
        env = {**self.f.env, "SME2_SERVER": self.url, "SME2_TOKEN": self.f.token}
        with open(out.with_suffix(".out"), "w") as o, open(out.with_suffix(".err"), "w") as e:
            return subprocess.Popen([sys.executable, "-m", "sme2farm.client.cli", *args], env=env, stdout=o, stderr=e)


@pytest.fixture(scope="module")
def patient_farm(tmp_path_factory, local_runner, postgres_admin_url):
    """`sme2-farm up` on a fresh PostgreSQL database reached through a TcpProxy and a private
    Redis (the database and the broker off the data dir, so a full data dir is the artifacts'
    disk alone); the data dir on a TMPFS_MB tmpfs where the tests run as root (else on the
    plain disk, and the full-disk test is skipped)."""
    from sqlalchemy.engine import make_url

    catalog, _ = local_runner
    base = tmp_path_factory.mktemp("patient")
    data = base / "data"
    data.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0700", "tmpfs", str(data)],
                             capture_output=True, text=True).returncode == 0
    redis = PrivateRedis(base)
    url, drop_database = create_database(postgres_admin_url, "sme2_patient")
    real = make_url(url)
    proxy = TcpProxy((real.host or "127.0.0.1", real.port or 5432))
    via_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    env = {"SME2_DATABASE_URL": via_proxy, "SME2_BROKER_URL": redis.url,
           "SME2_LEASE_S": str(LEASE_S), "SME2_HEARTBEAT_INTERVAL_S": "2", "SME2_INGEST_DEADLINE_S": "6",
           "SME2_AGENT_UPLOAD_RETRY_S": str(UPLOAD_RETRY_S),
           "SME2_MIN_FREE_MB": "0"}  # its small tmpfs meets a real ENOSPC, not the free-space reserve
    f = None
    try:
        f = PatientFarm(start_farm(data, catalog.manifest, extra_env=env), real.render_as_string(hide_password=False),
                        proxy, data if mounted else None)
        yield f
    finally:
        if f is not None:
            f.http.close()
            f.db.dispose()
            stop_farm(f.f.proc)
        proxy.close()
        redis.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(data)], check=False)
        drop_database()


@contextlib.contextmanager
def database_away(proxy: TcpProxy):
    """PostgreSQL unreachable for the farm (the proxy cut) until the block ends."""
    proxy.cut()
    try:
        yield
    finally:
        proxy.restore()


@contextlib.contextmanager
def disk_filled(mount: Path, leave: int):
    """Fill the file system to within `leave` bytes of full (a real ENOSPC, then shrunk back)."""
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):   # ENOSPC: full
            while True:
                os.write(fd, bytes(256 << 10))
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, bytes(4096))
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    try:
        yield
    finally:
        filler.unlink()


# ---- the agent: uploads the server refuses -------------------------------------------------------


@on_the_farm
def test_an_upload_refused_by_a_full_disk_ends_the_run_failed_once_with_the_servers_reason(patient_farm, example_pte):
    farm = patient_farm
    if farm.tmpfs is None:
        (pytest.fail if REQUIRE_SERVICES else pytest.skip)("no tmpfs for the data dir here (mounting needs root)")
    pte = example_pte("toy_cnn")
    first = farm.submit(pte, **SLOW)
    [(rid, status, _, reason)] = farm.wait_done(first["id"], 120)
    assert status == "succeeded", reason
    # a run's artifacts are kept per attempt (server/store/base.py): the one attempt that succeeded
    [trace] = [p.stat().st_size for p in (farm.tmpfs / "artifacts" / "runs" / str(rid)).glob("*/trace.etdump")]

    exp = farm.submit(pte, **SLOW)   # the same model: already stored, no room needed for it
    farm.wait_status(exp["id"], {"running"}, 60)
    with disk_filled(farm.tmpfs, leave=trace // 2):   # room for logs, not for the trace
        filled = time.monotonic()
        [(_, status, attempt, reason)] = farm.wait_done(exp["id"], UPLOAD_RETRY_S + 90)
        took = time.monotonic() - filled
    print(f"full disk: trace of {trace} bytes refused; the run failed once {took:.1f} s after the disk filled "
          f"(upload retried {UPLOAD_RETRY_S:g} s, lease {LEASE_S:g} s): {reason}")
    assert (status, attempt) == ("failed", 1), (status, attempt, reason)   # not re-run
    assert reason.startswith("the farm's disk is full: the server refused "), reason
    assert "507" in reason and "disk is full" in reason.split("507", 1)[1], reason
    # Retried for longer than a lease: only the heartbeats, going on meanwhile, kept the run its own.
    assert took >= UPLOAD_RETRY_S - 1, took
    assert "lease" not in reason and "stopped answering" not in reason
    agent_log = farm.f.log("agent")
    assert "507" in agent_log and "retrying" in agent_log

    # Space again: the device was freed by the finish and the next run goes through.
    again = farm.submit(pte, **SHORT)
    [(_, status, attempt, reason)] = farm.wait_done(again["id"], 120)
    assert (status, attempt) == ("succeeded", 1), reason


@on_the_farm
def test_a_503_during_an_upload_is_retried_and_the_run_succeeds(patient_farm, example_pte):
    """The database goes away while the runner runs (cut at the proxy): the agent's delivery (the finish
    with its artifacts in one request, agent protocol 2) meets 503 (the bytes are received, the transaction
    cannot run) and is retried; the database comes back after the agent logged the 503, and the run
    succeeds on its first attempt."""
    farm = patient_farm
    exp = farm.submit(example_pte("toy_cnn"), **{**SLOW, "warmup": 10000})
    farm.wait_status(exp["id"], {"running"}, 60)
    # A run is running from its claim's acknowledgement (protocol 2), which can come before the agent has
    # fetched the model: the database goes away once the runner itself runs (its 10,000 warm-up calls).
    wait_for("the runner runs", lambda: runners_under(farm.f.data_dir / "agent"), 60, every=0.01, log=farm.logs)
    before = len(farm.f.log("agent", tail=None))   # the whole log: what comes after it is new
    with database_away(farm.proxy):
        wait_for("the agent's delivery met a 503", lambda: "/deliver" in (new := farm.f.log("agent", tail=None)[before:])
                 and " 503 " in new, 60, every=0.1, log=farm.logs)
    [(_, status, attempt, reason)] = farm.wait_done(exp["id"], 120)
    assert (status, attempt) == ("succeeded", 1), (status, attempt, reason)


# ---- the client: submit --wait through faults ---------------------------------------------------


@on_the_farm
def test_submit_wait_survives_a_database_outage_and_a_server_restart(patient_farm, example_pte, tmp_path):
    farm = patient_farm
    pte = example_pte("toy_cnn")
    before = {e["id"] for e in farm.http.get("/experiments", params={"page_size": 100}).json()["items"]}
    proc = farm.cli("submit", str(pte), "--sme2", "off", "--warmup", "6000", "--iterations", "20", "--sessions", "3",
                    "--name", "patient", "--wait", out=tmp_path / "submit")
    try:
        exp_id = wait_for("the submission stored", lambda: [e["id"] for e in farm.http.get(
            "/experiments", params={"page_size": 100}).json()["items"] if e["id"] not in before], 60, every=0.05)[0]
        farm.wait_status(exp_id, {"running"}, 60)
        with database_away(farm.proxy):         # for 8 s
            time.sleep(8)
        server = farm.server_pid()
        os.kill(server, signal.SIGKILL)        # then the API server killed; the supervisor starts it again
        killed = time.monotonic()
        wait_for("the server is back", lambda: server_healthy(farm.url) and farm.server_pid() != server, 60, every=0.1,
                 log=farm.logs)
        back = time.monotonic() - killed
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = (tmp_path / "submit.out").read_text(), (tmp_path / "submit.err").read_text()
    assert rc == 0, (out, err)
    assert f"answered 503 (the database is unavailable); waiting for experiment {exp_id} to finish" in err, err
    # killed while the client polled, or between its polls: either it met the dead server, or its
    # next poll was already answered by the new one
    runs = farm.runs(exp_id)
    assert [r[1] for r in runs] == ["succeeded"] * 3, runs
    assert "patient" in out and "succeeded" in out, out   # the report, on stdout
    assert "Traceback" not in err
    print(f"submit --wait: exit 0 through an 8 s database outage and a server kill -9 (back in {back:.1f} s); "
          f"notes: {[line for line in err.splitlines() if 'server at' in line]}")


@on_the_farm
def test_submit_wait_timeout_gives_up_saying_what_it_waited_for_and_saw(patient_farm, example_pte, tmp_path):
    farm = patient_farm
    pte = example_pte("toy_cnn")
    before = {e["id"] for e in farm.http.get("/experiments", params={"page_size": 100}).json()["items"]}
    proc = farm.cli("submit", str(pte), "--sme2", "off", "--warmup", "6000", "--iterations", "20", "--sessions", "3",
                    "--wait", "--timeout", "12", out=tmp_path / "submit")
    exp_id = None
    try:
        exp_id = wait_for("the submission stored", lambda: [e["id"] for e in farm.http.get(
            "/experiments", params={"page_size": 100}).json()["items"] if e["id"] not in before], 60, every=0.05)[0]
        with database_away(farm.proxy):         # for longer than the client's --timeout
            t0 = time.monotonic()
            rc = proc.wait(timeout=60)
            waited = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        if exp_id is not None:   # leave the farm idle for the next test
            wait_for("the experiment cancelled", lambda: farm.http.post(f"/experiments/{exp_id}/cancel").status_code == 200,
                     30, every=0.5)
            farm.wait_done(exp_id, 60)
    err = (tmp_path / "submit.err").read_text()
    assert rc == 1, err
    [line] = [x for x in err.splitlines() if "gave up" in x]
    assert line.startswith(f"sme2-client: gave up after 12 s waiting for experiment {exp_id} to finish: "
                           f"the server at {farm.url} answered 503 (the database is unavailable) for the last "), line
    assert line.endswith(" s") and waited < 12 + 5, (line, waited)
    assert "Traceback" not in err


@on_the_farm
def test_status_wait_follows_an_experiment_through_a_server_restart(patient_farm, example_pte, tmp_path):
    farm = patient_farm
    exp = farm.submit(example_pte("toy_cnn"), **SLOW, sessions=2)
    proc = farm.cli("status", str(exp["id"]), "--wait", "--json", out=tmp_path / "status")
    try:
        farm.wait_status(exp["id"], {"running"}, 60)
        server = farm.server_pid()
        os.kill(server, signal.SIGKILL)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = (tmp_path / "status.out").read_text(), (tmp_path / "status.err").read_text()
    assert rc == 0, (out, err)
    report = json.loads(out)
    assert report["id"] == exp["id"] and [r["status"] for r in report["runs"]] == ["succeeded"] * 2, report
    assert farm.server_pid() != server


@on_the_farm
def test_suite_run_wait_goes_on_through_a_database_outage(patient_farm, example_pte, tmp_path):
    farm = patient_farm
    model = example_pte("toy_cnn")
    farm.submit(model, **SHORT)   # the suite's model must be stored
    made = farm.cli("suite", "create", "patient", "--model", f"{model}=toy", "--sme2", "off", "--iterations", "20",
                    "--warmup", "3000", "--sessions", "2", "--json", out=tmp_path / "create")
    assert made.wait(timeout=60) == 0, (tmp_path / "create.err").read_text()
    proc = farm.cli("suite", "run", "patient", "--wait", "--timeout", "240", out=tmp_path / "suite")
    try:
        [exp_id] = wait_for("the suite's experiment", lambda: farm.http.get("/suites/patient").json()["runs"]
                            and farm.http.get("/suites/patient").json()["runs"][0]["experiment_ids"], 60, every=0.1)
        farm.wait_status(exp_id, {"running"}, 60)
        with database_away(farm.proxy):
            time.sleep(6)
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = (tmp_path / "suite.out").read_text(), (tmp_path / "suite.err").read_text()
    assert rc == 0, (farm.runs(exp_id), out, err[-1500:])
    assert "answered 503 (the database is unavailable)" in err and "toy on" in out, (out, err)


@on_the_farm
def test_a_delivery_that_meets_a_database_outage_is_a_503_not_a_malformed_body(patient_farm):
    """The lease a delivery names is checked while its body streams in: the database going away
    then is the server's outage (503 with Retry-After, the agent retries), never the agent's
    "malformed multipart body" (400, which ended the run failed: a CI run met it)."""
    farm = patient_farm
    token = register(farm.http, name="outage-deliverer", hostname="outage-host")["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    finish = {"lease_id": "0" * 32, "status": "succeeded", "artifacts": {}, "started_s_ago": 0.5}
    files = [("finish", (None, json.dumps(finish).encode(), "application/json"))]
    assert farm.http.post("/agent/claim", params={"wait": 0}, headers=headers).status_code == 200  # the token verified
    with database_away(farm.proxy):
        r = farm.http.post("/agent/runs/999999/deliver", files=files, headers=headers)
    assert r.status_code == 503 and r.headers.get("Retry-After", "").isdigit(), (r.status_code, r.text)
    assert "malformed" not in r.text and r.json()["unavailable"] == "database", r.text


@on_the_farm
def test_a_server_that_accepts_and_never_answers_is_given_up_on_at_the_timeout(patient_farm):
    """A hung server (it accepts, then says nothing): each request's own timeout is cut to what
    is left of the wait, so --timeout holds; the sentence says the server did not answer."""
    farm = patient_farm
    import socket

    from sme2farm.client.api import FarmClient, GaveUp, Patience

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        client = FarmClient(f"http://127.0.0.1:{hung.getsockname()[1]}", farm.f.token)
        t0 = time.monotonic()
        with pytest.raises(GaveUp) as e:
            Patience(client, "experiment 1 to finish", 3).call(client.experiment, 1)
        took = time.monotonic() - t0
    assert 2.5 < took < 6, took
    assert str(e.value) == (f"gave up after 3 s waiting for experiment 1 to finish: the server at {client.server} "
                            f"did not answer (timed out) for the last 3 s")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_429_on_the_submission_is_waited_out_and_the_experiment_stored_once(db_url, tmp_path, example_pte):
    """The submission is not idempotent: it is retried only where the server did nothing. A 429
    (the token's write rate spent) is answered before the route runs: the client waits its
    Retry-After and submits again, and exactly one experiment is stored."""
    from _fixtures_farm import serve_app
    from sme2farm.client.api import FarmClient, Patience
    from sme2farm.protocol import ExperimentSpec
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url, device_wait_s=0, rate_writes_per_min=12)
    with serve_app(settings) as (url, token, _sent):
        client = FarmClient(url, token)
        host = {"serial": "host-patient", "platform": "linux", "model": "x86 test host", "cpu_cores": 2,
                "abi": "x86_64", "sme2": False, "runner_platform": "linux-x86_64"}
        r = client.http.post("/agent/register", json={"name": "patient", "hostname": "lab", "devices": [host],
                                                      "runners": [{"id": "r-off", "platform": "linux-x86_64", "sme2": "off"}]})
        assert r.status_code == 200, r.text
        spent = [client.http.post("/experiments/999999/cancel").status_code for _ in range(20)]
        assert 429 in spent, spent                         # the token's burst is used up
        t0 = time.monotonic()
        rep = Patience(client, "the server to take the submission", 60).call(
            client.submit, example_pte("toy_cnn"), ExperimentSpec(sme2="off", iterations=1), idempotent=False)
        waited = time.monotonic() - t0
        assert client.experiments().total == 1 and client.experiment(rep.id).id == rep.id
    # it waited for the bucket (Retry-After: a write every 5 s at 12 a minute), then was taken once
    assert waited >= 3.0, waited


def test_submit_wait_to_a_server_that_never_answers_gives_up_soon_naming_the_url(tmp_path, capsys):
    """No answer ever (a wrong --server, a farm not started): not the 5-minute outage patience
    of a farm that answered before, but FIRST_CONTACT_S, and a sentence with the URL."""
    from _fixtures_farm import free_port
    from sme2farm.client import cli
    from sme2farm.client.api import FIRST_CONTACT_S

    model = tmp_path / "m.pte"
    model.write_bytes(b"not read: nothing answers")
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    rc = cli.main(["--server", url, "--token", "t", "submit", str(model), "--sme2", "off", "--wait"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 1, err
    assert (f"sme2-client: gave up after {FIRST_CONTACT_S:.0f} s waiting for the server to take the submission: "
            f"the server at {url} could not be reached (connection refused) for the last ") in err, err
    assert FIRST_CONTACT_S - 1 <= took < FIRST_CONTACT_S + 5, took
