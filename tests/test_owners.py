"""Owners and teams on the real API (uvicorn; SQLite and PostgreSQL): a token belongs to a user, who
may be in a team; an experiment, a run and a suite are their creator's; cancel, delete and
acknowledge need the owner, a teammate or an admin (403 naming the rule, nothing changed); the list
shows owners and filters by them (`?owner=`, `sme2-client list --mine`); reads can be confined to
the team; webhooks to loopback and private addresses are refused unless allowed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _fixtures_farm import QUICK_SPEC, mint, post_experiment, register, x86_host
from sme2farm.server.store.db import session_scope

HOST = x86_host("host-owners")
RULE = "only its owner, a member of its owner's team, or an admin token may"


def submit_as(api, token: str, pte: bytes) -> dict:
    r = post_experiment(api, pte, QUICK_SPEC, token=token)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def people(api):
    register(api, (HOST,), name="owners-lab")
    return {"alice": mint(api, "submit", "alice-laptop", user="alice", team="red"),
            "carol": mint(api, "submit", "carol-ci", user="carol", team="red"),
            "bob": mint(api, "submit", "bob")}


def test_only_the_owner_a_teammate_or_an_admin_cancels(api, pte, people):
    exp = submit_as(api, people["alice"], pte)
    run_id = exp["runs"][0]["id"]
    for path in (f"/experiments/{exp['id']}/cancel", f"/runs/{run_id}/cancel"):
        r = api.client.post(path, headers=api.auth(people["bob"]))
        assert r.status_code == 403, r.text
        assert RULE in r.json()["detail"] and "'bob'" in r.json()["detail"] and "alice" not in r.json()["detail"]
    assert api.client.get(f"/runs/{run_id}", headers=api.auth(people["bob"])).json()["status"] == "queued"
    r = api.client.post(f"/experiments/{exp['id']}/cancel", headers=api.auth(people["carol"]))   # same team
    assert r.status_code == 200 and {x["status"] for x in r.json()["runs"]} == {"cancelled"}
    other = submit_as(api, people["alice"], pte)
    r = api.client.post(f"/experiments/{other['id']}/cancel", headers=api.auth())   # an admin
    assert r.status_code == 200 and {x["status"] for x in r.json()["runs"]} == {"cancelled"}


def test_the_list_names_owners_and_filters_by_them(api, pte, people, tmp_path):
    mine = submit_as(api, people["alice"], pte)["id"]
    theirs = submit_as(api, people["bob"], pte)["id"]
    items = api.client.get("/experiments", headers=api.auth(people["bob"])).json()["items"]
    assert {(e["id"], e["owner"]) for e in items} == {(mine, "alice"), (theirs, "bob")}
    only = api.client.get("/experiments", params={"owner": "me"}, headers=api.auth(people["alice"])).json()
    assert [e["id"] for e in only["items"]] == [mine] and only["total"] == 1
    only = api.client.get("/experiments", params={"owner": "bob"}, headers=api.auth(people["alice"])).json()
    assert [e["id"] for e in only["items"]] == [theirs]
    assert api.client.get("/experiments", params={"owner": "nobody"}, headers=api.auth()).json()["total"] == 0
    env = {**os.environ, "SME2_SERVER": api.url, "SME2_TOKEN": people["alice"]}
    out = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "list", "--mine"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [ln.split() for ln in out.stdout.splitlines()[1:-1]]
    assert [(int(r[0]), r[5]) for r in rows] == [(mine, "alice")], out.stdout   # id status runs date time owner


def test_reads_confined_to_the_team(api, pte, people):
    red = submit_as(api, people["alice"], pte)
    api.settings.reads_team_only = True
    try:
        assert api.client.get("/experiments", headers=api.auth(people["bob"])).json()["total"] == 0
        assert api.client.get(f"/experiments/{red['id']}", headers=api.auth(people["bob"])).status_code == 404
        assert api.client.get(f"/runs/{red['runs'][0]['id']}", headers=api.auth(people["bob"])).status_code == 404
        assert api.client.get(f"/experiments/{red['id']}", headers=api.auth(people["carol"])).status_code == 200
        assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 1   # an admin reads all
    finally:
        api.settings.reads_team_only = False
    assert api.client.get(f"/experiments/{red['id']}", headers=api.auth(people["bob"])).status_code == 200


def test_a_bare_id_in_the_cli_is_what_the_token_may_read(api, pte, people, capsys):
    """`sme2-client artifacts N`: N is ambiguous only where both run N and experiment N are readable;
    with reads confined to the team, another team's run or experiment does not count."""
    from sme2farm.client import cli

    bobs = post_experiment(api, pte, {**QUICK_SPEC, "threads": [1, 2]}, token=people["bob"]).json()
    alices = submit_as(api, people["alice"], pte)
    n = alices["id"]
    assert n in [r["id"] for r in bobs["runs"]]   # bob's run n, alice's experiment n

    def artifacts(who: str) -> tuple[int, str, str]:
        code = cli.main(["--server", api.url, "--token", people[who], "artifacts", str(n)])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, _, err = artifacts("alice")
    assert code == 2 and f"give R{n} for the run or E{n} for the experiment" in err, err
    api.settings.reads_team_only = True
    try:
        code, out, err = artifacts("alice")
        assert code == 0 and f"{n} taken as experiment {n}" in err, err
        assert out.startswith(f"run {alices['runs'][0]['id']}: "), out
        code, out, err = artifacts("bob")
        assert code == 0 and f"{n} taken as run {n}" in err and out.startswith(f"run {n}: "), out + err
    finally:
        api.settings.reads_team_only = False


def test_every_read_of_an_experiment_run_suite_or_comparison_is_confined_to_the_team(api, pte, people):
    """Walks the app's OpenAPI: every GET taking an experiment, run, suite or comparison id answers
    another team's read token 404 (not found, as for an id that does not exist) and a teammate
    otherwise (200 where the thing has the data). A route added without owners.require_* fails here."""
    from _fixtures_suites import _farm_rows, _inject, _suite
    from sme2farm.server.store.models import Experiment, User

    red, red2 = submit_as(api, people["alice"], pte), submit_as(api, people["alice"], pte)
    blue = submit_as(api, people["bob"], pte)
    with session_scope(api.settings.sqlalchemy_url) as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s, name="red-nightly")
        suite.owner_id = s.query(User).filter(User.name == "alice").one().id
        _inject(s, suite, dev, [10.0] * 3)
        assert s.get(Experiment, red["id"]).owner_id == suite.owner_id
    outsider = mint(api, "read", "bob-reader", user="bob")
    teammate = mint(api, "read", "carol-reader", user="carol", team="red")
    path_values = {"experiment_id": red["id"], "run_id": red["runs"][0]["id"]}
    names = {"/experiments/{experiment_id}/files/{name}": "model.pte", "/runs/{run_id}/artifacts/{name}": "report.json",
             "/experiments/{experiment_id}/charts/{name}.svg": "distribution", "/suites/{name}": "red-nightly"}
    query = {"/comparisons": {"baseline": f"E{red['id']}", "candidate": f"E{red2['id']}"},
             "/suites/{name}/charts/series.svg": {"model_sha256": "a" * 64, "device_model": "Test Board",
                                                  "sme2": "off", "threads": 1},
             "/regressions": {"suite": "red-nightly"}}
    query["/comparisons/chart.svg"] = query["/comparisons"]
    paths = api.client.get("/openapi.json").json()["paths"]
    walked = []
    api.settings.reads_team_only = True
    try:
        for path, ops in sorted(paths.items()):
            if "get" not in ops:
                continue
            params = [p["name"] for p in ops["get"].get("parameters", []) if p["in"] == "path"]
            takes = {"experiment_id", "run_id"} & set(params) or path.startswith(("/suites/", "/comparisons"))
            if not takes and path not in query:
                continue
            url = path
            for p in params:
                value = path_values.get(p, names.get(path) or names.get("/suites/{name}") if p == "name" else None)
                assert value is not None, f"{path}: no value for {{{p}}}: add it to this test"
                url = url.replace(f"{{{p}}}", str(value))
            got = {who: api.client.get(url, params=query.get(path), headers=api.auth(tok))
                   for who, tok in (("outsider", outsider), ("teammate", teammate), ("admin", None))}
            assert got["outsider"].status_code == 404 and "not found" in got["outsider"].json()["detail"], (path, got["outsider"].text)
            for who in ("teammate", "admin"):
                assert (got[who].status_code, got[who].content) != (404, got["outsider"].content), (path, who, got[who].text)
            walked.append((path, got["teammate"].status_code))
        seen = dict(walked)
        assert {"/experiments/{experiment_id}", "/experiments/{experiment_id}/files/{name}", "/suites/{name}",
                "/suites/{name}/series", "/suites/{name}/charts/series.svg", "/regressions",
                "/experiments/{experiment_id}/scaling", "/comparisons"} <= set(seen), seen
        assert all(seen[p] == 200 for p in ("/experiments/{experiment_id}", "/experiments/{experiment_id}/files/{name}",
                                            "/suites/{name}", "/suites/{name}/series",
                                            "/suites/{name}/charts/series.svg", "/regressions")), seen
        assert api.client.get("/suites", headers=api.auth(outsider)).json() == []
        assert [x["name"] for x in api.client.get("/suites", headers=api.auth(teammate)).json()] == ["red-nightly"]
        r = api.client.get(f"/experiments/{blue['id']}/scaling", params={"with": str(red["id"])},
                           headers=api.auth(outsider))   # joining another team's experiment to one's own
        assert r.status_code == 404 and r.json()["detail"] == f"with: experiment {red['id']} not found", r.text
        r = api.client.get("/comparisons", params={"baseline": f"E{blue['id']}", "candidate": f"R{red['runs'][0]['id']}"},
                           headers=api.auth(outsider))
        assert r.status_code == 404 and r.json()["detail"] == f"candidate: run {red['runs'][0]['id']} not found", r.text
    finally:
        api.settings.reads_team_only = False
    assert api.client.get("/suites/red-nightly/series", headers=api.auth(outsider)).status_code == 200


def test_a_submit_token_cannot_acknowledge_an_admins_suites_regression(api, people):
    """The suite is the admin's; its confirmed regression is acknowledged by the admin, not by
    another user's submit token (which would silence its alert)."""
    from datetime import datetime, timezone

    from _fixtures_suites import _farm_rows, _inject, _suite
    from sme2farm.server.services import suites
    from sme2farm.server.store.models import SuiteChange, User

    url = api.settings.sqlalchemy_url
    with session_scope(url) as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s, name="admins-nightly")
        suite.owner_id = s.query(User).filter(User.name == "admin").one().id
        _inject(s, suite, dev, [10.0] * 10 + [10.8])
        _inject(s, suite, dev, [10.8], start=datetime(2026, 11, 12, 3, tzinfo=timezone.utc), seed=1)
        suites.detect_series(s, suite=suite, key=("a" * 64, "Test Board", "off", 1))
        (change,) = suites.regressions(s)
    r = api.client.post(f"/regressions/{change.id}/acknowledge", headers=api.auth(people["bob"]))
    assert r.status_code == 403 and RULE in r.json()["detail"], r.text
    with session_scope(url) as s:
        assert s.get(SuiteChange, change.id).status == "confirmed"
    r = api.client.post(f"/regressions/{change.id}/acknowledge", headers=api.auth())
    assert r.status_code == 200 and r.json()["status"] == "acknowledged", r.text


def test_a_register_token_belongs_to_no_user_and_the_cli_makes_users_and_teams(api):
    r = api.client.post("/tokens", json={"name": "reg", "scope": "register", "user": "x"}, headers=api.auth())
    assert r.status_code == 422 and "belongs to no user" in r.json()["detail"]
    env = {**os.environ, "SME2_DATA_DIR": str(api.settings.data_dir), "SME2_DATABASE_URL": api.settings.sqlalchemy_url}
    made = subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", "token", "create", "--name", "dan-ci",
                           "--user", "dan", "--team", "blue"], env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    listed = {t["name"]: t for t in api.client.get("/tokens", headers=api.auth()).json()}
    assert (listed["dan-ci"]["user"], listed["dan-ci"]["team"]) == ("dan", "blue")
    assert listed["admin"]["user"] == "admin"


def test_webhooks_to_loopback_and_private_addresses_are_refused_unless_allowed(api, people, pte):
    from _fixtures_suites import WebhookReceiver
    from sme2farm.server.services import alerts

    model = submit_as(api, api.token, pte)["model_sha256"]
    suite = {"name": "hooked-owners", "models": [{"sha256": model, "name": "toy"}], "sme2": "off"}
    for url in ("http://127.0.0.1:9/hook", "http://localhost/x", "http://169.254.169.254/latest", "http://10.1.2.3/h",
                "http://[::1]:8080/h"):
        r = api.client.post("/suites", json={**suite, "webhook": url}, headers=api.auth())
        assert r.status_code == 422, (url, r.text)
        assert "non-public address" in r.json()["detail"] and "SME2_WEBHOOK_PRIVATE_OK" in r.json()["detail"]
        assert "127.0.0.1" not in r.json()["detail"] and "169.254" not in r.json()["detail"]
    assert api.client.get("/suites", headers=api.auth()).json() == []   # nothing stored
    hook = WebhookReceiver()
    try:
        # At delivery the host is resolved and checked again: a name pointing at loopback is not POSTed to.
        named = alerts.Delivery(url=hook.url.replace("127.0.0.1", "localhost"), payload={"event": "sme2farm.test"},
                                event="sme2farm.test")
        assert alerts.post(named, timeout_s=5.0) == "refused: the host resolves to a non-public address"
        assert hook.received == []
        allowed = alerts.Delivery(url=hook.url, payload={"event": "sme2farm.test"}, event="sme2farm.test")
        assert alerts.post(allowed, timeout_s=5.0, allow_private=True) is None   # POSTed to the address checked
        assert hook.received == [{"event": "sme2farm.test"}]
        api.settings.webhook_private_ok = True   # the operator allows it: stored; non-admins see no host or port
        r = api.client.post("/suites", json={**suite, "webhook": hook.url}, headers=api.auth())
        assert r.status_code == 201 and "127.0.0.1" in r.json()["webhook"], r.text
        seen = api.client.get("/suites/hooked-owners", headers=api.auth(people["bob"])).json()["webhook"]
        assert seen == "http://…", seen
    finally:
        api.settings.webhook_private_ok = False
        hook.close()


@pytest.mark.browser
def test_the_dashboard_shows_owners_and_filters_by_them(api, pte, people, browser):
    from _fixtures_farm import wait_for

    mine = submit_as(api, people["alice"], pte)["id"]
    theirs = submit_as(api, people["bob"], pte)["id"]
    d = browser
    d.get(api.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", people["alice"])
    d.get(f"{api.url}/#/experiments")

    def shown():  # read in one script: the list re-renders while its runs are queued (auto-refresh)
        return d.execute_script("""
            const f = document.querySelector('#owner-filter');
            return [f ? f.textContent : null, [...document.querySelectorAll('#experiments tbody tr')]
                .map((tr) => [tr.dataset.id, tr.querySelector('td.owner').textContent])];""")

    wait_for("both owners listed", lambda: shown()[1] == [[str(theirs), "bob"], [str(mine), "alice"]], 30)
    d.execute_script("document.querySelector('#owner-filter').click()")   # "Mine": this token's user's only
    wait_for("alice's only", lambda: shown() == ["mine only · show all", [[str(mine), "alice"]]], 30)
    d.execute_script("location.hash = '#/experiments?owner=bob'")
    wait_for("bob's only", lambda: shown() == ["bob only · show all", [[str(theirs), "bob"]]], 30)
