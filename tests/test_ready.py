"""Ready means ready: `sme2-farm up` says so only once its local agent has registered a device,
and a submission that races an expected device (the farm's agent starting, an agent that has just
registered without devices) waits for it, bounded, instead of failing 422; a selector no expected
device could satisfy still fails at once."""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

from _fixtures_farm import X86_RUNNERS, free_port, post_experiment, register, stop_farm, x86_host
from sme2farm.client.api import FarmClient, FarmError
from sme2farm.client.common import wait_for, wait_healthy
from sme2farm.protocol import ExperimentSpec

WAIT_LOG = "submission waits up to"
HOST = x86_host("host-ready")


def submit_in_background(api, model: bytes, spec: dict | None = None) -> queue.Queue:
    out: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: out.put(post_experiment(api, model, spec)), daemon=True).start()
    return out


def wait_until_waiting(caplog, done: queue.Queue) -> None:
    """Until the server has taken the wait path for the submission (it logs so once)."""
    deadline = time.monotonic() + 30
    while not any(WAIT_LOG in r.getMessage() for r in caplog.records):
        assert done.empty(), f"the submission was answered without waiting: {done.get().text}"
        assert time.monotonic() < deadline, "the submission never started waiting for a device"
        time.sleep(0.02)


@pytest.fixture
def expecting(api, caplog):
    """The API as `sme2-farm up` starts it: its local agent 'local' is expected from now on."""
    caplog.set_level(logging.INFO, logger="sme2farm.server.services.submissions")
    api.settings.expect_agent = "local"
    api.settings.expect_agent_since = datetime.now(timezone.utc)
    api.settings.device_wait_s = 30.0
    return api


def test_submission_before_the_farm_agent_registers_waits_for_it(expecting, pte, caplog):
    api = expecting
    done = submit_in_background(api, pte, {"sme2": "off"})
    wait_until_waiting(caplog, done)
    register(api, (HOST,), name="local")
    r = done.get(timeout=60)
    assert r.status_code == 201, r.text
    [run] = r.json()["runs"]
    assert run["status"] == "queued" and run["device"]["serial"] == HOST.serial


def test_agent_registered_without_devices_is_waited_for(api, pte, caplog):
    caplog.set_level(logging.INFO, logger="sme2farm.server.services.submissions")
    token = register(api, (), name="phones")["access_token"]  # e.g. adb had not enumerated the phone yet
    done = submit_in_background(api, pte, {"sme2": "off"})
    wait_until_waiting(caplog, done)
    r = api.client.put("/agent/devices", json={"devices": [HOST.model_dump(mode="json")],
                                               "runners": [x.model_dump(mode="json") for x in X86_RUNNERS]},
                       headers=api.auth(token))
    assert r.status_code == 200, r.text
    r = done.get(timeout=60)
    assert r.status_code == 201, r.text
    assert [run["device"]["serial"] for run in r.json()["runs"]] == [HOST.serial]


def test_selector_no_expected_device_can_meet_fails_at_once(expecting, pte, caplog):
    api = expecting
    register(api, (HOST,), name="local")  # the farm's agent is up, with a Linux host only
    r = post_experiment(api, pte, {"device": {"platform": "android"}})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "no device matches selector {'platform': 'android'}" in detail and HOST.serial in detail
    assert "waited" not in detail  # the wait path appends what it waited for
    assert not any(WAIT_LOG in rec.getMessage() for rec in caplog.records)
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 0


def test_expected_device_that_never_comes_is_a_422_after_the_bound(expecting, pte):
    api = expecting
    api.settings.device_wait_s = 0.5
    r = post_experiment(api, pte, {})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "no device matches selector {}" in detail
    assert "SME2_DEVICE_WAIT_S=0.5" in detail and "agent 'local', starting with this farm" in detail
    assert not [p for p in (api.settings.data_dir / "models").rglob("*") if p.is_file()]


# ---- the real farm ------------------------------------------------------------------------------

def _up(data_dir, manifest, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sme2farm.farm.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--manifest", str(manifest), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _lines(proc) -> queue.Queue:
    out: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            out.put(line)
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def _read_until_ready(lines: queue.Queue, timeout: float = 120) -> list[str]:
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "sme2-farm up exited before it was ready:\n" + "".join(seen)
        seen.append(line)
        if line.startswith("farm up:"):
            return seen


def _wait_healthy(proc, url: str) -> None:
    def alive() -> None:
        assert proc.poll() is None, "sme2-farm up exited early"

    assert wait_healthy(url, 120, every=0.02, check=alive), "the server never answered"


@pytest.mark.e2e
def test_submit_right_after_up_succeeds(tmp_path, local_runner, example_pte):
    catalog, _ = local_runner
    model = example_pte("toy_cnn")
    data_dir = tmp_path / "farm"
    spec = ExperimentSpec(sme2="off", threads=[1], iterations=3, warmup=1)

    # 1. A fresh farm: submit the moment the API answers, before the agent has been started.
    proc, url = _up(data_dir, catalog.manifest)
    try:
        lines = _lines(proc)
        _wait_healthy(proc, url)
        client = FarmClient(url, (data_dir / "token").read_text().strip())
        early = client.submit(model, spec)  # a 422 here is the bug this guards against
        printed = _read_until_ready(lines)
        assert any(line.startswith("devices: ") and "linux" in line for line in printed), printed
        after_ready = client.submit(model, spec)  # the moment `up` says it is ready
        with pytest.raises(FarmError) as err:  # nothing expected can serve this: no wait
            client.submit(model, ExperimentSpec(device={"platform": "android"}))
        assert err.value.status == 422 and "waited" not in str(err.value)
        for exp in (early, after_ready):
            rep = wait_for(client, exp.id, quiet=True, timeout=300)
            assert [r.status for r in rep.runs] == ["succeeded"], [r.reason for r in rep.runs]
    finally:
        assert stop_farm(proc) == 0

    # 2. The same data dir again: the device rows left from the first run must not count as ready.
    started = datetime.now(timezone.utc)
    proc, url = _up(data_dir, catalog.manifest)
    try:
        _read_until_ready(_lines(proc))
        client = FarmClient(url, (data_dir / "token").read_text().strip())
        [host] = [d for d in client.devices() if d.agent == "local"]
        assert host.state != "offline" and host.last_seen >= started, host  # registered by this run's agent
        rep = wait_for(client, client.submit(model, spec).id, quiet=True, timeout=300)
        assert [r.status for r in rep.runs] == ["succeeded"], [r.reason for r in rep.runs]
    finally:
        assert stop_farm(proc) == 0


@pytest.mark.e2e
def test_up_says_not_ready_and_exits_1_when_the_agent_reports_no_device(tmp_path, local_runner):
    """--drivers macos on Linux: the agent registers, but with no device; `up` must not claim ready."""
    catalog, _ = local_runner
    proc, _url = _up(tmp_path / "farm", catalog.manifest, "--drivers", "macos", "--ready-timeout", "15")  # room for a loaded host: the agent must register first
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        stop_farm(proc)
    assert proc.returncode == 1, out
    assert "farm up:" not in out
    assert "the local agent registered but reported no usable device within 15 s (drivers: macos" in out
