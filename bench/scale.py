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
    .venv/bin/python bench/scale.py --before c0878e1 --skip-100k   # the same load on an earlier commit's
                                                     # farm first, then this one's: both side by side

Goals on the 2-core VM: 0 lost, 0 duplicated, >= 50 runs/s, API p99 < 100 ms, 100k list/report < 300 ms.
Not part of the test suite (timings are not assertions).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from scale_bench.bulk import bulk_phase
from scale_bench.code import FarmCode
from scale_bench.common import PY, free_port
from scale_bench.load import load_phase, report_load
from scale_bench.procs import Procs
from scale_bench.trace import make_trace
from sme2farm.client.common import wait_healthy


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--devices", type=int, default=200, help="simulated devices, spread over the agents")
    p.add_argument("--runs", type=int, default=2000, help="rounded to whole experiments of devices x 2 (SME2 off + on)")
    p.add_argument("--quick", action="store_true", help="smoke run: 4 agents, 20 devices, 80 runs, 5,000 bulk runs")
    p.add_argument("--skip-100k", action="store_true",
                   help="skip inserting --bulk-runs and timing the list and reports")
    p.add_argument("--bulk-runs", type=int, default=100_000)
    p.add_argument("--big-runs", type=int, default=10_000, help="size of the one large experiment among the bulk runs")
    p.add_argument("--reps", type=int, default=20, help="timed requests per endpoint in the 100k phase")
    p.add_argument("--timeout", type=float, default=1800.0, help="the load phase stops itself after this many seconds")
    p.add_argument("--claim-wait", type=float, default=20.0,
                   help="agents' long-poll (capped by the server's poll timeout)")
    p.add_argument("--protocol", type=int, choices=(1, 2), default=2,
                   help="the agent protocol the simulated agents speak (2 if the server does: a claim and a delivery; "
                        "1: claim, start, a PUT per artifact, finish)")
    p.add_argument("--run-s", type=float, default=0.0,
                   help="seconds each simulated run keeps its device busy (0: instant devices, the farm's own ceiling; "
                        "e.g. 10 with 200 devices: at most 20 runs/s, a load the farm keeps up with, for the API's "
                        "latency at a sustainable load)")
    p.add_argument("--poll-think", type=float, default=0.25, help="poller pause between list+report pairs")
    p.add_argument("--worker-concurrency", type=int, default=4, help="Celery worker processes (docker-compose: 4)")
    p.add_argument("--server-workers", type=int, default=2, help="uvicorn worker processes (docker-compose: 2)")
    p.add_argument("--postgres-url", default=os.environ.get("SME2_TEST_POSTGRES_URL",
                                                            "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/12",
                   help="an empty Redis database; flushed at the end")
    p.add_argument("--trace-dir", help="keep the built model and trace here and reuse them next time (saves ~30 s)")
    p.add_argument("--py-spy", metavar="PATH", help="py-spy binary: profile the server and worker during the load")
    p.add_argument("--keep", action="store_true", help="keep the database and work dir for inspection")
    p.add_argument("--before", metavar="REV",
                   help="first run the same load on the farm code of git revision REV (a worktree in the work dir), "
                        "then on this checkout's, and print both side by side (e.g. c0878e1: the last landed head "
                        "before agent protocol 2, batched ingest and stored reports)")
    p.add_argument("--after", metavar="REV",
                   help="the farm code measured after (and in the 100k phase): git revision REV instead of this "
                        "checkout's working tree (which other work may be changing meanwhile)")
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

    import redis

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
    print(f"  real trace: toy_cnn, 20 iterations, {len(trace)} B ETDump "
          f"({time.monotonic() - t_start:.0f} s to build, export, run)")

    codes = [FarmCode(work, args.before)] if args.before else []
    try:
        figures = [(code.label, one_farm(args, work, code, trace, log, bulk=False)) for code in codes]
        codes.append(FarmCode(work, args.after))
        figures.append((codes[-1].label, one_farm(args, work, codes[-1], trace, log, bulk=not args.skip_100k)))
        if len(figures) > 1:
            side_by_side(figures)
        print(f"\ntotal bench time {time.monotonic() - t_start:.0f} s")
        return 0
    finally:
        for code in codes:
            code.close()
        if args.keep:
            print(f"kept: work dir {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        rds.flushdb()  # it was empty when we started: everything in it is ours


def one_farm(args, work: Path, code: FarmCode, trace: bytes, log: bytes, *, bulk: bool) -> dict:
    """A farm on a fresh database, running `code`, under the load; its figures; then, if bulk, the
    100k phase (its database read through this checkout's code: the after side's schema)."""
    import psycopg
    import redis
    import sqlalchemy as sa

    print(f"\n=== farm code: {code.label} ===")
    redis.Redis.from_url(args.redis_url).flushdb()   # the previous farm's queues and beats
    db_name = f"sme2_scale_{uuid.uuid4().hex[:10]}"
    admin_db = sa.create_engine(args.postgres_url, isolation_level="AUTOCOMMIT")
    with admin_db.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{db_name}"')
    db_url = args.postgres_url.rsplit("/", 1)[0] + f"/{db_name}"
    procs = None
    pg = None
    farm = work / f"farm-{db_name}"
    try:
        admin = f"sme2_{secrets.token_urlsafe(32)}"
        data = farm / "data"
        data.mkdir(mode=0o700, parents=True)
        shutil.copytree(work / "trace", farm / "trace")
        shutil.copy(work / "model.pte", farm / "model.pte")
        env = code.env({**os.environ, "SME2_DATA_DIR": str(data), "SME2_DATABASE_URL": db_url,
                        "SME2_BROKER_URL": args.redis_url, "SME2_ADMIN_TOKEN": admin})
        register = code.set_up(db_url, admin, env)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        procs = Procs(farm / "logs", env)
        procs.spawn("server", [PY, "-m", "uvicorn", "sme2farm.server.main:app", "--host", "127.0.0.1",
                               "--port", str(port), "--log-level", "warning", "--no-access-log",
                               "--workers", str(args.server_workers)])
        procs.spawn("worker", [PY, "-m", "celery", "-A", "sme2farm.worker.celery_app", "worker",
                               "--loglevel", "WARNING", "--concurrency", str(args.worker_concurrency)])
        procs.spawn("beat", [PY, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat", "--loglevel", "WARNING",
                             "--schedule", str(farm / "celerybeat-schedule")])
        if not wait_healthy(url, 60, every=0.2, check=procs.check):
            raise RuntimeError("the server did not come up within 60 s")
        print(f"  farm: uvicorn ({args.server_workers} process(es)), "
              f"celery worker (--concurrency {args.worker_concurrency}), celery beat; "
              f"PostgreSQL database {db_name}, Redis {args.redis_url}")
        pg = psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
        res = load_phase(args, url, admin, register, farm, db_name, pg, procs)
        figures = report_load(args, res, farm, pg)
        if bulk:
            pg.autocommit = False
            bulk_phase(args, url, admin, db_url, pg, res["exp_ids"], trace, log)
        return figures
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
            print(f"kept: database {db_url}, farm dir {farm}")
        else:
            with admin_db.connect() as c:
                c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        admin_db.dispose()


def side_by_side(figures: list[tuple[str, dict]]) -> None:
    """The load figures of each farm in columns, the goals beside them."""
    rows = [("dispatch throughput (runs/s)", "rate", "{:.1f}", ">= 50"),
            ("end to end, ingested (runs/s)", "e2e_rate", "{:.1f}", ""),
            ("farm CPU per run (ms)", "cpu_per_run", "{:.0f}", ""),
            ("claim -> running, p50 (ms)", "claim_to_start_p50", "{:.0f}", ""),
            ("GET /experiments during load, p99 (ms)", "list_p99", "{:.0f}", "< 100"),
            ("GET /experiments/{id} during load, p99 (ms)", "report_p99", "{:.0f}", "< 100"),
            ("lost", "lost", "{}", "0"), ("duplicated", "dup", "{}", "0")]
    scale = {"cpu_per_run": 1000, "claim_to_start_p50": 1000, "list_p99": 1000, "report_p99": 1000}
    names = [name for name, _ in figures]
    width = max(12, *(len(n) for n in names))
    print("\nbefore and after, this machine, one bench run (the farms ran one after the other):")
    print(f"  {'':44s}" + "".join(f"{n:>{width + 2}s}" for n in names) + "   goal")
    for label, key, fmt, goal in rows:
        cells = [fmt.format(f[key] * scale.get(key, 1)) for _, f in figures]
        print(f"  {label:44s}" + "".join(f"{c:>{width + 2}s}" for c in cells) + f"   {goal}")
    loads = ["{:.1f} / {:.1f}".format(*f["load"]) for _, f in figures]
    print(f"  {'host load average at start / end':44s}" + "".join(f"{x:>{width + 2}s}" for x in loads))


if __name__ == "__main__":
    sys.exit(main())
