"""A new user's first hour: what stops a farm from starting is one plain line from
`sme2-farm up`/`demo` (a taken port, an unusable data dir), `make demo` takes PORT= and
DATA_DIR=, and experiments are named after their model file. Real processes throughout."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _farm(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", *argv], capture_output=True, text=True,
                          timeout=timeout)


def test_a_taken_port_is_one_line_from_up_and_demo(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for cmd in ("up", "demo"):
            done = _farm(cmd, "--port", str(port), "--data-dir", str(tmp_path / "data"), "--ready-timeout", "5")
            assert done.returncode == 1, done
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1, done.stderr
            assert f"port {port} on 127.0.0.1 is already in use" in lines[0]
            assert f"--port {port + 1}" in lines[0] and "PORT=" in lines[0]
            assert "Traceback" not in done.stdout + done.stderr
        # nothing was started: no child's log, no database
        assert not (tmp_path / "data" / "logs").exists()


def test_an_unusable_data_dir_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for data_dir in (blocker, blocker / "sub"):
        done = _farm("up", "--port", "1", "--data-dir", str(data_dir))  # the data dir is checked first
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"the data dir {data_dir} is not a directory" in lines[0] and "--data-dir" in lines[0]


def test_port_and_data_dir_checks_pass_a_free_port_and_a_new_dir(tmp_path):
    from sme2farm.farm.preflight import data_dir_problem, port_problem

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert port_problem("127.0.0.1", port) is None
    assert data_dir_problem(tmp_path / "new" / "dir") is None
    made = tmp_path / "new" / "dir"
    assert made.is_dir() and not list(made.iterdir())  # the probe is gone
    assert made.stat().st_mode & 0o077 == 0  # created private, as the farm keeps it


def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    from sme2farm.farm import preflight

    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    monkeypatch.delenv("CXX", raising=False)
    assert preflight.compiler() is None
    monkeypatch.setenv("CXX", sys.executable)  # any executable named by $CXX counts
    assert preflight.compiler() == sys.executable


def test_make_demo_passes_port_and_data_dir():
    done = subprocess.run(["make", "-n", "-C", str(REPO), "demo", "PORT=8123", "DATA_DIR=/tmp/farm2"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "sme2-farm demo --port 8123 --data-dir /tmp/farm2" in done.stdout
    done = subprocess.run(["make", "-n", "-C", str(REPO), "up"], capture_output=True, text=True, timeout=30)
    # unset DATA_DIR leaves the farm's own default (SME2_DATA_DIR, else .farm)
    assert "sme2-farm up --port 8000" in done.stdout and "--data-dir" not in done.stdout


NO_SME2 = "no device here has SME2: the SME2-on arm will be unschedulable"


@pytest.mark.e2e
def test_submit_names_the_experiment_after_its_file_and_warns_once_without_sme2(farm, example_pte, tmp_path):
    """On this x86 host (no SME2) the default `--sme2 both` says once, at submission, that the
    SME2-on arm cannot run; the report groups the runs' identical reason once; the exit code is 3
    (not 0, not 1); the experiment is named after the file."""
    model = tmp_path / "my_first_model.pte"
    model.write_bytes(example_pte("toy_cnn").read_bytes())
    done = farm.cli("submit", str(model), "--sme2", "both", "--threads", "1,2", "--iterations", "5", "--wait")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.count(NO_SME2) == 1, done.stderr
    report = done.stdout
    assert report.splitlines()[0].startswith("Experiment ") and " my_first_model: " in report.splitlines()[0]
    # two SME2-on runs (threads 1 and 2), one long reason: printed once, naming both runs
    unsched = [line for line in report.splitlines() if line.startswith("  unschedulable runs ")]
    assert len(unsched) == 1 and len(unsched[0].split(", reason: ")[0].split(",")) == 2, report
    reason = unsched[0].split(", reason: ", 1)[1]
    assert reason.startswith("SME2 on needs a device with SME2")
    assert report.count(reason) == 1, report
    assert f"note: {NO_SME2}" in report
    exp_id = report.split()[1]
    # status --wait: the same exit code; the listing shows the name
    again = farm.cli("status", exp_id, "--wait")
    assert again.returncode == 3 and again.stdout.count(reason) == 1, again.stdout + again.stderr
    listing = farm.cli("list")
    assert any(line.split()[0] == exp_id and line.endswith("my_first_model") for line in listing.stdout.splitlines()), listing.stdout
    # without --wait the warning is said too; --name still wins
    quick = farm.cli("submit", str(model), "--sme2", "both", "--iterations", "5", "--name", "mine")
    assert quick.returncode == 0 and quick.stderr.count(NO_SME2) == 1, quick.stderr
    qid = quick.stdout.split()[2]
    assert farm.client().experiment(int(qid)).name == "mine"
    farm.cli("cancel", qid)


@pytest.mark.e2e
def test_everything_that_could_run_succeeded_exits_0_and_a_cancelled_run_exits_1(farm, example_pte):
    model = example_pte("mlp")
    done = farm.cli("submit", str(model), "--sme2", "off", "--iterations", "5", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no device here has SME2" not in done.stderr and "unschedulable" not in done.stdout
    assert " mlp: succeeded" in done.stdout.splitlines()[0]
    # a cancelled experiment (20 runs on the one device, cancelled at once): status --wait exits 1
    queued = farm.cli("submit", str(model), "--sme2", "off", "--threads", "1,2", "--sessions", "10",
                      "--iterations", "2000")
    qid = queued.stdout.split()[2]
    farm.cli("cancel", qid)
    after = farm.cli("status", qid, "--wait", "--timeout", "120")
    assert after.returncode == 1 and "cancelled" in after.stdout, after.stdout + after.stderr


def test_exit_codes_are_documented_in_help():
    from sme2farm.client import cli

    text = cli.build_parser().format_help() + cli.build_parser()._subparsers._group_actions[0].choices["submit"].format_help()
    flat = " ".join(text.split())
    assert "0 when every run that could run succeeded" in flat and "3 when some runs were unschedulable" in flat
    assert "1 when a run failed" in flat


def test_analyze_compare_prints_no_none_verdict():
    from sme2farm.client.analyze_cmd import _said_verdicts

    comparison = {"categories": {"GEMM": {"verdict": None, "speedup": None}},
                  "operators": {"op": {"verdict": None}, "op2": {"verdict": "faster"}}}
    said = _said_verdicts(comparison)
    assert said["categories"]["GEMM"]["verdict"] == "no verdict" and said["operators"]["op"]["verdict"] == "no verdict"
    assert said["operators"]["op2"]["verdict"] == "faster" and comparison["operators"]["op"]["verdict"] is None


@pytest.mark.models
def test_examples_lists_and_exports_one_quietly(tmp_path):
    listed = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "examples"], capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and listed.stdout.split()[0] == "toy_cnn" and "mlp " in listed.stdout
    pytest.importorskip("executorch")
    out = tmp_path / "models" / "m.pte"
    done = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "examples", "mlp", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and len(done.stdout.strip().splitlines()) == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"wrote {out} (") and f"exporter messages in {out}.log" in done.stdout
    assert out.read_bytes()[4:6] == b"ET"  # a .pte flatbuffer
    assert (tmp_path / "models" / "m.pte.log").exists()
    # and its ETRecord beside it, the name submit looks for
    assert f"and its ETRecord {out}.etrecord" in done.stdout
    with zipfile.ZipFile(tmp_path / "models" / "m.pte.etrecord") as z:
        assert "debug_handle_map" in z.namelist()
    bad = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "examples", "nope"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "no bundled example 'nope': choose one of toy_cnn" in bad.stderr


def test_examples_without_the_exporter_says_what_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    from sme2farm.client import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else real(name, *a))
    assert cli.main(["examples", "mlp", str(tmp_path / "m.pte")]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "sme2-client: exporting needs torch and executorch: pip install 'sme2-farm[export]'"
    assert not (tmp_path / "m.pte").exists()


@pytest.mark.e2e
def test_artifacts_lists_and_downloads_a_runs_and_an_experiments(farm, example_pte, tmp_path):
    import json

    rep = farm.submit_json(str(example_pte("mlp")), "--sme2", "off", "--threads", "1,2", "--iterations", "5")
    exp_id, (r1, r2) = rep["id"], [r["id"] for r in rep["runs"]]
    listed = farm.cli("artifacts", f"R{r1}")
    assert listed.returncode == 0 and listed.stdout.startswith(f"run {r1}: ") and "report.json" in listed.stdout
    names = listed.stdout.split(": ", 1)[1].strip().split(", ")
    one = farm.cli("artifacts", f"R{r1}", "report.json", "-o", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    got = (tmp_path / "one" / "report.json").read_bytes()
    assert got == farm.client().artifact(r1, "report.json") and json.loads(got)
    every = farm.cli("artifacts", f"E{exp_id}", "-o", str(tmp_path / "all"))
    assert every.returncode == 0, every.stderr
    for run_id in (r1, r2):
        assert sorted(p.name for p in (tmp_path / "all" / f"run{run_id}").iterdir()) == sorted(names)
    # a name outside the fixed set is refused before anything is asked or written
    bad = farm.cli("artifacts", f"R{r1}", "../escape", "-o", str(tmp_path / "bad"))
    assert bad.returncode == 2 and not (tmp_path / "bad").exists() and not (tmp_path / "escape").exists()
    from sme2farm.protocol import ARTIFACT_NAMES

    absent = sorted(ARTIFACT_NAMES - set(names))[0]  # a timing run has no trace, for one
    missing = farm.cli("artifacts", f"R{r1}", absent, "-o", str(tmp_path / "m"))
    assert missing.returncode == 1 and f"run {r1} has no {absent}" in missing.stderr, missing.stderr


def test_a_y_axis_title_never_overlaps_a_tick_label():
    """Ticks like "0.00034" (7 characters) reached the rotated title at x=14; it now moves left of
    them, or above the axis where the margin has no room."""
    import numpy as np

    from sme2farm.analysis.charts import distribution_chart

    rng = np.random.default_rng(0)
    placements = set()
    for center in (5.0, 0.0123, 0.000345, 12345.6):
        svg = distribution_chart([("off", rng.normal(center, center * 0.01, 200)),
                                  ("on", rng.normal(center * 0.9, center * 0.01, 200))])
        ticks = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" font-size="11"[^>]*>([^<]+)<', svg)
        [(x, y, rotated)] = re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*?( transform="rotate\(-90[^"]*")?>latency', svg)
        tick_left = min(float(tx) - 6.05 * len(s) for tx, s in ticks)  # a digit at 11 px is ~0.55 em
        if rotated:
            assert float(x) + 3 <= tick_left and float(x) >= 10, (center, x, ticks)  # descenders ~3 px right
        else:
            assert float(y) < min(float(v) for v in re.findall(r'<text x="58" y="([\d.]+)"', svg)) - 8
        placements.add(bool(rotated))
    assert placements == {True, False}  # both placements were exercised


def test_hidden_wins_over_display_rules_in_the_dashboard_css():
    """"Change token" (a <button hidden>) showed when signed out: `button { display: inline-block }`
    beat the UA's [hidden] rule. The stylesheet's own [hidden] rule must come with !important."""
    css = (REPO / "server" / "static" / "style.css").read_text()
    assert re.search(r"\[hidden\]\s*\{\s*display:\s*none\s*!important;?\s*\}", css)
    html = (REPO / "server" / "static" / "index.html").read_text()
    assert re.search(r'<button id="change-token"[^>]*\bhidden\b', html)


@pytest.mark.e2e
@pytest.mark.browser
def test_dashboard_hides_change_token_signed_out_and_says_an_unschedulable_reason_once(chromium, browser, farm,
                                                                                        example_pte):
    """Headless Chromium on the real farm: signed out, "Change token" is not displayed; an
    experiment whose two SME2-on runs share one reason shows the no-SME2 warning and that reason
    once, under "Could not run", the run cards pointing to it."""
    from selenium.webdriver.common.by import By

    from _fixtures_browser import wait

    client = farm.client()
    from sme2farm.protocol import ExperimentSpec

    rep = client.submit(example_pte("mlp"), ExperimentSpec(sme2="both", threads=[1, 2], iterations=3, warmup=0,
                                                           name="grouped"))
    on = [r for r in rep.runs if r.sme2 == "on"]
    assert len(on) == 2 and all(r.status == "unschedulable" for r in on)
    d = browser
    d.get(farm.url + "/")
    wait(d, "#token-input")
    assert not d.find_element(By.ID, "change-token").is_displayed()
    wait(d, "#token-input").send_keys(farm.token)
    d.find_element(By.CSS_SELECTOR, "#main form button[type=submit]").click()
    wait(d, "#change-token")  # signed in: shown
    d.get(f"{farm.url}/#/experiments/{rep.id}")
    wait(d, ".card.warnings", text=NO_SME2)
    card = wait(d, ".card.unplaced .reason")
    assert card.get_attribute("data-runs") == ",".join(str(r.id) for r in on)
    reason = on[0].reason
    assert reason in card.text
    assert d.find_element(By.ID, "main").text.count(reason) == 1
    for r in on:
        assert "Could not run" in wait(d, f"#run-{r.id} .reason.grouped").text
    # Once the experiment ends its comparisons' reason points to that card without doubling the status.
    from _fixtures_farm import wait_for

    wait_for("the experiment's end", lambda: client.experiment(rep.id).status not in ("queued", "running"), 180)
    d.refresh()
    verdicts = wait(d, ".card.comparison", text="the reason under “Could not run” above", timeout=60).text
    assert "unschedulable (unschedulable" not in verdicts
    client.cancel(rep.id)
