"""Lockout that locks out only the guilty, with real processes: a farm started by
`sme2-farm up` (server, worker, beat, local agent) on the embedded default and on PostgreSQL +
a private Redis (where the rate-limit buckets live in Redis). A bad-token flood from 127.0.0.1,
the address every farm process and the test share, must leave the valid admin token and the
local agent unthrottled (no 429, the experiment completes), while the bad tokens themselves are
answered 429 with Retry-After.

Before the fix the failed-auth bucket was keyed on the client address alone: 35 bad-token
requests gave every valid admin request 429 for 100 s, and the agent's heartbeats, claims,
finishes and uploads 429 at least 34 times.
"""

from __future__ import annotations

import re
import secrets
import threading
import time

import httpx
import pytest

from _fixtures_farm import TERMINAL, farm_on, wait_for

SHORT = {"sme2": "off", "warmup": 2, "iterations": 20}


def farm_kinds():
    return [pytest.param("embedded", marks=pytest.mark.e2e),
            pytest.param("pg_redis", marks=[pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis])]


class Flood:
    """Bad-token requests from this process (127.0.0.1) on the user API, until stopped: one bad
    token repeated and a fresh random one each time, so both the token's and the address's
    buckets are spent. Bounded in count and time."""

    def __init__(self, url: str, limit: int = 3000, every_s: float = 0.02):
        self.url, self.limit, self.every_s = url, limit, every_s
        self.repeated = f"sme2_{secrets.token_urlsafe(16)}"
        self.answers: list[tuple[str, int, str | None]] = []  # (which token, status, Retry-After)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            deadline = time.monotonic() + 240
            while not self._stop.is_set() and len(self.answers) < self.limit and time.monotonic() < deadline:
                for which, tok in (("repeated", self.repeated), ("fresh", f"sme2_{secrets.token_urlsafe(16)}")):
                    r = c.get("/experiments", headers={"Authorization": f"Bearer {tok}"})
                    self.answers.append((which, r.status_code, r.headers.get("retry-after")))
                self._stop.wait(self.every_s)

    def __enter__(self) -> "Flood":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def http_429s(metrics_text: str) -> dict[str, float]:
    """429 answers per route, from the server's request-duration histogram."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("sme2farm_http_request_duration_seconds_count{") and 'status="429"' in line:
            route = re.search(r'route="([^"]*)"', line).group(1)
            out[route] = out.get(route, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("kind", farm_kinds())
def test_a_bad_token_flood_throttles_only_the_bad_tokens(kind, request, tmp_path, example_pte):
    pte = example_pte("toy_cnn").read_bytes()
    with farm_on(kind, request, tmp_path) as (farm, _db, _redis):
        good = httpx.Client(base_url=farm.url, timeout=30, headers={"Authorization": f"Bearer {farm.token}"})
        with Flood(farm.url) as flood:
            # the flood has spent both buckets (30 a minute by default) before the user acts
            wait_for("the flood is refused 429", lambda: sum(s == 429 for _, s, _ in flood.answers) >= 10, 60)
            valid = []
            r = good.post("/experiments", files={"model": ("m.pte", pte)},
                          data={"spec": '{"sme2": "off", "warmup": 2, "iterations": 20, "sessions": 3}'})
            valid.append(r.status_code)
            assert r.status_code == 201, r.text
            exp = r.json()["id"]

            def done():
                r = good.get(f"/experiments/{exp}")
                valid.append(r.status_code)
                return r.status_code == 200 and {x["status"] for x in r.json()["runs"]} <= TERMINAL and r.json()

            report = wait_for("the experiment ended under the flood", done, 180, every=0.2, log=lambda: farm.log("agent"))
            for _ in range(20):   # and more of the valid token's reads and writes, still under the flood
                valid.append(good.get("/devices").status_code)
                valid.append(good.post("/experiments/987654/cancel").status_code)
            flooded = len(flood.answers)
        assert flooded >= 60
        assert 429 not in valid and set(valid) <= {200, 201, 404}, valid
        assert [x["status"] for x in report["runs"]] == ["succeeded"] * 3, report["runs"]
        # the bad tokens themselves: limited, with Retry-After, both the repeated one and fresh ones
        for which in ("repeated", "fresh"):
            statuses = [s for w, s, _ in flood.answers if w == which]
            later = statuses[len(statuses) // 2:]  # the buckets refill 0.5 a second: a few 401s between
            assert set(statuses) <= {401, 429} and later.count(429) >= 0.5 * len(later), (which, statuses[-20:])
            assert all(ra and int(ra) >= 1 for w, s, ra in flood.answers if w == which and s == 429)
        # the agent protocol has its own budget: a bad agent token from the flooded address is a 401
        assert httpx.post(f"{farm.url}/agent/claim", headers={"Authorization": "Bearer sme2_nope"}).status_code == 401
        # the agent was never throttled: no 429 on any agent route, nor in its log
        by_route = http_429s(good.get("/metrics").text)
        assert by_route.get("/experiments", 0) >= 10, by_route
        assert not {r: n for r, n in by_route.items() if r.startswith("/agent/")}, by_route
        assert " 429 " not in (farm.data_dir / "logs" / "agent.log").read_text(errors="replace")
        good.close()
        print(f"{kind}: {flooded} bad-token requests, {sum(s == 429 for _, s, _ in flood.answers)} answered 429; "
              f"{len(valid)} valid-token requests and the agent's: no 429; 3 runs succeeded")
