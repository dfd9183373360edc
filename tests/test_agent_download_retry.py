"""The agent's model download rides out a store outage as a delivery does: retried for the
delivery's time bound, honouring Retry-After, not for a fixed count of tries (issue 29: an S3
outage during a device's first model fetch must not fail the run)."""

import hashlib
import http.server
import threading
import time

import httpx
import pytest

MODEL = b"\x01pte" * 4096
SHA = hashlib.sha256(MODEL).hexdigest()


def _serve(outage_s: float):
    """A real HTTP server whose model route answers 503 + Retry-After (its store away) for
    `outage_s`, then the model; it counts the requests."""
    began = time.monotonic()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            if time.monotonic() - began < outage_s:
                self.send_response(503)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(MODEL)))
            self.end_headers()
            self.wfile.write(MODEL)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_a_model_download_outlasts_more_tries_than_its_count(tmp_path):
    """An outage of 2.5 s against a backoff cap of 0.2 s: 3 tries' worth of count would give up in
    well under a second; the time bound (10 s) carries the download through, sha256 checked."""
    from sme2farm.agent.api import AgentApi

    server, seen = _serve(2.5)
    try:
        api = AgentApi(f"http://127.0.0.1:{server.server_address[1]}", "t", retries=3, upload_retry_s=10,
                       backoff_cap_s=0.2)
        dest = tmp_path / "m.pte"
        api.download_model(SHA, dest)
        assert dest.read_bytes() == MODEL and not dest.with_suffix(".part").exists()
        assert len(seen) > 4   # more tries than the count of 3
    finally:
        server.shutdown()


def test_a_download_gives_up_at_its_bound_with_the_server_s_answer(tmp_path):
    from sme2farm.agent.api import AgentApi

    server, seen = _serve(60)
    try:
        api = AgentApi(f"http://127.0.0.1:{server.server_address[1]}", "t", retries=3, upload_retry_s=1.0,
                       backoff_cap_s=0.2)
        start = time.monotonic()
        with pytest.raises(httpx.HTTPStatusError, match="503"):
            api.download_model(SHA, tmp_path / "m.pte")
        assert time.monotonic() - start < 5 and len(seen) >= 2
        assert not (tmp_path / "m.pte").exists()
    finally:
        server.shutdown()
