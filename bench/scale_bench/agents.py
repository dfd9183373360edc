"""A simulated agent (its own process): the agent's protocol over raw HTTP, with instant devices
(or devices busy --run-s seconds a run).
Protocol 2 (a claim and a delivery) when the server speaks it and --protocol allows; else 1 (claim,
start, a PUT per artifact, finish).
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from scale_bench.common import RUNNERS, SIM_TAG


class Conflict(Exception):
    pass


class Http:
    """The agent's retry policy (agent/api.py): back off with jitter on network errors, 5xx and
    429 (honouring Retry-After); 409 means the lease is gone. Counts what it retried."""

    def __init__(self, url: str, token: str, connections: int):
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0),
                                   limits=httpx.Limits(max_connections=connections,
                                                       max_keepalive_connections=connections))
        self.client.headers["Authorization"] = f"Bearer {token}"
        self.retried: dict[str, int] = {}
        self.lock = threading.Lock()

    def call(self, method: str, path: str, *, retries: int = 8, **kw) -> httpx.Response:
        delay = 0.2
        for attempt in range(retries + 1):
            wait = delay * (0.5 + random.random())
            try:
                r = self.client.request(method, path, **kw)
            except httpx.TransportError as e:
                key = type(e).__name__
            else:
                if r.status_code == 409:
                    raise Conflict(r.text)
                if r.status_code < 500 and r.status_code != 429:
                    r.raise_for_status()
                    return r
                key = str(r.status_code)
                if r.status_code == 429 and r.headers.get("retry-after", "").isdigit():
                    wait = float(r.headers["retry-after"])
            with self.lock:
                self.retried[key] = self.retried.get(key, 0) + 1
            if attempt == retries:
                raise RuntimeError(f"{method} {path}: gave up after {retries} retries ({key})")
            time.sleep(wait)
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")


def agent_main(idx: int, cfg: dict, stop, ready) -> None:
    """One agent host: register its devices, long-poll, serve each assignment in a thread like
    agent/loop.py (one run per device), append one JSON line per run to its record file."""
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serials = [f"sim{idx:02d}-{d:02d}" for d in range(cfg["devices"])]
    devices = [{"serial": s, "platform": "android", "model": "Simulated SME2 phone", "soc": "sim",
                "cpu_cores": 8, "abi": "arm64-v8a", "os_version": "15", "sme2": True,
                "sme2_evidence": "simulated by bench/scale.py", "runner_platform": "android-arm64-v9a",
                "state": "idle", "tags": [SIM_TAG]} for s in serials]
    trace, log = Path(cfg["trace"]).read_bytes(), Path(cfg["log"]).read_bytes()
    uploads = [("runner.log", log, hashlib.sha256(log).hexdigest()),
               ("trace.etdump", trace, hashlib.sha256(trace).hexdigest())]
    http = Http(cfg["url"], cfg["register_token"], cfg["devices"] + 4)
    body = {"name": f"scale-agent-{idx:02d}", "hostname": f"scale-host-{idx:02d}", "version": "bench",
            "devices": devices, "runners": RUNNERS}
    reg = http.call("POST", "/agent/register", json=body).json()
    http.client.headers["Authorization"] = f"Bearer {reg['access_token']}"
    # The agent protocol both speak: the bench's --protocol, if the server speaks it (an older
    # server's answer names none: 1)
    protocol = min(cfg.get("protocol", 2), int(reg.get("protocol", 1)))
    poll = float(reg.get("poll_timeout_s", 20.0))
    ready.put(idx)
    out = open(Path(cfg["out"]) / f"agent-{idx:02d}.jsonl", "a", buffering=1)
    out_lock, active_lock = threading.Lock(), threading.Lock()
    active: set[int] = set()
    models: dict[str, threading.Lock] = {}
    fetched: set[str] = set()
    counts = {"claims": 0, "claims_with_new": 0, "claims_known_only": 0, "claims_empty": 0, "syncs": 0}

    def model(sha: str) -> None:
        # Each agent host fetches a model once (by sha256, verified), as agent/loop.py caches it.
        with active_lock:
            lock = models.setdefault(sha, threading.Lock())
        with lock:
            if sha in fetched:
                return
            data = http.call("GET", f"/agent/models/{sha}").content
            if hashlib.sha256(data).hexdigest() != sha:
                raise RuntimeError(f"model {sha} arrived damaged")
            fetched.add(sha)

    def serve(a: dict, t_claim: float) -> None:
        rec = {"run_id": a["run_id"], "lease": a["lease_id"], "agent": idx, "device": a["device_serial"],
               "attempt": a.get("attempt"), "t_claim": t_claim}
        step = "start"
        try:
            lease = {"lease_id": a["lease_id"]}
            runner = RUNNERS[0] if a["sme2"] == "on" else RUNNERS[1]
            run_s = float(cfg.get("run_s") or 0.0)  # --run-s: how long the device is busy with the run
            done = {**lease, "status": "succeeded", "runner": runner, "device_state": {"simulated": True},
                    "wall_s": max(run_s, 0.002), "exit_code": 0, "warmup_in_trace": 0}
            if protocol >= 2:  # agent protocol 2: no start; the artifacts travel with the finish
                rec["t_start"] = t_claim
                step = "model"
                model(a["model_sha256"])
                rec["t_model"] = time.time()
                stop.wait(run_s)
                step = "deliver"
                digests = {name: {"size": len(data), "sha256": sha} for name, data, sha in uploads}
                parts = [("finish", (None, json.dumps({**done, "artifacts": digests,
                                                       "started_s_ago": time.time() - t_claim}).encode(),
                                     "application/json"))]
                parts += [(name, (name, data, "application/octet-stream")) for name, data, _ in uploads]
                r = http.call("POST", f"/agent/runs/{a['run_id']}/deliver", files=parts)
                rec["t_finish"] = rec["t_delivered"] = time.time()
                rec["finished"] = r.json().get("status")
                return
            ans = http.call("POST", f"/agent/runs/{a['run_id']}/start", json=lease).json()
            rec["t_start"] = time.time()
            if ans.get("cancel"):
                step = "finish"
                http.call("POST", f"/agent/runs/{a['run_id']}/finish",
                          json={**lease, "status": "failed", "reason": "cancelled before it ran"})
                rec["t_finish"], rec["finished"] = time.time(), "failed"
                return
            step = "model"
            model(a["model_sha256"])
            rec["t_model"] = time.time()
            stop.wait(run_s)
            for name, data, sha in uploads:
                step = f"upload {name}"
                http.call("PUT", f"/agent/runs/{a['run_id']}/artifacts/{name}", content=data,
                          headers={"X-Lease-Id": a["lease_id"], "X-Content-SHA256": sha,
                                   "Content-Type": "application/octet-stream"})
                rec[f"t_{name}"] = time.time()
            step = "finish"
            r = http.call("POST", f"/agent/runs/{a['run_id']}/finish", json=done)
            rec["t_finish"], rec["finished"] = time.time(), r.json().get("status")
        except Conflict as e:
            rec["conflict"] = f"{step}: {e}"[:300]
        except Exception as e:  # recorded and counted: the report lists every error
            rec["error"] = f"{step}: {type(e).__name__}: {e}"[:300]
        finally:
            with out_lock:
                out.write(json.dumps(rec) + "\n")
            with active_lock:
                active.discard(a["run_id"])

    last_sync = time.monotonic()
    ack: list[str] = []
    with ThreadPoolExecutor(max_workers=cfg["devices"] + 1) as pool:
        while not stop.is_set() and time.time() < cfg["deadline"]:
            if time.monotonic() - last_sync > 30.0:  # agent/loop.py re-syncs its devices every 30 s
                try:
                    http.call("PUT", "/agent/devices", json={"devices": devices, "runners": RUNNERS})
                    counts["syncs"] += 1
                except Exception as e:
                    counts["sync_errors"] = counts.get("sync_errors", 0) + 1
                    counts["last_sync_error"] = str(e)[:200]
                last_sync = time.monotonic()
            try:
                got = http.call("POST", "/agent/claim", params={"wait": min(poll, cfg["claim_wait"]), "ack": ack},
                                timeout=poll + 30.0).json()
                ack = [a["lease_id"] for a in got]  # the next claim acknowledges them: they are running
            except Exception as e:
                counts["claim_errors"] = counts.get("claim_errors", 0) + 1
                counts["last_claim_error"] = str(e)[:200]
                stop.wait(1.0 + random.random())
                continue
            t = time.time()
            counts["claims"] += 1
            new = []
            with active_lock:
                for a in got:
                    if a["run_id"] not in active:
                        active.add(a["run_id"])
                        new.append(a)
            counts["claims_with_new" if new else "claims_known_only" if got else "claims_empty"] += 1
            for a in new:
                pool.submit(serve, a, t)
    with out_lock:
        out.write(json.dumps({"summary": idx, **counts, "retried": http.retried}) + "\n")
    out.close()
