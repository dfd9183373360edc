"""The farm's own overhead: time from submit to a complete report, minus the runner's wall time.

Starts `sme2-farm up` on the embedded default (or on PostgreSQL + Redis with --production URLs),
submits a small model N times, one after another, each waited for as `sme2-client submit --wait`
waits (client/common.py wait_for), and prints p50/p90 of (submit -> every run terminal and
ingested, as the client sees it) - runner wall time. Goal: p50 < 100 ms embedded (issue 23).

    python bench/overhead.py [--n 10] [--model toy_cnn] [--database-url URL --broker-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _fixtures_farm import start_farm, stop_farm  # noqa: E402

from sme2farm.client.common import wait_for  # noqa: E402
from sme2farm.protocol import ExperimentSpec  # noqa: E402
from sme2farm.runners.build import build_local  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--model", default="toy_cnn")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--database-url")
    p.add_argument("--broker-url")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sme2-bench-"))
    manifest = work / "manifest.json"
    build_local(manifest)
    from sme2farm.runners.examples import export_example

    model = export_example(args.model, work / f"{args.model}.pte")
    env = {}
    if args.database_url:
        env["SME2_DATABASE_URL"] = args.database_url
    if args.broker_url:
        env["SME2_BROKER_URL"] = args.broker_url
    farm = start_farm(work / "farm", manifest, env)
    overheads, totals, walls = [], [], []
    try:
        client = farm.client()
        spec = ExperimentSpec(sme2="off", iterations=args.iterations, warmup=1)
        client.submit(model, spec)  # warm the processes (imports, first connections); not counted
        for _ in range(args.n):
            t0 = time.perf_counter()
            # waited for as `sme2-client submit --wait` waits (client/common.py wait_for: its polls),
            # so the figure is what a user sees
            rep = wait_for(client, client.submit(model, spec).id, quiet=True, timeout=300)
            total = time.perf_counter() - t0
            wall = sum(r.runner_wall_s or 0.0 for r in rep.runs)
            assert all(r.status == "succeeded" for r in rep.runs), [r.reason for r in rep.runs]
            totals.append(total)
            walls.append(wall)
            overheads.append(total - wall)
    finally:
        stop_farm(farm.proc)
    q = statistics.quantiles(overheads, n=10) if len(overheads) > 1 else overheads * 9
    backend = "postgresql+redis" if args.database_url else "embedded (sqlite + sqla broker)"
    print(f"farm overhead, {backend}, model {args.model}, {args.iterations} iterations, n={args.n}")
    print(f"  submit->report  p50 {statistics.median(totals) * 1000:7.1f} ms")
    print(f"  runner wall     p50 {statistics.median(walls) * 1000:7.1f} ms")
    print(f"  overhead        p50 {statistics.median(overheads) * 1000:7.1f} ms   p90 {q[-1] * 1000:7.1f} ms   "
          f"min {min(overheads) * 1000:7.1f} ms   max {max(overheads) * 1000:7.1f} ms")
    print(f"  goal p50 < 100 ms: {'met' if statistics.median(overheads) < 0.1 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
