"""The load phase: experiments submitted at once to the simulated fleet, and its report.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from scale_bench.agents import agent_main
from scale_bench.common import SIM_TAG, TERMINAL, ms, pct
from scale_bench.poller import poller_main
from scale_bench.procs import Procs, cpu_ticks, pg_cpu


def load_phase(args, url: str, admin: str, register: str, work: Path, db_name: str, pg, procs: Procs) -> dict:
    ctx = mp.get_context("spawn")  # clean interpreters: nothing of this process (sockets, locks) is inherited
    stop, ready = ctx.Event(), ctx.Queue()
    rec_dir = work / "records"
    rec_dir.mkdir()
    per_agent = [args.devices // args.agents + (1 if i < args.devices % args.agents else 0) for i in range(args.agents)]
    deadline = time.time() + args.timeout
    cfg = {"url": url, "register_token": register, "trace": str(work / "trace" / "trace.etdump"),
           "log": str(work / "trace" / "runner.log"), "out": str(rec_dir), "deadline": deadline,
           "claim_wait": args.claim_wait, "protocol": getattr(args, "protocol", 2), "run_s": getattr(args, "run_s", 0.0)}
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
                raise RuntimeError(f"{len(agents) - got} agent(s) did not register "
                                   f"(exit codes {[p.exitcode for p in dead]})")
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, headers=h, timeout=120.0) as c:
        n_dev = len(c.get("/devices").json())
        print(f"  {len(agents)} agents registered {n_dev} devices")
        poll_stop = ctx.Event()
        poller = ctx.Process(target=poller_main,
                             args=(url, admin, str(work / "poller.json"), args.poll_think, poll_stop), daemon=True)
        poller.start()
        # What idle agents cost: long-polls with no work to hand out, before anything is submitted.
        idle0, idle_pg0, t_idle = cpu_ticks([procs.procs["server"].pid]), pg_cpu(db_name), time.time()
        time.sleep(5.0)
        idle_s = time.time() - t_idle
        print(f"  idle: {len(agents)} agents long-polling cost the server "
              f"{100 * (cpu_ticks([procs.procs['server'].pid]) - idle0) / idle_s:.0f}% "
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
            # without pausing them (py-spy's default pauses each process per sample: it halved throughput);
            # only threads holding the GIL: where Python spends CPU, not where it waits on PostgreSQL or a disk
            for name in ("server", "worker"):
                out = open(work / f"py-spy-{name}.txt", "wb")
                spies.append(subprocess.Popen([args.py_spy, "record", "--nonblocking", "--gil", "--format", "raw",
                                               "--rate", "50", "--subprocesses", "--pid", str(procs.procs[name].pid),
                                               "-o", str(work / f"py-spy-{name}.raw")],
                                              stdout=out, stderr=subprocess.STDOUT))
        wall0 = time.time()
        exp_ids, submit_s, expected = [], [], 0
        for i in range(n_exp):
            t0 = time.perf_counter()
            r = c.post("/experiments", files={"model": ("model.pte", model, "application/octet-stream")},
                       data={"spec": json.dumps({**spec, "name": f"scale {i + 1}/{n_exp}",
                                                 "labels": {"bench": "scale"}})})
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
                cur.execute("SELECT status, count(*) FROM runs WHERE experiment_id = ANY(%s) GROUP BY status",
                            (exp_ids,))
                by = dict(cur.fetchall())
                # What the farm's connections are doing: waiting on a row lock, running a
                # statement, or holding a transaction open while Python works.
                cur.execute("SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), "
                            "count(*) FILTER (WHERE state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock'), "
                            "count(*) FILTER (WHERE state = 'idle in transaction'), "
                            "count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()")
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
        cur.execute("SELECT id, status, reason, attempt, extract(epoch from started_at)::float8, "
                    "extract(epoch from finished_at)::float8 FROM runs WHERE experiment_id = ANY(%s)", (exp_ids,))
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
        gaps += [b["t_claim"] - a["t_finish"] for a, b in zip(rs, rs[1:])
                 if "t_finish" in a and b["t_claim"] >= a["t_finish"]]
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
    print(f"  end to end (ingested, comparisons stored): {e2e_rate:.1f} runs/s "
          f"({t_terminal - first_claim:.1f} s to the last terminal run)")
    print(f"  claim -> start acknowledged: p50 {ms(pct(claim_to_start, 50))}  p99 {ms(pct(claim_to_start, 99))}  "
          f"(n={len(claim_to_start)})")
    print(f"  start -> finish acknowledged (protocol 1: 2 uploads + finish; 2: one delivery): p50 {ms(pct(start_to_finish, 50))}  "
          f"p99 {ms(pct(start_to_finish, 99))}")
    print(f"  device idle gap, finish -> next claim: p50 {ms(pct(gaps, 50))}  p99 {ms(pct(gaps, 99))}  (n={len(gaps)})")
    api = {}
    for kind, path in (("list", "GET /experiments"), ("report", "GET /experiments/{id}")):
        xs = [s[2] for s in window if s[0] == kind and s[3] == 200]
        bad = [s[3] for s in window if s[0] == kind and s[3] != 200]
        size = max((s[4] for s in window if s[0] == kind), default=0)
        api[kind] = (pct(xs, 50), pct(xs, 99))
        print(f"  API {path:22s} during load: p50 {ms(pct(xs, 50))}  p99 {ms(pct(xs, 99))}  "
              f"max {ms(max(xs, default=0))}  "
              f"(n={len(xs)}{f', {size} runs per report' if kind == 'report' else ''}"
              f"{f', non-200: {bad[:5]}' if bad else ''})")
    print(f"  agent claims: {counts.get('claims', 0)} ({counts.get('claims_with_new', 0)} with new runs, "
          f"{counts.get('claims_known_only', 0)} answering only runs it already had, "
          f"{counts.get('claims_empty', 0)} empty); "
          f"retried requests: {retried or 'none'}; claim errors: {counts.get('claim_errors', 0)}")
    if errors:
        print(f"  agent-side errors/conflicts: {len(errors)}, e.g. {errors[:3]}")
    wall = res["wall"][1] - res["wall"][0]
    print(f"  CPU seconds over {wall:.0f} s wall ({os.cpu_count()} cores = {os.cpu_count() * wall:.0f} s): "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(res["cpu"].items(), key=lambda kv: -kv[1]))
          + f"; host load average {res['load'][0]:.1f} at start, {res['load'][1]:.1f} at end "
            f"(other users' work included)")
    steps = [("start", "t_claim", "t_start"), ("model", "t_start", "t_model"),
             ("runner.log", "t_model", "t_runner.log"), ("trace.etdump", "t_runner.log", "t_trace.etdump"),
             ("finish", "t_trace.etdump", "t_finish"), ("deliver", "t_model", "t_delivered")]
    print("  agent-side call latency: " + ", ".join(
        f"{name} p50 {ms(pct(xs, 50))} p99 {ms(pct(xs, 99))}" for name, a, b in steps
        for xs in [[r[b] - r[a] for r in recs if a in r and b in r]] if xs))
    act = res["activity"]
    if act:
        print(f"  PostgreSQL connections of the farm, sampled every 0.25 s: "
              f"waiting on a lock avg {sum(a[0] for a in act) / len(act):.1f} "
              f"max {max(a[0] for a in act)}, running a statement avg {sum(a[1] for a in act) / len(act):.1f}, "
              f"idle in transaction avg {sum(a[2] for a in act) / len(act):.1f} max {max(a[2] for a in act)}, "
              f"open avg {sum(a[3] for a in act) / len(act):.0f}")
    if res["timed_out"]:
        print(f"  TIMED OUT after --timeout {args.timeout:g} s: the {len(not_terminal)} runs not terminal below "
              f"were still in progress when the bench stopped (slow, not necessarily lost); rerun with a longer "
              f"--timeout to tell")
    print(f"  LOST: {lost}  (not terminal {len(not_terminal)}, failed without reason {len(no_reason)}, "
          f"missing rows {res['expected'] - len(runs)}, succeeded without result {succeeded_no_result})")
    print(f"  DUPLICATED: {dup}  (executed under two leases {len(dup_exec)}, "
          f"finished under two leases {len(dup_finish)}, "
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
    farm_cpu = sum(v for k, v in res["cpu"].items() if k in ("server", "worker", "beat", "postgres"))
    return {"lost": lost, "dup": dup, "rate": dispatch_rate, "e2e_rate": e2e_rate,
            "cpu_per_run": farm_cpu / len(runs) if runs else float("nan"),
            "claim_to_start_p50": pct(claim_to_start, 50), "list_p99": api["list"][1], "report_p99": api["report"][1],
            "load": res["load"]}


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
        if not frames or any(w in frames[-1] for w in ("Condition.wait", "_recv (billiard", "_poll", "select (",
                                                       "epoll", "Evloop")):
            continue  # a thread waiting for work
        where = ("event loop" if frames and frames[0].startswith("_run_module_as_main") and "uvicorn" in stack
                 else "threads")
        own = [f.split(" (")[0] for f in frames if any(f"({p}" in f for p in project)][:3]
        key = (where, " > ".join(own) or frames[-1].split(" (")[0])
        groups[key] = groups.get(key, 0) + int(n)
        totals[where] += int(n)
        leaf = frames[-1].rsplit("/", 1)[-1].rstrip(")")
        leaves[leaf] = leaves.get(leaf, 0) + int(n)
    for where, total in totals.items():
        if total:
            top = sorted(((k[1], v) for k, v in groups.items() if k[0] == where), key=lambda kv: -kv[1])[:12]
            print(f"  py-spy {name} ({where}, {total} busy samples at 50 Hz): "
                  + "; ".join(f"{100 * v / total:.0f}% {k}" for k, v in top))
    total = sum(leaves.values())
    if total:
        print(f"  py-spy {name} (self, all threads): " + "; ".join(
            f"{100 * v / total:.0f}% {k}" for k, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:15]))
