"""End to end, for real: `sme2-farm up` starts the server, the Celery worker + beat and an agent;
`sme2-client` submits a real exported .pte; the C++ runner executes it with the ExecuTorch
runtime; the ETDump comes back, is ingested and reported. Once on the embedded default (SQLite
and an SQLite-backed broker), once on the production parts (PostgreSQL and Redis)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from _fixtures_farm import start_farm, stop_farm

pytestmark = pytest.mark.e2e

CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")


def inspector_e2e_ms(trace: bytes, tmp_path) -> list[float]:
    """Per-iteration Method::execute durations computed by ExecuTorch's own Inspector: an
    independent reading of the same file."""
    from executorch.devtools import Inspector

    path = tmp_path / "trace.etdump"
    path.write_bytes(trace)
    inspector = Inspector(etdump_path=str(path))
    out = []
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        for ev in block.events:
            if ev.name == "Method::execute":
                out += [d for d in ev.perf_data.raw]
    return out


def check_report(rep: dict, farm, tmp_path) -> None:
    assert rep["status"] == "partial"  # off succeeded, on could not run here
    off = next(r for r in rep["runs"] if r["sme2"] == "off")
    on = next(r for r in rep["runs"] if r["sme2"] == "on")
    assert off["status"] == "succeeded", off["reason"]
    e2e = off["e2e_ms"]
    assert e2e["n"] == 30 and e2e["median"] > 0 and e2e["p10"] <= e2e["median"] <= e2e["p90"]
    cats = off["categories_ms"]
    assert set(cats) == set(CATEGORIES) and all(v >= 0 for v in cats.values())
    assert sum(cats.values()) == pytest.approx(e2e["mean"], rel=1e-6)
    assert cats["Convolution"] > 0 and cats["GEMM"] > 0  # toy_cnn's convs and linear ran on XNNPACK
    assert off["runner"]["platform"] == "linux-x86_64" and off["runner"]["sme2"] == "off"
    assert len(off["runner"]["sha256"]) == 64
    assert off["device"]["sme2"] is False
    # SME2 on: never run, never faked, and the reason names what is missing
    assert on["status"] == "unschedulable"
    assert "SME2" in on["reason"] and off["device"]["serial"] in on["reason"]
    assert on["e2e_ms"] is None and on["categories_ms"] is None
    [cmp] = rep["comparisons"]
    assert cmp["status"] == "incomplete" and "unschedulable" in cmp["reason"]
    # the stored trace agrees with ExecuTorch's Inspector
    trace = farm.client().artifact(off["id"], "trace.etdump")
    samples = inspector_e2e_ms(trace, tmp_path)
    assert len(samples) == 30
    assert sum(samples) / len(samples) == pytest.approx(e2e["mean"], rel=0.01)


def test_submit_wait_json_on_the_embedded_default(farm, example_pte, tmp_path):
    model = example_pte("toy_cnn")
    # 3: this host has no SME2, so the SME2-on arm is unschedulable (and nothing failed)
    check_report(farm.submit_json(str(model), "--sme2", "both", "--iterations", "30", "--warmup", "3", code=3),
                 farm, tmp_path)


def test_cli_text_report_status_list_devices(farm, example_pte):
    model = example_pte("mlp")
    done = farm.cli("submit", str(model), "--sme2", "both", "--iterations", "10", "--wait", "--name", "mlp-text")
    assert done.returncode == 3, done.stderr  # the SME2-on arm is unschedulable on this host
    out = done.stdout
    assert "SME2 off, 1 thread(s)" in out and "succeeded" in out
    assert "unschedulable" in out and "reason: SME2 on needs a device with SME2" in out
    assert "E2E ms: median" in out and "GEMM" in out
    listing = farm.cli("list")
    assert listing.returncode == 0 and "mlp-text" in listing.stdout
    exp_id = next(line.split()[0] for line in listing.stdout.splitlines() if "mlp-text" in line)
    status = farm.cli("status", exp_id, "--json")
    assert json.loads(status.stdout)["name"] == "mlp-text"
    cancelled = farm.cli("cancel", exp_id)  # everything already ended: nothing changes
    assert cancelled.returncode == 0 and "partial" in cancelled.stdout
    devices = farm.cli("devices", "--json")
    [host] = json.loads(devices.stdout)
    assert host["sme2"] is False and host["platform"] == "linux" and host["runners"]


def test_bad_input_through_the_cli_names_the_problem(farm, tmp_path):
    junk = tmp_path / "notes.pte"
    junk.write_text("definitely not a flatbuffer")
    done = farm.cli("submit", str(junk), "--sme2", "off")
    assert done.returncode == 1
    assert "422" in done.stderr and "not an ExecuTorch program" in done.stderr
    done = farm.cli("submit", str(junk), "--threads", "0")
    assert done.returncode == 2 and "thread count 0" in done.stderr
    done = farm.cli("submit", str(junk), "--device", "platform=android")
    assert done.returncode == 1 and ("no device matches" in done.stderr or "not an ExecuTorch" in done.stderr)
    assert httpx.get(f"{farm.url}/health").json()["status"] == "ok"


def test_production_parts_postgres_and_redis(local_runner, example_pte, postgres_url, redis_url, tmp_path_factory, tmp_path):
    import redis

    redis.Redis.from_url(redis_url).flushdb()  # no stale tasks from an earlier session
    catalog, _ = local_runner
    data_dir = tmp_path_factory.mktemp("farm-pg")
    farm = start_farm(data_dir, catalog.manifest, {"SME2_DATABASE_URL": postgres_url, "SME2_BROKER_URL": redis_url})
    try:
        # 3: the SME2-on arm is unschedulable here
        check_report(farm.submit_json(str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "30", code=3),
                     farm, tmp_path)
        assert not (data_dir / "farm.db").exists()  # the rows went to PostgreSQL
        import sqlalchemy as sa

        with sa.create_engine(postgres_url).connect() as c:
            assert c.exec_driver_sql("SELECT count(*) FROM run_results").scalar() == 1
            assert c.exec_driver_sql("SELECT count(*) FROM operator_stats").scalar() > 0
    finally:
        code = stop_farm(farm.proc)
    assert code == 0
    port = int(farm.url.rsplit(":", 1)[1])
    with socket.socket() as s:  # the server is really gone after Ctrl-C
        assert s.connect_ex(("127.0.0.1", port)) != 0
