"""The poller (its own process): GET /experiments and GET /experiments/{id} while the load runs.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx


def poller_main(url: str, token: str, out: str, think_s: float, stop) -> None:
    """What people watching dashboards do during the load: the list, then one report, again."""
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    samples = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0) as c:
        ids: list[int] = []
        i = 0
        while not stop.is_set():
            t0, w0 = time.perf_counter(), time.time()
            try:
                r = c.get("/experiments")
                samples.append(("list", w0, time.perf_counter() - t0, r.status_code, 0))
                if r.status_code == 200:
                    ids = [e["id"] for e in r.json()["items"]] or ids
            except httpx.HTTPError as e:
                samples.append(("list", w0, time.perf_counter() - t0, type(e).__name__, 0))
            if ids:
                eid = ids[i % len(ids)]
                i += 1
                t0, w0 = time.perf_counter(), time.time()
                try:
                    r = c.get(f"/experiments/{eid}")
                    n = len(r.json().get("runs", [])) if r.status_code == 200 else 0
                    samples.append(("report", w0, time.perf_counter() - t0, r.status_code, n))
                except httpx.HTTPError as e:
                    samples.append(("report", w0, time.perf_counter() - t0, type(e).__name__, 0))
            stop.wait(think_s)
    Path(out).write_text(json.dumps(samples))
