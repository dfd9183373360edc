"""Helpers of the suite-alert tests: a webhook receiver (a real HTTP server on a loopback port),
a night's suite point written straight into the database, and the LLM phases a point records, at
chosen levels."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

__all__ = ["_farm_rows", "_inject", "_suite", "WebhookReceiver", "llm_phases", "night_point", "recording_tx", "T0"]

T0 = datetime(2026, 11, 1, 3, tzinfo=timezone.utc)   # night 0


class WebhookReceiver:
    """A webhook on a free loopback port that answers 204 and keeps every JSON body POSTed to it."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def llm_phases(i: int, ttft_ms: float = 20.0, decode_tps: float = 500.0, prompt: int = 16, n: int = 8) -> dict:
    """Night i's point: one session of n generations at these levels (1% noise), as
    analysis.llm.point_phases records them."""
    rng = np.random.default_rng(1000 + i)
    ttft = ttft_ms * (1 + 0.01 * rng.standard_normal(n))
    tps = decode_tps * (1 + 0.01 * rng.standard_normal(n))
    return {"prompt": prompt, "decode": 8, "ttft_ms": [ttft.tolist()],
            "prefill_tokens_per_s": [(prompt * 1e3 / ttft).tolist()], "decode_tokens_per_s": [tps.tolist()]}


def night_point(session, suite, device, i, *, model_name="net", memory=None, llm=None, state=None, runner="r1"):
    """Night i of a series of model "a" * 64 on `device` (SME2 off, 1 thread): one suite run and its
    point, latency steady at 10 ms."""
    from sme2farm.server.store.models import SuitePoint, SuiteRun

    at = T0 + timedelta(days=i)
    srun = SuiteRun(suite_id=suite.id, trigger="schedule", status="complete", triggered_at=at, finished_at=at)
    session.add(srun)
    session.flush()
    x = (10.0 * np.exp(np.random.default_rng(i).normal(0, 0.005, 40))).tolist()
    p = SuitePoint(suite_id=suite.id, suite_run_id=srun.id, model_sha256="a" * 64, model_name=model_name,
                   device_model=device.info["model"], device_id=device.id, sme2="off", threads=1, run_ids=[], at=at,
                   samples=[x], median_ms=float(np.median(x)), low_ms=min(x), high_ms=max(x), n_iterations=40,
                   sessions=1, runner=runner, et_version="1.5.1", device_state=dict(state or {}), memory=memory,
                   llm=llm)
    session.add(p)
    session.flush()
    return p


def recording_tx(db_url: str):
    """(sent, tx): tx() opens a transaction whose after-commit tasks are appended to `sent`."""
    from sme2farm.server.store.db import session_scope

    sent: list = []
    return sent, (lambda: session_scope(db_url, enqueue=lambda *a: sent.append(a)))


def _farm_rows(session, n_devices: int = 1):
    """An agent with devices and one stored model, as registration and an upload leave them."""
    from sme2farm.server.store.models import Agent, Device, Model

    agent = Agent(name="lab", hostname="h")
    session.add(agent)
    session.flush()
    devices = []
    for i in range(n_devices):
        d = Device(agent_id=agent.id, serial=f"dev{i}", platform="linux", sme2=False,
                   info={"model": "Test Board", "runner_platform": "linux-x86_64"})
        session.add(d)
        devices.append(d)
    for sha in ("a" * 64, "c" * 64):
        session.add(Model(sha256=sha, size=1))
    session.flush()
    return devices


def _suite(session, name="nightly", **kw):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites

    spec = {"name": name, "models": [{"sha256": "a" * 64, "name": "net"}], "sme2": "off", **kw}
    return suites.create(session, spec=SuiteSpec.model_validate(spec))


def _inject(session, suite, device, levels, *, sha="a" * 64, name="net", start=None, seed=0, state=None):
    """One suite run per level, each with one point of 40 iterations at that level (CV 0.5%)."""
    from sme2farm.server.store.models import SuitePoint, SuiteRun

    rng = np.random.default_rng(seed)
    start = start or datetime(2026, 11, 1, 3, tzinfo=timezone.utc)
    points = []
    for i, level in enumerate(levels):
        at = start + timedelta(days=i)
        srun = SuiteRun(suite_id=suite.id, trigger="schedule", status="complete", triggered_at=at, finished_at=at)
        session.add(srun)
        session.flush()
        x = (level * np.exp(rng.normal(0, 0.005, 40))).tolist()
        p = SuitePoint(suite_id=suite.id, suite_run_id=srun.id, model_sha256=sha, model_name=name,
                       device_model="Test Board", device_id=device.id, sme2="off", threads=1, run_ids=[], at=at,
                       samples=[x], median_ms=float(np.median(x)), low_ms=min(x), high_ms=max(x), n_iterations=40,
                       sessions=1, runner="r1", et_version="1.5.1", device_state=dict(state or {}))
        session.add(p)
        points.append(p)
    session.flush()
    return points
