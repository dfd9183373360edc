"""What SQLite's `synchronous` costs a farm commit (server/store/db.py sets it): N small
transactions (an UPDATE and an INSERT each, like a run's heartbeat and an artifact row) on a WAL
database in a temp dir, with synchronous=NORMAL and FULL. NORMAL can lose the last commits on a
power loss (never corrupts); FULL fsyncs the WAL at each commit, so a committed run survives it.

    .venv/bin/python bench/sqlite_sync.py [--commits 2000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path


def run(path: Path, mode: str, commits: int) -> list[float]:
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={mode}")
    db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, status TEXT, n INTEGER)")
    db.execute("CREATE TABLE artifacts (id INTEGER PRIMARY KEY, run_id INTEGER, name TEXT, sha256 TEXT)")
    db.executemany("INSERT INTO runs (id, status, n) VALUES (?, 'running', 0)", [(i,) for i in range(100)])
    times = []
    for i in range(commits):
        t = time.perf_counter()
        db.execute("BEGIN")
        db.execute("UPDATE runs SET n = n + 1, status = 'uploading' WHERE id = ?", (i % 100,))
        db.execute("INSERT INTO artifacts (run_id, name, sha256) VALUES (?, 'trace.etdump', ?)", (i % 100, "ab" * 32))
        db.execute("COMMIT")
        times.append(time.perf_counter() - t)
    db.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--dir", type=Path, default=None, help="where the database is made (the data dir's disk)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for mode in ("NORMAL", "FULL", "NORMAL", "FULL"):
            t = run(Path(d) / "bench.db", mode, a.commits)
            print(f"synchronous={mode:6s} {a.commits} commits: {sum(t):.2f} s, per commit median "
                  f"{statistics.median(t) * 1e3:.3f} ms, p99 {sorted(t)[int(len(t) * 0.99)] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
