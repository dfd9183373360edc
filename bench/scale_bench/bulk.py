"""The 100k phase: finished runs inserted with COPY, then the experiment list and reports timed.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timedelta, timezone

import httpx

from scale_bench.common import RUNNERS, SIM_TAG, ms, pct


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
        with cur.copy("COPY experiments (id, name, model_sha256, spec, labels, comparisons, inputs_description, "
                      "created_at) FROM STDIN") as cp:
            for n, (eid, runs) in enumerate(plan):
                comps = []
                for j in range(0, min(len(runs), 2 * len(devices)), 2):  # one comparison per device, as refresh writes
                    c = dict(comparisons[0]) if comparisons else {"status": "complete"}
                    c.update(device=runs[j][1][1], baseline_runs=[runs[j][0]],
                             candidate_runs=[runs[j + 1][0]] if j + 1 < len(runs) else [])
                    comps.append(c)
                cp.write_row((eid, f"bulk {n + 1}", model_sha, json.dumps({**spec, "name": f"bulk {n + 1}"}),
                              json.dumps({"bench": "bulk"}), json.dumps(comps), "all ones (default)",
                              now - timedelta(minutes=len(plan) - n)))
        with cur.copy("COPY runs (id, experiment_id, device_id, sme2, threads, mode, session, sequence, status, "
                      "reason, attempt, cancel_requested, runner, device_snapshot, device_state, exit_code, "
                      "runner_wall_s, warmup_in_trace, created_at, started_at, finished_at) FROM STDIN") as cp:
            for eid, runs in plan:
                for seq, (rid, dev, sme2) in enumerate(runs):
                    cp.write_row((rid, eid, dev[0], sme2, 1, "timing", 0, seq % 2, "succeeded", "", 1, False, runner,
                                  json.dumps(dev[2]), '{"simulated": true}', 0, 0.002, 0, now, now, now))
        parts = report_parts(analysis)  # the report's columns, as ingest writes them (migration 0008)
        with cur.copy("COPY run_results (run_id, e2e_median_ms, e2e_mean_ms, e2e_p10_ms, e2e_p90_ms, e2e_cv, n, "
                      "categories_ms, analysis, report_head, operators_json, kernels_json, created_at) "
                      "FROM STDIN") as cp:
            for _, runs in plan:
                for rid, *_ in runs:
                    cp.write_row((rid, e2e["median"], e2e["mean"], e2e["p10"], e2e["p90"], e2e["cv"], e2e["n"], cats,
                                  analysis_json, parts["report_head"], parts["operators_json"], parts["kernels_json"],
                                  now))
        with cur.copy("COPY operator_stats (id, run_id, name, category, count, total_ms, share, delegated) "
                      "FROM STDIN") as cp:
            for _, runs in plan:
                for rid, *_ in runs:
                    for op in analysis["operators"]:
                        cp.write_row((op_ids[oi], rid, op["name"][:256], op["category"], int(op["count"]),
                                      op["total_ms"], op["share"], op["delegated"]))
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
                                  (f"GET /experiments/{{id}} ({2 * args.devices} runs)", f"/experiments/{typical}",
                                   args.reps),
                                  (f"GET /experiments/{{id}} ({big} runs, default)", f"/experiments/{exp_ids[0]}",
                                   max(3, args.reps // 2)),
                                  (f"  ... ?runs=summary ({big} runs)", f"/experiments/{exp_ids[0]}?runs=summary",
                                   max(3, args.reps // 2)),
                                  (f"  ... ?runs=page (200 of {big} runs)",
                                   f"/experiments/{exp_ids[0]}?runs=page&run_page=3", args.reps),
                                  (f"  ... ?runs=full ({big} runs)", f"/experiments/{exp_ids[0]}?runs=full", 3)):
            xs, size = time_get(c, path, reps)
            results.append((label, xs))
            print(f"  {label:44s} p50 {ms(pct(xs, 50)):>10}  p99 {ms(pct(xs, 99)):>10}  "
                  f"({size / 1e3:.0f} kB, n={reps})  "
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
