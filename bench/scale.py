"""Scale: simulated agents on the real HTTP protocol against the real farm on PostgreSQL + Redis.

What it starts (loopback only, everything stopped and the database dropped at the end):
- a fresh PostgreSQL database and an empty Redis database number;
- the production shape of docker-compose.yml: `uvicorn sme2farm.server.main:app`, a Celery
  `worker` and a separate Celery `beat` (`sme2-farm up` would add a real local agent and run the
  worker with a thread pool and an embedded beat; a farm this size runs the compose shape);
- --agents agent processes, each serving --devices/--agents simulated SME2 phones. An agent speaks
  the protocol agent/api.py and agent/loop.py speak (register with a register-scope token, long-poll
  claim, start, upload runner.log and trace.etdump with Content-Length and X-Content-SHA256,
  finish), over raw HTTP so the figures do not depend on the agent's code. Its devices are instant:
  every run uploads the same real ETDump, produced once at start by the local runner on the toy_cnn
  example, so ingest analyses a real trace every time;
- one poller process reading GET /experiments and GET /experiments/{id} while the load runs.

The load is what a team does with a fleet: a handful of models each profiled with SME2 off and on
on every device (one experiment = devices x 2 runs; 2,000 runs on 200 devices = 5 experiments),
all submitted at once. Then, unless --skip-100k, it inserts --bulk-runs finished runs (rows as
ingest writes them: results, operator stats, artifacts) straight into the database with COPY and
times the experiment list and reports, with a per-query breakdown of the slowest.

    .venv/bin/python bench/scale.py --quick          # smoke: 4 agents, 20 devices, 80 runs, 5,000 bulk
    .venv/bin/python bench/scale.py                  # 20 agents, 200 devices, 2,000 runs, 100,000 bulk

Goals on the 2-core VM: 0 lost, 0 duplicated, >= 50 runs/s, API p99 < 100 ms, 100k list/report < 300 ms.
Not part of the test suite (timings are not assertions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TERMINAL = ("succeeded", "failed", "cancelled", "unschedulable")  # the run states nothing leaves
SIM_TAG = "scale-sim"  # experiments select the simulated devices by this tag
RUNNERS = [  # what a simulated phone's agent holds: the Android bundle, both arms
    {"id": "sim-android-sme2on-timing", "platform": "android-arm64-v9a", "sme2": "on", "flavour": "timing",
     "executorch_version": "1.5.1", "sha256": "0" * 64, "origin": "wheel-cross"},
    {"id": "sim-android-sme2off-timing", "platform": "android-arm64-v9a", "sme2": "off", "flavour": "timing",
     "executorch_version": "1.5.1", "sha256": "0" * 64, "origin": "wheel-cross"},
]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def ms(v: float) -> str:
    return f"{v * 1000:.1f} ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the real trace ----------------------------------------------------------------------------


def make_trace(work: Path) -> tuple[bytes, bytes]:
    """Build the local runner, export toy_cnn and run it once: a real ETDump and runner log.
    In child processes, so torch and executorch stay out of this one."""
    manifest = work / "manifest.json"
    subprocess.run([PY, "-m", "sme2farm.runners.build", "--manifest", str(manifest)], check=True,
                   stdout=subprocess.DEVNULL)
    path = Path(json.loads(manifest.read_text())["builds"][0]["path"])
    if not path.is_absolute():
        path = (manifest.parent / path).resolve()
    model = work / "model.pte"
    subprocess.run([PY, "-m", "sme2farm.runners.examples", "toy_cnn", str(model)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = work / "trace"
    run_dir.mkdir()
    (run_dir / "model.pte").write_bytes(model.read_bytes())
    with open(run_dir / "runner.log", "wb") as log:
        subprocess.run([str(path), "--model_path=model.pte", "--num_executions=20", "--warmup=2", "--cpu_threads=1",
                        "--etdump_path=trace.etdump"], cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, check=True)
    return (run_dir / "trace.etdump").read_bytes(), (run_dir / "runner.log").read_bytes()


# ---- a simulated agent (its own process) -------------------------------------------------------


class Conflict(Exception):
    pass


class Http:
    """The agent's retry policy (agent/api.py): back off with jitter on network errors, 5xx and
    429 (honouring Retry-After); 409 means the lease is gone. Counts what it retried."""

    def __init__(self, url: str, token: str, connections: int):
        self.client = httpx.Client(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0),
                                   limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))
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
            for name, data, sha in uploads:
                step = f"upload {name}"
                http.call("PUT", f"/agent/runs/{a['run_id']}/artifacts/{name}", content=data,
                          headers={"X-Lease-Id": a["lease_id"], "X-Content-SHA256": sha,
                                   "Content-Type": "application/octet-stream"})
                rec[f"t_{name}"] = time.time()
            step = "finish"
            runner = RUNNERS[0] if a["sme2"] == "on" else RUNNERS[1]
            r = http.call("POST", f"/agent/runs/{a['run_id']}/finish", json={
                **lease, "status": "succeeded", "runner": runner, "device_state": {"simulated": True},
                "wall_s": 0.002, "exit_code": 0, "warmup_in_trace": 0})
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
                got = http.call("POST", "/agent/claim", params={"wait": min(poll, cfg["claim_wait"])},
                                timeout=poll + 30.0).json()
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


# ---- the poller (its own process) --------------------------------------------------------------


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


# ---- the farm's processes ----------------------------------------------------------------------


class Procs:
    def __init__(self, logs: Path, env: dict):
        self.logs, self.env, self.procs = logs, env, {}
        logs.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=self.logs)

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def cpu_ticks(pids: list[int]) -> float:
    """CPU seconds (user + system) of these processes and all their descendants, from /proc."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    hz = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(d))
        stats[int(d)] = (int(fields[11]) + int(fields[12])) / hz
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += stats.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


def postgres_backends(db_name: str) -> list[int]:
    """The PostgreSQL backends serving this database (their process title names it)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"postgres:") and f" {db_name} ".encode() in cmd:
                out.append(int(d))
    return out


def pg_cpu(db_name: str, since: dict | None = None):
    """Per-backend CPU seconds now, or (given an earlier reading) the CPU used since it: backends
    opened in between count whole, ones closed in between are missed (pools keep theirs)."""
    now = {pid: cpu_ticks([pid]) for pid in postgres_backends(db_name)}
    return now if since is None else sum(v - since.get(pid, 0.0) for pid, v in now.items())


# ---- the load phase ----------------------------------------------------------------------------


def load_phase(args, url: str, admin: str, register: str, work: Path, db_name: str, pg, procs: Procs) -> dict:
    ctx = mp.get_context("spawn")  # clean interpreters: nothing of this process (sockets, locks) is inherited
    stop, ready = ctx.Event(), ctx.Queue()
    rec_dir = work / "records"
    rec_dir.mkdir()
    per_agent = [args.devices // args.agents + (1 if i < args.devices % args.agents else 0) for i in range(args.agents)]
    deadline = time.time() + args.timeout
    cfg = {"url": url, "register_token": register, "trace": str(work / "trace" / "trace.etdump"),
           "log": str(work / "trace" / "runner.log"), "out": str(rec_dir), "deadline": deadline,
           "claim_wait": args.claim_wait}
    agents = [ctx.Process(target=agent_main, args=(i, {**cfg, "devices": n}, stop, ready), daemon=True)
              for i, n in enumerate(per_agent)]
    for p in agents:
        p.start()
    got = 0
    while got < len(agents):
        try:
            ready.get(timeout=1.0)
            got += 1
        except Exception:
            procs.check()
            dead = [p for p in agents if not p.is_alive()]
            if dead or time.time() > deadline:
                raise RuntimeError(f"{len(agents) - got} agent(s) did not register (exit codes {[p.exitcode for p in dead]})")
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=h, timeout=120.0) as c:
        n_dev = len(c.get("/devices").json())
        print(f"  {len(agents)} agents registered {n_dev} devices")
        poll_stop = ctx.Event()
        poller = ctx.Process(target=poller_main, args=(url, admin, str(work / "poller.json"), args.poll_think, poll_stop), daemon=True)
        poller.start()
        # What idle agents cost: long-polls with no work to hand out, before anything is submitted.
        idle0, idle_pg0, t_idle = cpu_ticks([procs.procs["server"].pid]), pg_cpu(db_name), time.time()
        time.sleep(5.0)
        idle_s = time.time() - t_idle
        print(f"  idle: {len(agents)} agents long-polling cost the server {100 * (cpu_ticks([procs.procs['server'].pid]) - idle0) / idle_s:.0f}% "
              f"of a core and PostgreSQL {100 * pg_cpu(db_name, idle_pg0) / idle_s:.0f}%")
        per_exp = 2 * args.devices
        n_exp = max(1, round(args.runs / per_exp))
        spec = {"sme2": "both", "threads": [1], "iterations": 20, "warmup": 2, "device": {"tags": [SIM_TAG]}}
        model = (work / "model.pte").read_bytes()
        pids = {"server": [procs.procs["server"].pid], "worker": [procs.procs["worker"].pid],
                "beat": [procs.procs["beat"].pid], "agents": [p.pid for p in agents], "poller": [poller.pid]}
        cpu0 = {k: cpu_ticks(v) for k, v in pids.items()}
        pg0 = pg_cpu(db_name)
        load0 = os.getloadavg()[0]
        spies = []
        if args.py_spy:  # sample the server and the worker (with its pool children) through the load,
            # without pausing them (py-spy's default pauses each process per sample: it halved throughput)
            for name in ("server", "worker"):
                out = open(work / f"py-spy-{name}.txt", "wb")
                spies.append(subprocess.Popen([args.py_spy, "record", "--nonblocking", "--format", "raw", "--rate", "50", "--subprocesses",
                                               "--pid", str(procs.procs[name].pid), "-o", str(work / f"py-spy-{name}.raw")],
                                              stdout=out, stderr=subprocess.STDOUT))
        wall0 = time.time()
        exp_ids, submit_s, expected = [], [], 0
        for i in range(n_exp):
            t0 = time.perf_counter()
            r = c.post("/experiments", files={"model": ("model.pte", model, "application/octet-stream")},
                       data={"spec": json.dumps({**spec, "name": f"scale {i + 1}/{n_exp}", "labels": {"bench": "scale"}})})
            submit_s.append(time.perf_counter() - t0)
            if r.status_code != 201:
                raise RuntimeError(f"submission refused: {r.status_code} {r.text[:500]}")
            rep = r.json()
            exp_ids.append(rep["id"])
            expected += len(rep["runs"])
        print(f"  submitted {n_exp} experiments x {per_exp} runs = {expected} runs "
              f"(each POST p50 {ms(pct(submit_s, 50))}, max {ms(max(submit_s))})")
        # Wait until every run is terminal (ingest included), reading the database directly so
        # the waiting adds no load to the API being measured.
        last_print, t_done, activity = time.time(), None, []
        while time.time() < deadline:
            procs.check()
            with pg.cursor() as cur:
                cur.execute("SELECT status, count(*) FROM runs WHERE experiment_id = ANY(%s) GROUP BY status", (exp_ids,))
                by = dict(cur.fetchall())
                # What the farm's connections are doing: waiting on a row lock, running a
                # statement, or holding a transaction open while Python works.
                cur.execute("SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FILTER (WHERE state = 'active' "
                            "AND wait_event_type IS DISTINCT FROM 'Lock'), count(*) FILTER (WHERE state = 'idle in transaction'), "
                            "count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
                activity.append(cur.fetchone())
            pending = sum(v for k, v in by.items() if k not in TERMINAL)
            if pending == 0:
                t_done = time.time()
                break
            if time.time() - last_print > 10:
                print(f"  {time.time() - wall0:5.0f} s: {dict(sorted(by.items()))}", flush=True)
                last_print = time.time()
            time.sleep(0.25)
        cpu1 = {k: cpu_ticks(v) for k, v in pids.items()}
        cpu1["postgres"] = pg_cpu(db_name, pg0)
        cpu0["postgres"] = 0.0
        load1 = os.getloadavg()[0]
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
        wall1 = time.time()
        poll_stop.set()
        poller.join(timeout=120)
        if poller.is_alive():
            poller.terminate()
    stop.set()
    for p in agents:
        p.join(timeout=args.claim_wait + 35)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
    return {"exp_ids": exp_ids, "expected": expected, "t_done": t_done, "wall": (wall0, wall1),
            "cpu": {k: cpu1[k] - cpu0[k] for k in cpu0}, "load": (load0, load1), "activity": activity,
            "timed_out": t_done is None, "per_exp": per_exp, "n_exp": n_exp, "agents": len(agents)}


def report_load(args, res: dict, work: Path, pg) -> dict:
    recs, summaries = [], []
    for f in sorted((work / "records").glob("agent-*.jsonl")):
        for line in f.read_text().splitlines():
            (summaries if "summary" in json.loads(line) else recs).append(json.loads(line))
    exp_ids = res["exp_ids"]
    with pg.cursor() as cur:
        cur.execute("SELECT id, status, reason, attempt, extract(epoch from started_at)::float8, extract(epoch from finished_at)::float8 "
                    "FROM runs WHERE experiment_id = ANY(%s)", (exp_ids,))
        runs = {r[0]: r[1:] for r in cur.fetchall()}
        cur.execute("SELECT r.run_id, count(*) FROM run_results r JOIN runs ON runs.id = r.run_id "
                    "WHERE runs.experiment_id = ANY(%s) GROUP BY r.run_id HAVING count(*) > 1", (exp_ids,))
        dup_results = cur.fetchall()
        cur.execute("SELECT o.run_id, o.name, count(*) FROM operator_stats o JOIN runs ON runs.id = o.run_id "
                    "WHERE runs.experiment_id = ANY(%s) GROUP BY o.run_id, o.name HAVING count(*) > 1", (exp_ids,))
        dup_ops = cur.fetchall()
        cur.execute("SELECT count(*) FROM runs WHERE experiment_id = ANY(%s) AND status = 'succeeded' AND NOT EXISTS "
                    "(SELECT 1 FROM run_results WHERE run_results.run_id = runs.id)", (exp_ids,))
        succeeded_no_result = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM experiments WHERE id = ANY(%s) AND "
                    "(comparisons IS NULL OR json_array_length(comparisons::json) = 0)", (exp_ids,))
        exp_no_comparison = cur.fetchone()[0]
    by_status: dict[str, int] = {}
    for st, *_ in runs.values():
        by_status[st] = by_status.get(st, 0) + 1
    not_terminal = [rid for rid, (st, *_) in runs.items() if st not in TERMINAL]
    no_reason = [rid for rid, (st, reason, *_) in runs.items() if st in TERMINAL and st != "succeeded" and not reason]
    reasons: dict[str, int] = {}
    for st, reason, *_ in runs.values():
        if st != "succeeded":
            reasons[f"{st}: {reason[:120]}"] = reasons.get(f"{st}: {reason[:120]}", 0) + 1
    # Duplicated: one run started or finished under two leases (two agents executed it), or stored twice.
    started: dict[int, set] = {}
    finished: dict[int, set] = {}
    for r in recs:
        if "t_start" in r:
            started.setdefault(r["run_id"], set()).add((r["agent"], r["lease"]))
        if "t_finish" in r:
            finished.setdefault(r["run_id"], set()).add((r["agent"], r["lease"]))
    # Work the farm threw away: the agent's finish was accepted as a success, the run still failed.
    dropped: dict[str, int] = {}
    for r in recs:
        st, reason = runs.get(r["run_id"], ("missing", ""))[:2]
        if r.get("finished") == "analyzing" and st in TERMINAL and st != "succeeded":
            dropped[reason[:140]] = dropped.get(reason[:140], 0) + 1
    dup_exec = sorted(rid for rid, s in started.items() if len(s) > 1)
    dup_finish = sorted(rid for rid, s in finished.items() if len(s) > 1)
    lost = len(not_terminal) + len(no_reason) + (res["expected"] - len(runs)) + succeeded_no_result
    dup = len(dup_exec) + len(dup_finish) + len(dup_results) + len(dup_ops)

    done = [r for r in recs if "t_finish" in r]
    first_claim = min((r["t_claim"] for r in recs), default=float("nan"))
    last_finish = max((r["t_finish"] for r in done), default=float("nan"))
    t_terminal = max((f for *_, f in runs.values() if f), default=float("nan"))
    dispatch_rate = len(done) / (last_finish - first_claim) if done else 0.0
    e2e_rate = len(runs) / (t_terminal - first_claim) if runs else 0.0
    claim_to_start = [r["t_start"] - r["t_claim"] for r in recs if "t_start" in r]
    start_to_finish = [r["t_finish"] - r["t_start"] for r in done]
    # A device's idle gap: its previous finish acknowledged -> its next run in the agent's hands
    # (finish -> dispatch task -> claim long-poll sees it). With instant devices this is the hop cost.
    by_dev: dict[str, list] = {}
    for r in recs:
        by_dev.setdefault(r["device"], []).append(r)
    gaps = []
    for rs in by_dev.values():
        rs.sort(key=lambda r: r["t_claim"])
        gaps += [b["t_claim"] - a["t_finish"] for a, b in zip(rs, rs[1:]) if "t_finish" in a and b["t_claim"] >= a["t_finish"]]
    errors = [r.get("error") or r.get("conflict") for r in recs if "error" in r or "conflict" in r]
    counts: dict[str, int] = {}
    retried: dict[str, int] = {}
    for s in summaries:
        for k, v in s.items():
            if isinstance(v, int) and k != "summary":
                counts[k] = counts.get(k, 0) + v
        for k, v in s.get("retried", {}).items():
            retried[k] = retried.get(k, 0) + v
    samples = json.loads((work / "poller.json").read_text()) if (work / "poller.json").exists() else []
    t_end = t_terminal if t_terminal == t_terminal else res["wall"][1]
    window = [s for s in samples if first_claim <= s[1] <= t_end]

    print(f"\nload: {res['agents']} agents, {args.devices} devices, {res['n_exp']} experiments x {res['per_exp']} runs "
          f"(SME2 off + on on every device) = {res['expected']} runs")
    print(f"  runs by status: {dict(sorted(by_status.items()))}; requeued (attempt > 1): "
          f"{sum(1 for st, reason, att, *_ in runs.values() if (att or 0) > 1)}")
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        print(f"    {v} x {k}")
    print(f"  dispatch throughput: {dispatch_rate:.1f} runs/s ({len(done)} finished by agents in "
          f"{last_finish - first_claim:.1f} s, first claim -> last finish)")
    print(f"  end to end (ingested, comparisons stored): {e2e_rate:.1f} runs/s ({t_terminal - first_claim:.1f} s to the last terminal run)")
    print(f"  claim -> start acknowledged: p50 {ms(pct(claim_to_start, 50))}  p99 {ms(pct(claim_to_start, 99))}  (n={len(claim_to_start)})")
    print(f"  start -> finish acknowledged (2 uploads + finish): p50 {ms(pct(start_to_finish, 50))}  p99 {ms(pct(start_to_finish, 99))}")
    print(f"  device idle gap, finish -> next claim: p50 {ms(pct(gaps, 50))}  p99 {ms(pct(gaps, 99))}  (n={len(gaps)})")
    api = {}
    for kind, path in (("list", "GET /experiments"), ("report", "GET /experiments/{id}")):
        xs = [s[2] for s in window if s[0] == kind and s[3] == 200]
        bad = [s[3] for s in window if s[0] == kind and s[3] != 200]
        size = max((s[4] for s in window if s[0] == kind), default=0)
        api[kind] = (pct(xs, 50), pct(xs, 99))
        print(f"  API {path:22s} during load: p50 {ms(pct(xs, 50))}  p99 {ms(pct(xs, 99))}  max {ms(max(xs, default=0))}  "
              f"(n={len(xs)}{f', {size} runs per report' if kind == 'report' else ''}{f', non-200: {bad[:5]}' if bad else ''})")
    print(f"  agent claims: {counts.get('claims', 0)} ({counts.get('claims_with_new', 0)} with new runs, "
          f"{counts.get('claims_known_only', 0)} answering only runs it already had, {counts.get('claims_empty', 0)} empty); "
          f"retried requests: {retried or 'none'}; claim errors: {counts.get('claim_errors', 0)}")
    if errors:
        print(f"  agent-side errors/conflicts: {len(errors)}, e.g. {errors[:3]}")
    wall = res["wall"][1] - res["wall"][0]
    print(f"  CPU seconds over {wall:.0f} s wall ({os.cpu_count()} cores = {os.cpu_count() * wall:.0f} s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(res["cpu"].items(), key=lambda kv: -kv[1]))
          + f"; host load average {res['load'][0]:.1f} at start, {res['load'][1]:.1f} at end (other users' work included)")
    steps = [("start", "t_claim", "t_start"), ("model", "t_start", "t_model"), ("runner.log", "t_model", "t_runner.log"),
             ("trace.etdump", "t_runner.log", "t_trace.etdump"), ("finish", "t_trace.etdump", "t_finish")]
    print("  agent-side call latency: " + ", ".join(
        f"{name} p50 {ms(pct(xs, 50))} p99 {ms(pct(xs, 99))}" for name, a, b in steps
        for xs in [[r[b] - r[a] for r in recs if a in r and b in r]]))
    act = res["activity"]
    if act:
        print(f"  PostgreSQL connections of the farm, sampled every 0.25 s: waiting on a lock avg {sum(a[0] for a in act) / len(act):.1f} "
              f"max {max(a[0] for a in act)}, running a statement avg {sum(a[1] for a in act) / len(act):.1f}, idle in transaction "
              f"avg {sum(a[2] for a in act) / len(act):.1f} max {max(a[2] for a in act)}, open avg {sum(a[3] for a in act) / len(act):.0f}")
    if res["timed_out"]:
        print(f"  TIMED OUT after --timeout {args.timeout:g} s: the {len(not_terminal)} runs not terminal below were still "
              f"in progress when the bench stopped (slow, not necessarily lost); rerun with a longer --timeout to tell")
    print(f"  LOST: {lost}  (not terminal {len(not_terminal)}, failed without reason {len(no_reason)}, "
          f"missing rows {res['expected'] - len(runs)}, succeeded without result {succeeded_no_result})")
    print(f"  DUPLICATED: {dup}  (executed under two leases {len(dup_exec)}, finished under two leases {len(dup_finish)}, "
          f"two RunResult rows {len(dup_results)}, operator rows stored twice {len(dup_ops)})")
    if dropped:
        print(f"  FAILED AFTER A SUCCESSFUL FINISH: {sum(dropped.values())} runs the agent delivered (finish answered "
              f"'analyzing') ended not succeeded: " + "; ".join(f"{v} x {k}" for k, v in dropped.items()))
    if exp_no_comparison:
        print(f"  experiments without comparisons: {exp_no_comparison}")
    for name in ("server", "worker"):
        raw = work / f"py-spy-{name}.raw"
        if raw.exists():
            print_profile(name, raw)
    goals = [("0 lost", lost == 0), ("0 duplicated", dup == 0), (">= 50 runs/s", dispatch_rate >= 50),
             ("API p99 < 100 ms", all(v[1] < 0.1 for v in api.values()))]
    print("  goals: " + ", ".join(f"{g} {'met' if ok else 'NOT met'}" for g, ok in goals))
    return {"lost": lost, "dup": dup, "rate": dispatch_rate}


def print_profile(name: str, raw: Path) -> None:
    """py-spy's collapsed stacks grouped by the project's own frames (the first three), the event
    loop (the main thread) apart from the worker threads; waiting-for-work threads left out."""
    groups: dict[tuple[str, str], int] = {}
    leaves: dict[str, int] = {}  # where the CPU is spent itself (the sampled frame), any thread
    totals = {"event loop": 0, "threads": 0}
    project = ("server/", "worker/", "analysis/", "agent/", "sme2farm/")
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")[1:]  # [0] names the process
        if not frames or any(w in frames[-1] for w in ("Condition.wait", "_recv (billiard", "_poll", "select (", "epoll", "Evloop")):
            continue  # a thread waiting for work
        where = "event loop" if frames and frames[0].startswith("_run_module_as_main") and "uvicorn" in stack else "threads"
        own = [f.split(" (")[0] for f in frames if any(f"({p}" in f for p in project)][:3]
        key = (where, " > ".join(own) or frames[-1].split(" (")[0])
        groups[key] = groups.get(key, 0) + int(n)
        totals[where] += int(n)
        leaf = frames[-1].rsplit("/", 1)[-1].rstrip(")")
        leaves[leaf] = leaves.get(leaf, 0) + int(n)
    for where, total in totals.items():
        if total:
            top = sorted(((k[1], v) for k, v in groups.items() if k[0] == where), key=lambda kv: -kv[1])[:7]
            print(f"  py-spy {name} ({where}, {total} busy samples at 50 Hz): "
                  + "; ".join(f"{100 * v / total:.0f}% {k}" for k, v in top))
    total = sum(leaves.values())
    if total:
        print(f"  py-spy {name} (self, all threads): " + "; ".join(
            f"{100 * v / total:.0f}% {k}" for k, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:10]))


# ---- the 100k phase ----------------------------------------------------------------------------


def bulk_insert(pg, n_runs: int, per_exp: int, big: int, template_exps: list[int], analysis: dict,
                sizes: dict[str, tuple[int, str]]) -> tuple[list[int], int]:
    """COPY n_runs succeeded runs (with their results, operator stats and artifact rows, as ingest
    writes them) into experiments of per_exp runs, plus one of `big` runs. Returns experiment ids
    (the big one first) and the number of runs."""
    with pg.cursor() as cur:
        cur.execute("SELECT id, serial, info FROM devices WHERE info::text LIKE %s ORDER BY id", (f"%{SIM_TAG}%",))
        devices = cur.fetchall()
        # The load phase's experiment with the most comparisons is the template (real compare() output).
        cur.execute("SELECT model_sha256, spec, comparisons FROM experiments WHERE id = ANY(%s) "
                    "ORDER BY json_array_length(comparisons::json) DESC LIMIT 1", (template_exps,))
        model_sha, spec, comparisons = cur.fetchone()
    sizes_plan = ([big] if big else []) + [per_exp] * ((n_runs - big) // per_exp)
    if (n_runs - big) % per_exp:
        sizes_plan.append((n_runs - big) % per_exp)
    now = datetime.now(timezone.utc)
    from sme2farm.server.services.reports import report_parts

    analysis_json = json.dumps(analysis)
    cats = json.dumps(analysis["categories_ms"])
    e2e = analysis["e2e_ms"]
    runner = json.dumps(RUNNERS[1])

    def ids(cur, table: str, n: int) -> list[int]:
        cur.execute(f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", (n,))
        return [r[0] for r in cur.fetchall()]

    exp_ids = []
    with pg.cursor() as cur:
        exp_rows = ids(cur, "experiments", len(sizes_plan))
        run_ids = ids(cur, "runs", sum(sizes_plan))
        op_ids = ids(cur, "operator_stats", sum(sizes_plan) * len(analysis["operators"]))
        art_ids = ids(cur, "artifacts", sum(sizes_plan) * len(sizes))
        ri = oi = ai = 0
        plan = []  # (exp_id, [(run_id, device, sme2)])
        for eid, size in zip(exp_rows, sizes_plan):
            runs = []
            for k in range(size):
                dev = devices[(k // 2) % len(devices)]
                runs.append((run_ids[ri], dev, "off" if k % 2 == 0 else "on"))
                ri += 1
            plan.append((eid, runs))
            exp_ids.append(eid)
        with cur.copy("COPY experiments (id, name, model_sha256, spec, labels, comparisons, inputs_description, created_at) FROM STDIN") as cp:
            for n, (eid, runs) in enumerate(plan):
                comps = []
                for j in range(0, min(len(runs), 2 * len(devices)), 2):  # one comparison per device, as refresh writes
                    c = dict(comparisons[0]) if comparisons else {"status": "complete"}
                    c.update(device=runs[j][1][1], baseline_runs=[runs[j][0]], candidate_runs=[runs[j + 1][0]] if j + 1 < len(runs) else [])
                    comps.append(c)
                cp.write_row((eid, f"bulk {n + 1}", model_sha, json.dumps({**spec, "name": f"bulk {n + 1}"}),
                              json.dumps({"bench": "bulk"}), json.dumps(comps), "all ones (default)", now - timedelta(minutes=len(plan) - n)))
        with cur.copy("COPY runs (id, experiment_id, device_id, sme2, threads, mode, session, sequence, status, reason, attempt, "
                      "cancel_requested, runner, device_snapshot, device_state, exit_code, runner_wall_s, warmup_in_trace, "
                      "created_at, started_at, finished_at) FROM STDIN") as cp:
            for eid, runs in plan:
                for seq, (rid, dev, sme2) in enumerate(runs):
                    cp.write_row((rid, eid, dev[0], sme2, 1, "timing", 0, seq % 2, "succeeded", "", 1, False, runner,
                                  json.dumps(dev[2]), '{"simulated": true}', 0, 0.002, 0, now, now, now))
        parts = report_parts(analysis)  # the report's columns, as ingest writes them (migration 0008)
        with cur.copy("COPY run_results (run_id, e2e_median_ms, e2e_mean_ms, e2e_p10_ms, e2e_p90_ms, e2e_cv, n, "
                      "categories_ms, analysis, report_head, operators_json, kernels_json, created_at) FROM STDIN") as cp:
            for _, runs in plan:
                for rid, *_ in runs:
                    cp.write_row((rid, e2e["median"], e2e["mean"], e2e["p10"], e2e["p90"], e2e["cv"], e2e["n"], cats, analysis_json,
                                  parts["report_head"], parts["operators_json"], parts["kernels_json"], now))
        with cur.copy("COPY operator_stats (id, run_id, name, category, count, total_ms, share, delegated) FROM STDIN") as cp:
            for _, runs in plan:
                for rid, *_ in runs:
                    for op in analysis["operators"]:
                        cp.write_row((op_ids[oi], rid, op["name"][:256], op["category"], int(op["count"]), op["total_ms"],
                                      op["share"], op["delegated"]))
                        oi += 1
        with cur.copy("COPY artifacts (id, run_id, name, size, sha256, created_at) FROM STDIN") as cp:
            for _, runs in plan:
                for rid, *_ in runs:
                    for name, (size, sha) in sizes.items():
                        cp.write_row((art_ids[ai], rid, name, size, sha, now))
                        ai += 1
    pg.commit()
    with pg.cursor() as cur:
        cur.execute("ANALYZE")  # what autovacuum does after a bulk load; without it the planner guesses
    pg.commit()
    return exp_ids, sum(sizes_plan)


def time_get(c: httpx.Client, path: str, n: int) -> tuple[list[float], int]:
    c.get(path)  # warm (first connection, caches); not counted
    xs, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        r = c.get(path)
        xs.append(time.perf_counter() - t0)
        r.raise_for_status()
        size = len(r.content)
    return xs, size


def breakdown(db_url: str, what: str, fn) -> None:
    """Run one route's service calls in this process with every SQL statement timed: where the
    time of a slow list or report goes (queries vs building the response)."""
    from sqlalchemy import event

    from sme2farm.server.store.db import get_engine, session_scope

    engine = get_engine(db_url)
    stmts: list[list] = []

    def before(conn, cursor, statement, params, context, executemany):
        conn.info["t0"] = time.perf_counter()

    def after(conn, cursor, statement, params, context, executemany):
        stmts.append([time.perf_counter() - conn.info["t0"], cursor.rowcount, " ".join(statement.split())])

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        fn(engine, session_scope)  # warm
        stmts.clear()
        t0 = time.perf_counter()
        fn(engine, session_scope)
        total = time.perf_counter() - t0
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    sql = sum(s[0] for s in stmts)
    print(f"    {what}: {ms(total)} in process, of which SQL {ms(sql)} in {len(stmts)} statements, "
          f"Python (ORM rows, report objects, JSON) {ms(total - sql)}")
    for t, rows, text in sorted(stmts, key=lambda s: -s[0])[:3]:
        print(f"      {ms(t):>9}  {rows:>6} rows  {text[:150]}")


def bulk_phase(args, url: str, admin: str, db_url: str, pg, template_exps: list[int], trace: bytes, log: bytes) -> None:
    from sme2farm import analysis as an

    report = an.analyze(trace)
    derived = {"report.json": json.dumps(report).encode(), "report.md": an.to_markdown(report).encode(),
               "latencies.csv": an.to_csv(report).encode(), "perfetto.json": json.dumps(an.to_perfetto(trace)).encode(),
               "trace.etdump": trace, "runner.log": log}
    sizes = {k: (len(v), hashlib.sha256(v).hexdigest()) for k, v in derived.items()}
    big = min(args.big_runs, args.bulk_runs)
    t0 = time.monotonic()
    exp_ids, n = bulk_insert(pg, args.bulk_runs, 2 * args.devices, big, template_exps, report, sizes)
    with pg.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs")
        total_runs = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM experiments")
        total_exps = cur.fetchone()[0]
        cur.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        db_size = cur.fetchone()[0]
    print(f"\n100k: inserted {n} succeeded runs in {len(exp_ids)} experiments (one of {big} runs, the rest "
          f"{2 * args.devices} each) with results, operator stats and artifact rows in {time.monotonic() - t0:.0f} s; "
          f"database now {total_runs} runs, {total_exps} experiments, {db_size}")
    typical = exp_ids[-1] if len(exp_ids) > 1 else exp_ids[0]
    results = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=300.0) as c:
        for label, path, reps in (("GET /experiments (page 1, 20 per page)", "/experiments", args.reps),
                                  (f"GET /experiments/{{id}} ({2 * args.devices} runs)", f"/experiments/{typical}", args.reps),
                                  (f"GET /experiments/{{id}} ({big} runs, default)", f"/experiments/{exp_ids[0]}", max(3, args.reps // 2)),
                                  (f"  ... ?runs=summary ({big} runs)", f"/experiments/{exp_ids[0]}?runs=summary", max(3, args.reps // 2)),
                                  (f"  ... ?runs=page (200 of {big} runs)", f"/experiments/{exp_ids[0]}?runs=page&run_page=3", args.reps),
                                  (f"  ... ?runs=full ({big} runs)", f"/experiments/{exp_ids[0]}?runs=full", 3)):
            xs, size = time_get(c, path, reps)
            results.append((label, xs))
            print(f"  {label:44s} p50 {ms(pct(xs, 50)):>10}  p99 {ms(pct(xs, 99)):>10}  ({size / 1e3:.0f} kB, n={reps})  "
                  f"goal p99 < 300 ms: {'met' if pct(xs, 99) < 0.3 else 'NOT met'}")
    # Where the time goes, in this process with the server's own service functions.
    try:
        from sme2farm.server.services import experiments as es
        from sme2farm.server.services import reports

        def listing(engine, scope):
            with scope(db_url) as s:
                rows, _ = es.get_page(s, page=1, page_size=20)
                [reports.summary(e, by_status).model_dump_json() for e, by_status in rows]

        def one(eid, runs=None):
            def f(engine, scope):
                with scope(db_url) as s:
                    reports.report_json(s, experiment_id=eid, runs=runs)
            return f

        print("  breakdown (slowest statements):")
        breakdown(db_url, "list", listing)
        breakdown(db_url, f"report of {2 * args.devices} runs", one(typical))
        breakdown(db_url, f"report of {big} runs (default)", one(exp_ids[0]))
        breakdown(db_url, f"report of {big} runs in full", one(exp_ids[0], "full"))
    except Exception as e:  # the services are being refactored; the HTTP timings above stand alone
        print(f"  breakdown unavailable: {type(e).__name__}: {e}")


# ---- main --------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--devices", type=int, default=200, help="simulated devices, spread over the agents")
    p.add_argument("--runs", type=int, default=2000, help="rounded to whole experiments of devices x 2 (SME2 off + on)")
    p.add_argument("--quick", action="store_true", help="smoke run: 4 agents, 20 devices, 80 runs, 5,000 bulk runs")
    p.add_argument("--skip-100k", action="store_true", help="skip inserting --bulk-runs and timing the list and reports")
    p.add_argument("--bulk-runs", type=int, default=100_000)
    p.add_argument("--big-runs", type=int, default=10_000, help="size of the one large experiment among the bulk runs")
    p.add_argument("--reps", type=int, default=20, help="timed requests per endpoint in the 100k phase")
    p.add_argument("--timeout", type=float, default=1800.0, help="the load phase stops itself after this many seconds")
    p.add_argument("--claim-wait", type=float, default=20.0, help="agents' long-poll (capped by the server's poll timeout)")
    p.add_argument("--poll-think", type=float, default=0.25, help="poller pause between list+report pairs")
    p.add_argument("--worker-concurrency", type=int, default=4, help="Celery worker processes (docker-compose: 4)")
    p.add_argument("--server-workers", type=int, default=1, help="uvicorn worker processes (docker-compose: 1)")
    p.add_argument("--postgres-url", default=os.environ.get("SME2_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12", help="an empty Redis database; flushed at the end")
    p.add_argument("--trace-dir", help="keep the built model and trace here and reuse them next time (saves ~30 s)")
    p.add_argument("--py-spy", metavar="PATH", help="py-spy binary: profile the server and worker during the load")
    p.add_argument("--keep", action="store_true", help="keep the database and work dir for inspection")
    args = p.parse_args()
    if args.quick:
        args.agents, args.devices, args.runs = 4, 20, 80
        args.bulk_runs, args.big_runs, args.reps = 5000, 1000, 10
        args.timeout = min(args.timeout, 300.0)
    if args.devices < args.agents or args.agents < 1:
        p.error("--devices must be at least --agents (each agent serves at least one device)")
    for url in (args.postgres_url, args.redis_url):
        host = httpx.URL(url.replace("postgresql+psycopg", "http").replace("redis", "http")).host
        if host not in ("127.0.0.1", "localhost", "::1"):
            p.error(f"{url}: loopback only")

    import psycopg
    import redis
    import sqlalchemy as sa

    rds = redis.Redis.from_url(args.redis_url)
    if rds.dbsize():
        p.error(f"{args.redis_url} is not empty ({rds.dbsize()} keys); pick an empty database number with --redis-url")
    work = Path(tempfile.mkdtemp(prefix="sme2-scale-"))
    t_start = time.monotonic()
    print(f"scale bench: work dir {work}")
    if args.trace_dir and (Path(args.trace_dir) / "trace" / "trace.etdump").exists():
        shutil.copytree(args.trace_dir, work, dirs_exist_ok=True)  # a trace kept from an earlier run
        trace, log = (work / "trace" / "trace.etdump").read_bytes(), (work / "trace" / "runner.log").read_bytes()
    else:
        trace, log = make_trace(work)
        if args.trace_dir:
            shutil.copytree(work, args.trace_dir, dirs_exist_ok=True)
    print(f"  real trace: toy_cnn, 20 iterations, {len(trace)} B ETDump ({time.monotonic() - t_start:.0f} s to build, export, run)")

    db_name = f"sme2_scale_{uuid.uuid4().hex[:10]}"
    admin_db = sa.create_engine(args.postgres_url, isolation_level="AUTOCOMMIT")
    with admin_db.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{db_name}"')
    db_url = args.postgres_url.rsplit("/", 1)[0] + f"/{db_name}"
    procs = None
    pg = None
    try:
        from sme2farm.server.store.db import migrate, session_scope
        from sme2farm.server.services import tokens as token_service

        migrate(db_url)
        admin = f"sme2_{secrets.token_urlsafe(32)}"
        with session_scope(db_url) as s:
            token_service.create(s, name="admin", scope="admin", token=admin)
            register = token_service.create(s, name="scale-bench", scope="register")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        data = work / "data"
        data.mkdir(mode=0o700)
        env = {**os.environ, "SME2_DATA_DIR": str(data), "SME2_DATABASE_URL": db_url, "SME2_BROKER_URL": args.redis_url,
               "SME2_ADMIN_TOKEN": admin}
        procs = Procs(work / "logs", env)
        procs.spawn("server", [PY, "-m", "uvicorn", "sme2farm.server.main:app", "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warning", "--no-access-log", "--workers", str(args.server_workers)])
        procs.spawn("worker", [PY, "-m", "celery", "-A", "sme2farm.worker.celery_app", "worker", "--loglevel", "WARNING",
                               "--concurrency", str(args.worker_concurrency)])
        procs.spawn("beat", [PY, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat", "--loglevel", "WARNING",
                             "--schedule", str(work / "celerybeat-schedule")])
        deadline = time.monotonic() + 60
        while True:
            procs.check()
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not come up within 60 s")
            time.sleep(0.2)
        print(f"  farm: uvicorn ({args.server_workers} process(es)), celery worker (--concurrency {args.worker_concurrency}), celery beat; "
              f"PostgreSQL database {db_name}, Redis {args.redis_url}")
        pg = psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
        res = load_phase(args, url, admin, register, work, db_name, pg, procs)
        report_load(args, res, work, pg)
        if not args.skip_100k:
            pg.autocommit = False
            bulk_phase(args, url, admin, db_url, pg, res["exp_ids"], trace, log)
        print(f"\ntotal bench time {time.monotonic() - t_start:.0f} s")
        return 0
    finally:
        if procs is not None:
            procs.stop()
        if pg is not None:
            pg.close()
        try:
            from sme2farm.server.store.db import get_engine

            get_engine(db_url).dispose()
        except Exception:
            pass
        if args.keep:
            print(f"kept: database {db_url}, work dir {work}")
        else:
            with admin_db.connect() as c:
                c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            shutil.rmtree(work, ignore_errors=True)
        admin_db.dispose()
        rds.flushdb()  # it was empty when we started: everything in it is ours


if __name__ == "__main__":
    sys.exit(main())
