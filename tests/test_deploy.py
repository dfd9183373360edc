"""Deployment files: no Docker engine runs here, so the compose file and Dockerfiles are checked
for what they must name, and the commands they run are checked against the real package."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_the_production_services_wired_in_order():
    c = compose()
    services = c["services"]
    farm = ("server", "worker", "worker-2", "beat")
    assert {"postgres", "redis", "seaweedfs", "migrate", *farm} <= set(services)
    for name in farm:
        env = services[name]["environment"]
        assert env["SME2_DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:5432/" in env["SME2_DATABASE_URL"]
        assert env["SME2_BROKER_URL"].startswith("redis://redis:6379")
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert env["SME2_ARTIFACT_STORE"].startswith("s3://") and env["SME2_S3_ENDPOINT_URL"] == "http://seaweedfs:8333"
        assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]  # boto3's chain, from the environment
    # no two farm containers share a volume: the artifacts are in the bucket, each could be a host of its own
    mounts = [v.split(":")[0] for n in farm for v in services[n]["volumes"]]
    assert len(mounts) == len(set(mounts)) == len(farm), mounts
    assert services["seaweedfs"]["image"].startswith("chrislusf/seaweedfs")
    assert "-s3" in services["seaweedfs"]["command"] and "seaweed-data:/data" in services["seaweedfs"]["volumes"]
    for name in ("server", "worker", "worker-2"):
        assert services[name]["depends_on"]["seaweedfs"]["condition"] == "service_healthy"
    assert services["worker-2"]["command"] == services["worker"]["command"]
    assert len({services[n]["environment"]["SME2_METRICS_SLOT"] for n in farm}) == len(farm)
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["server"]["ports"] == ["8000:8000"]
    assert set(c["volumes"]) >= {*mounts, "pg-data", "redis-data", "seaweed-data"} and "farm-data" not in c["volumes"]
    # the admin token has no default: compose refuses to start without one
    assert "${SME2_ADMIN_TOKEN:?" in services["server"]["environment"]["SME2_ADMIN_TOKEN"]


def test_compose_commands_name_real_entry_points():
    services = compose()["services"]
    assert services["server"]["command"][:2] == ["uvicorn", "sme2farm.server.main:app"]
    for name in ("worker", "beat"):
        cmd = services[name]["command"]
        assert cmd[:3] == ["celery", "-A", "sme2farm.worker.celery_app"]
    assert services["migrate"]["command"] == ["sme2-farm", "migrate"]
    for module in ("sme2farm.server.main", "sme2farm.worker.celery_app", "sme2farm.farm.cli"):
        assert importlib.util.find_spec(module) is not None, module
    # the celery app the worker/beat commands load really has the farm's tasks and schedule
    out = subprocess.run([sys.executable, "-c", "from sme2farm.worker.celery_app import app; app.loader.import_default_modules();"
                          "print(sorted(t for t in app.tasks if t.startswith('sme2farm.')));"
                          "print(sorted(app.conf.beat_schedule))"],
                         capture_output=True, text=True, env={"SME2_BROKER_URL": "redis://redis:6379/0", "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert "sme2farm.dispatch" in out.stdout and "sme2farm.ingest" in out.stdout and "sme2farm.reap" in out.stdout
    assert "reap-leases" in out.stdout


def test_dockerfiles_copy_every_package_folder():
    mapped = re.findall(r'"sme2farm[.\w]*" = "([\w/]+)"', (ROOT / "pyproject.toml").read_text())
    top = {m.split("/")[0] for m in mapped}
    for dockerfile in ("Dockerfile", "Dockerfile.agent"):
        text = (ROOT / dockerfile).read_text()
        assert text.startswith("#") and "FROM python:3.11" in text
        for folder in top:
            assert f"COPY {folder} {folder}" in text, (dockerfile, folder)
    assert 'pip install ".[server]"' in (ROOT / "Dockerfile").read_text()
    assert "USER farm" in (ROOT / "Dockerfile").read_text()
    agent = (ROOT / "Dockerfile.agent").read_text()
    assert "sme2farm.runners.build" in agent and 'ENTRYPOINT ["sme2-agent"]' in agent


def test_hadolint_style_basics():
    """What a linter would flag first: apt lists cleaned, no latest-tag base images."""
    for dockerfile in ("Dockerfile", "Dockerfile.agent"):
        text = (ROOT / dockerfile).read_text()
        if "apt-get install" in text:
            assert "--no-install-recommends" in text and "rm -rf /var/lib/apt/lists/*" in text
        assert ":latest" not in text.split("FROM", 1)[1].splitlines()[0]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored  # build context stays small and secret-free
