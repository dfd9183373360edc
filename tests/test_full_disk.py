"""A full disk and a crash loop, for real: a small tmpfs mounted by the test (needs root), real
server processes under `sme2-farm up`, a real supervisor restarting a child that exits at once.

- the cause of the SIGBUS: prometheus_client's multiprocess store creates each
  file sparse (truncate to 64 KiB) and writes through mmap; on a full tmpfs the first write to
  the mapping faults, and the kernel sends SIGBUS. Reproduced with prometheus_client alone, and
  the farm's store (server/web/prometheus.py) on the same disk lives and says it is degraded;
- the farm with its data dir on a full tmpfs: reads answer 200, a submission gets 507 naming the
  full disk, the server is not restarted, and the metrics dir does not grow across a forced
  restart (kill -9 of the server: the supervisor starts it again on the same slot file);
- a child that exits at once: restarts back off (gaps doubling), the status file and /ready say
  "crash loop" with the last exit and the count, and the loop clears once the child stays up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import wait_for


def mount_tmpfs(mnt: Path, size: str) -> None:
    """Mount a real small file system. Without root there is no full disk to make (RLIMIT_FSIZE
    gives EFBIG and SIGXFSZ, not a full disk's ENOSPC and SIGBUS): skipped, or failed where
    services are required."""
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        (pytest.fail if os.environ.get("SME2_REQUIRE_SERVICES") == "1" else pytest.skip)(
            f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}): needs root")


def fill(root: Path) -> Path:
    """Write zeros until the file system is full (ENOSPC); the filler stays until unmount."""
    filler = root / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, bytes(64 << 10))
    except OSError:
        pass
    try:
        while True:  # the last partial block
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def full_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "1m")
    try:
        (mnt / "metrics").mkdir()
        fill(mnt)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def observe_in_child(metrics_dir: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), **env})


def test_the_sigbus_is_prometheus_clients_sparse_mmap_and_the_farms_store_survives_it(full_tmpfs):
    metrics = full_tmpfs / "metrics"
    # The cause: prometheus_client alone, one histogram observed, on the full disk.
    plain = observe_in_child(metrics, """
        from prometheus_client import Histogram
        Histogram("h", "h", ["a"]).labels("x").observe(1)
        print("survived")
    """)
    assert plain.returncode == -signal.SIGBUS, (plain.returncode, plain.stdout, plain.stderr)
    [left] = list(metrics.iterdir())        # it made its file: 64 KiB long, not one block behind it
    assert left.stat().st_size == 64 << 10 and left.stat().st_blocks == 0
    left.unlink()

    # The farm's store: the same observation lives, says why it is degraded, and leaves no file
    # (an empty .db would break the next scrape).
    farm = observe_in_child(metrics, """
        from sme2farm.server.web import prometheus as m
        m.HTTP_LATENCY.labels("GET", "/suites", "200").observe(0.01)
        m.TASKS.labels("ingest", "success").inc()
        print(m.store_check()["detail"])
    """, SME2_METRICS_SLOT="server")
    assert farm.returncode == 0, (farm.returncode, farm.stderr)
    assert "the disk is full" in farm.stdout and "memory only" in farm.stdout, farm.stdout
    assert "metrics store degraded" in farm.stderr
    assert not list(metrics.glob("*.db"))


def test_the_store_is_named_by_slot_counts_on_across_restarts_and_a_fork_gets_its_own(tmp_path):
    metrics = tmp_path / "metrics"
    code = """
        import os
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        from sme2farm.server.web import prometheus as m
        m.HTTP_LATENCY.labels("GET", "/suites", "200").observe(0.01)
        if os.fork() == 0:   # a second live process on the slot: its own file, not the parent's
            m.HTTP_LATENCY.labels("GET", "/forked", "200").observe(0.01)
            os._exit(0)
        os.wait()
        r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)
        print([l for l in generate_latest(r).decode().splitlines() if l.startswith("sme2farm_http_request_duration_seconds_count")])
    """
    for restart in (1, 2, 3):
        out = observe_in_child(metrics, code, SME2_METRICS_SLOT="server")
        assert out.returncode == 0, out.stderr
        assert f'route="/suites",status="200"}} {restart}.0' in out.stdout, out.stdout
    names = sorted(p.name for p in metrics.glob("*.db"))
    # one file for the slot, whatever the restarts; each fork (a new pid each time) its own
    assert "histogram_server.db" in names and len([n for n in names if n.startswith("histogram_server-")]) == 3, names
    assert (metrics / "histogram_server.db").stat().st_blocks * 512 >= 64 << 10   # allocated, not sparse


# ---- the farm on a full disk -------------------------------------------------------------------


def children(data_dir: Path) -> dict:
    return json.loads((data_dir / "supervisor.json").read_text())["children"]


def metrics_files(data_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (data_dir / "metrics").iterdir()}


@pytest.fixture(params=["embedded", "postgres+redis"])
def backend(request, tmp_path) -> dict[str, str]:
    """Where the database and broker live: on the full disk with the data dir (the embedded
    default), or elsewhere (PostgreSQL and a private Redis: only artifacts are on the disk)."""
    if request.param == "embedded":
        yield {}
        return
    from _fixtures_farm import PrivateRedis

    url = request.getfixturevalue("postgres_url")
    (tmp_path / "redis").mkdir()
    redis = PrivateRedis(tmp_path / "redis")
    try:
        yield {"SME2_DATABASE_URL": url, "SME2_BROKER_URL": redis.url}
    finally:
        redis.kill()


@pytest.mark.e2e
def test_a_full_disk_leaves_reads_answering_refuses_writes_507_and_never_kills_the_server(tmp_path, local_runner,
                                                                                          example_pte, backend):
    from _fixtures_farm import start_farm, stop_farm

    catalog, _ = local_runner
    pte = example_pte("toy_cnn").read_bytes()
    data = tmp_path / "data"
    mount_tmpfs(data, "40m")
    farm = None
    try:
        farm = start_farm(data, catalog.manifest, extra_env=backend)
        http = httpx.Client(base_url=farm.url, timeout=30, headers={"Authorization": f"Bearer {farm.token}"})
        server = children(data)["server"]
        spec = json.dumps({"sme2": "off", "warmup": 1, "iterations": 2})
        assert http.get("/suites").status_code == 200
        fill(data)

        # Each route more than once, over seconds: each new (route, status) is a new series in
        # the server's metrics store, which before the fix needed a new page of a sparse file.
        for _ in range(3):
            for route in ("/suites", "/experiments", "/devices", "/regressions", "/health"):
                r = http.get(route)
                assert r.status_code == 200, (route, r.status_code, r.text)
            assert http.get("/runs/999999").status_code == 404
        r = http.get("/ready")
        body = r.json()
        disk = body["checks"]["disk"]
        assert disk["ok"] is True and disk["full"] is True and "507" in disk["detail"], body
        if backend:   # nothing but artifacts on the full disk: every part can still work
            assert r.status_code == 200, body
        else:         # the beat's lease and the broker are on the full disk: not ready, and /ready says why
            assert r.status_code == 200 or body["cause"] == disk["detail"], body
        r = http.post("/experiments", files={"model": ("m.pte", pte)}, data={"spec": spec})
        assert r.status_code == 507, r.text
        assert "disk is full" in r.json()["detail"] and r.json()["unavailable"] == "disk"
        m = http.get("/metrics")
        assert m.status_code == 200 and "sme2farm_metrics_store_degraded" in m.text, m.text[-500:]
        assert 'sme2farm_child_crash_loop{child="server"} 0.0' in m.text, m.text[-1500:]

        now = children(data)["server"]
        assert (now["pid"], now["restarts"]) == (server["pid"], server["restarts"]), (server, now, farm.log("server"))
        assert now["last_exit"] is None

        # A forced restart on the full disk: the supervisor starts the server again, which
        # reopens its own store file; nothing is added to the metrics dir.
        before = metrics_files(data)
        assert "histogram_server.db" in before, before
        os.kill(server["pid"], signal.SIGKILL)

        def back():
            child = children(data)["server"]
            return child["restarts"] > server["restarts"] and child["state"] == "running" and _get(http, "/suites") == 200

        wait_for("the server restarted and answering", back, 60, every=0.2, log=lambda: farm.log("supervisor"))
        for route in ("/suites", "/experiments", "/devices", "/regressions"):
            assert http.get(route).status_code == 200, route
        after = metrics_files(data)
        # the server's files are the same files, the same size; the worker may have made its own
        # meanwhile (once, on its first task); no file is named after a pid
        assert {n: size for n, size in after.items() if "server" in n} == {n: size for n, size in before.items() if "server" in n}
        assert not [n for n in after if re.search(r"[_-][0-9]+\.db$", n)], after
        restarted = children(data)["server"]
        assert restarted["restarts"] == server["restarts"] + 1, restarted
        assert restarted["last_exit_reason"] == "killed by SIGKILL", restarted
        http.close()
    finally:
        if farm is not None:
            stop_farm(farm.proc)
        subprocess.run(["umount", "-l", str(data)], check=False)


def _get(http: httpx.Client, route: str) -> int | None:
    try:
        return http.get(route, timeout=2).status_code
    except httpx.TransportError:
        return None


# ---- the supervisor's crash loop ---------------------------------------------------------------


def test_a_child_that_exits_at_once_backs_off_and_ready_says_it_is_in_a_crash_loop(tmp_path, caplog):
    import logging

    from sme2farm.server.api.ops import _supervisor
    from sme2farm.server.config import Settings
    from sme2farm.farm.supervisor import Supervisor

    status = tmp_path / "supervisor.json"
    sup = Supervisor(tmp_path / "logs", status, backoff_s=0.2, backoff_max_s=1.6, healthy_s=30, crash_loop_exits=3)
    caplog.set_level(logging.WARNING, logger="sme2farm.supervisor")
    child = sup.start("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ))
    starts = [time.monotonic()]
    try:
        deadline = time.monotonic() + 60
        while child.restarts < 5 and time.monotonic() < deadline:
            before = child.restarts
            sup.poll()
            if child.restarts != before:
                starts.append(time.monotonic())
            time.sleep(0.02)
        assert child.restarts == 5, child
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        # the backoff grows 0.2, 0.4, 0.8, 1.6, then stays at the cap: never a tight loop
        for gap, backoff in zip(gaps, (0.2, 0.4, 0.8, 1.6, 1.6)):
            assert gap >= backoff * 0.95, gaps

        wait_for("the crasher exited again", lambda: (sup.poll() or child.state == "backoff"), 30)
        st = json.loads(status.read_text())["children"]["crasher"]
        assert st["crash_loop"] is True and st["quick_exits"] == 6 and st["last_exit"] == 3, st
        assert st["last_exit_reason"] == "exited with code 3" and st["next_start"] > time.time() - 1, st
        ready = _supervisor(Settings(data_dir=tmp_path, supervisor_status=status))["supervisor.crasher"]
        assert ready["ok"] is False and ready["crash_loop"] is True, ready
        assert ready["detail"].startswith("crash loop: 6 exits in a row") and "the last exited with code 3" in ready["detail"]
        assert "next restart in" in ready["detail"] and "logs/crasher.log" in ready["detail"], ready["detail"]
        [line] = [r.getMessage() for r in caplog.records if "crash loop" in r.getMessage()]   # said once, not per restart
        assert line.startswith("crasher is in a crash loop: 3 exits in a row") and "exited with code 3" in line, line
    finally:
        sup.stop()


def test_a_crash_loop_clears_once_the_child_stays_up(tmp_path):
    """A child that fails three times at start (a dependency not up yet), then stays: in a crash
    loop while it fails, out of it once it has run healthy_s, and /ready ok again."""
    from sme2farm.server.api.ops import _supervisor
    from sme2farm.server.config import Settings
    from sme2farm.farm.supervisor import Supervisor

    status, tries = tmp_path / "supervisor.json", tmp_path / "tries"
    script = (f"import pathlib, sys, time; p = pathlib.Path({str(tries)!r}); n = len(p.read_text()) if p.exists() else 0; "
              f"p.write_text('x' * (n + 1)); sys.exit(4) if n < 3 else time.sleep(60)")
    sup = Supervisor(tmp_path / "logs", status, backoff_s=0.1, backoff_max_s=0.4, healthy_s=3, crash_loop_exits=3)
    child = sup.start("flaky", [sys.executable, "-c", script], dict(os.environ))
    settings = Settings(data_dir=tmp_path, supervisor_status=status)
    try:
        def looping_and_running():
            sup.poll()
            return child.crash_loop and child.state == "running" and child.restarts == 3

        wait_for("the fourth start, still marked as a crash loop", looping_and_running, 30, every=0.02)
        ready = _supervisor(settings)["supervisor.flaky"]
        assert ready["ok"] is False and "running again" in ready["detail"], ready
        assert "the last exited with code 4" in ready["detail"], ready

        def cleared():
            sup.poll()
            return not child.crash_loop

        wait_for("out of the crash loop after healthy_s up", cleared, 30, every=0.05)
        ready = _supervisor(settings)["supervisor.flaky"]
        assert ready["ok"] is True and ready["crash_loop"] is False and ready["restarts"] == 3, ready
    finally:
        sup.stop()
