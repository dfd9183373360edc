"""The CLI's error output (a new-user tester's findings): the server's validation lists, its 409
bodies and the client's own spec validation come out as one plain sentence per problem, never
raw JSON or pydantic text with its documentation URL; `compare` exits 1 when no pair has a
verdict. Real server (uvicorn, SQLite), the real CLI entry point in-process."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from _fixtures_services import lost_clock
from sme2farm.client import cli

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

SHA = "a" * 64


def _rows(api, *, sme2: bool = False):
    """One registered device (no SME2) and one stored model, as registration and an upload leave them."""
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Agent, Device, Model

    with session_scope(api.settings.sqlalchemy_url) as s:
        agent = Agent(name="lab", hostname="h",
                      runners=[{"id": "r", "platform": "linux-x86_64", "sme2": "off", "flavour": "timing"}])
        s.add(agent)
        s.flush()
        s.add(Device(agent_id=agent.id, serial="board0", platform="linux", sme2=sme2,
                     info={"model": "Test Board", "runner_platform": "linux-x86_64"}))
        s.add(Model(sha256=SHA, size=1))


def _run(api, capsys, *argv, token=None):
    code = cli.main(["--server", api.url, "--token", token or api.token, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _clean(err: str) -> None:
    assert "[{" not in err and '{"' not in err and "pydantic" not in err and "http" not in err.replace(
        "http(s)", ""), err


def test_validation_errors_are_one_sentence_per_problem(api, capsys):
    base = ["suite", "create", "s1", "--model", SHA, "--sme2", "off"]
    cases = [
        (["suite", "create", "a b", "--model", SHA], "server said 422: name: suite name 'a b' must be 1-64 letters"),
        (base + ["--model", SHA], "server said 422: models: a model is listed twice"),
        (base + ["--min-effect", "3"], "server said 422: thresholds.min_effect: must be <= 0.5"),
        (base + ["--threads", "0"], "server said 422: threads: "),
        (base + ["--sessions", "0"], "server said 422: sessions: must be >= 1"),
        (base + ["--alpha", "2"], "server said 422: thresholds.alpha: must be < 1"),
        (base + ["--schedule", "0 0 3 * * *"], "has 6 field(s); a schedule is exactly 5 cron fields"),
        (["regressions", "--ack", "0"], "server said 422: change_id: must be >= 1"),
    ]
    for argv, words in cases:
        code, _, err = _run(api, capsys, *argv)
        assert code == 1 and words in err, (argv, err)
        _clean(err)
    # two problems at once: two lines, each naming its field
    code, _, err = _run(api, capsys, *base, "--sessions", "0", "--alpha", "2")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2, err
    assert {ln.split(": ", 2)[2].split(":")[0] for ln in lines} == {"sessions", "thresholds.alpha"}


def test_conflicts_refusals_and_warnings_read_as_sentences(api, capsys, tmp_path):
    _rows(api)
    code, out, _ = _run(api, capsys, "suite", "create", "dup", "--model", SHA, "--sme2", "off")
    assert code == 0 and "suite dup created" in out
    for name in ("dup", "DUP"):
        code, _, err = _run(api, capsys, "suite", "create", name, "--model", SHA, "--sme2", "off")
        assert code == 1 and f"server said 409: a suite named '{name}' exists already" in err, err
        _clean(err)
    # SME2 on with no SME2 device: refused naming the device; both: accepted, with a warning
    code, _, err = _run(api, capsys, "suite", "create", "on", "--model", SHA, "--sme2", "on")
    assert code == 1 and "sme2: 'on' needs a device with SME2" in err and "board0" in err, err
    code, _, err = _run(api, capsys, "suite", "create", "both", "--model", SHA)
    assert code == 0 and "warning: SME2 on: no matching device has SME2; only the SME2 off series" in err, err
    # a webhook needs an admin token: the server POSTs to it from inside the farm
    # the suite's owner's own submit token (another user's may not change it at all: test_owners)
    r = api.client.post("/tokens", json={"name": "sub", "scope": "submit", "user": "admin"}, headers=api.auth())
    submit = r.json()["token"]
    code, _, err = _run(api, capsys, "suite", "create", "hooked", "--model", SHA, "--sme2", "off",
                        "--webhook", "http://10.0.0.1/hook", token=submit)
    assert code == 1 and "server said 403: setting or changing a suite's webhook needs an admin token" in err, err
    r = api.client.patch("/suites/dup", json={"webhook": "http://10.0.0.1/hook"}, headers=api.auth(submit))
    assert r.status_code == 403
    assert api.client.patch("/suites/dup", json={"paused": True}, headers=api.auth(submit)).json()["paused"] is True
    r = api.client.patch("/suites/dup", json={"webhook": "http://93.184.216.34/secret-path"}, headers=api.auth())
    assert r.status_code == 200 and r.json()["webhook"] == "http://93.184.216.34/…"  # the path (the secret) is not shown
    assert api.client.patch("/suites/dup", json={"nope": 1}, headers=api.auth()).status_code == 422
    # once an admin points it at a webhook, a submit token can neither silence nor delete it
    for method, body in (("patch", {"paused": False}), ("patch", {"thresholds": {"min_effect": 0.5}}), ("delete", None)):
        r = api.client.request(method.upper(), "/suites/dup", json=body, headers=api.auth(submit))
        assert r.status_code == 403 and "alerts a webhook an admin set up" in r.json()["detail"], r.text
    assert api.client.patch("/suites/dup", json={"webhook": None}, headers=api.auth()).json()["webhook"] is None
    # pause / resume / delete through the CLI
    code, out, _ = _run(api, capsys, "suite", "resume", "dup")
    assert code == 0 and "suite dup resumed; next run 20" in out
    code, out, _ = _run(api, capsys, "suite", "pause", "dup")
    assert code == 0 and "paused" in out
    code, out, _ = _run(api, capsys, "suite", "show", "dup")
    assert code == 0 and "schedule 0 3 * * * (paused)" in out
    code, out, _ = _run(api, capsys, "suite", "delete", "dup")
    assert code == 0 and "suite dup deleted with 0 run(s)" in out
    code, _, err = _run(api, capsys, "suite", "delete", "dup")
    assert code == 1 and "server said 404: suite 'dup' not found" in err
    # the client's own spec validation: the same sentences, no pydantic text or URL
    model = tmp_path / "m.pte"
    model.write_bytes(b"x")
    code, _, err = _run(api, capsys, "submit", str(model), "--min-effect=2")
    assert code == 2 and err.strip() == "sme2-client: invalid spec: min_effect: must be <= 0.5", err


def test_compare_exits_1_when_no_pair_has_a_verdict(api, capsys):
    from sme2farm.protocol import ExperimentSpec
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Model
    from sme2farm.server.services import experiments

    _rows(api)
    with session_scope(api.settings.sqlalchemy_url) as s:  # two experiments whose only arm could not run
        model = s.get(Model, SHA)
        ids = [experiments.create(s, spec=ExperimentSpec(sme2="on"), model=model, **lost_clock()).id for _ in range(2)]
    code, out, err = _run(api, capsys, "compare", f"E{ids[0]}", f"E{ids[1]}")
    assert code == 1 and out.count("no comparison") == 1 and "unschedulable" in out, (out, err)


def test_first_hour_errors_are_one_sentence_with_what_to_do(api, capsys, tmp_path):
    """Issue 15's list: --threads abc, a refused connection, a missing token, a .pte given to
    analyze, each one line saying what to do next, no Python internals."""
    model = tmp_path / "m.pte"
    model.write_bytes(b"x")
    code, _, err = _run(api, capsys, "submit", str(model), "--threads", "abc")
    assert code == 2 and err.strip() == ("sme2-client: --threads: 'abc' is not a thread count: give comma-separated "
                                         "whole numbers, e.g. 1 or 1,4"), err
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = cli.main(["--server", dead, "--token", "t", "devices"])
    err = capsys.readouterr().err
    assert code == 1 and err.strip() == (f"sme2-client: cannot reach the farm at {dead} (connection refused): is "
                                         f"`sme2-farm up` running there? (set SME2_SERVER or --server to its URL)"), err
    assert "Errno" not in err
    code = cli.main(["--server", api.url, "devices"])  # no token at all
    err = capsys.readouterr().err
    assert code == 1 and "server said 401" in err and "set SME2_TOKEN (or --token)" in err, err
    # a program given to analyze: named as such, not hex bytes
    pte = tmp_path / "prog.pte"
    pte.write_bytes(b"\x1c\x00\x00\x00ET12" + b"\x00" * 64)
    code = cli.main(["analyze", str(pte)])
    err = capsys.readouterr().err
    assert code == 2 and "is a .pte (a program, not a trace); analyze takes an .etdump" in err, err


def test_a_reader_that_leaves_is_not_an_error(api):
    """`sme2-client list | head`: the reader closes the pipe before the client writes; the
    client ends quietly (no "[Errno 32] Broken pipe", no traceback)."""
    proc = subprocess.Popen([sys.executable, "-m", "sme2farm.client.cli", "--server", api.url, "--token", api.token,
                             "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the client has imported and asked the server
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err

