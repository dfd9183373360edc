"""A new user's first look at the CLI (issue 30): a bare id says whether it took a run or an
experiment and is refused where it could be either; `devices` abbreviates a long model at a word;
a submit without --device names the devices it went to; a kit config written for mac or android
is refused where the farm has no such device unless --any-platform says otherwise. The real CLI
entry point in-process against the real server (uvicorn, SQLite)."""

from __future__ import annotations

import json
import re

import pytest

from _fixtures_farm import X86_RUNNERS, post_experiment, register, x86_host
from _fixtures_kit import template
from sme2farm.agent.check import EXAMPLE
from sme2farm.client import cli
from sme2farm.protocol import DeviceInfo, RunnerInfo, abbreviated

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)   # the API tests' farm

QEMU_MODEL = "QEMU 11.1.3 aarch64 -cpu max (emulated)"   # what agent/drivers/qemu.py reports
EMULATED = DeviceInfo(serial="qemu-arm64-lab", platform="linux", model=QEMU_MODEL, soc="emulated", cpu_cores=2,
                      abi="aarch64", sme2=True, sme2_evidence="HWCAP2 bit 37", runner_platform="linux-arm64",
                      tags=["emulated", "arm64"], emulator="qemu-aarch64 11.1.3 -cpu max")
ARM64_RUNNERS = [RunnerInfo(id=f"a-{arm}", platform="linux-arm64", sme2=arm) for arm in ("on", "off")]


def _cli(api, capsys, *argv):
    code = cli.main(["--server", api.url, "--token", api.token, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _host_and_emulator(api):
    register(api, devices=[x86_host("host-test"), EMULATED], runners=X86_RUNNERS + ARM64_RUNNERS)


def _experiments(api) -> int:
    r = api.client.get("/experiments", headers=api.auth())
    return r.json()["total"]


# ---- run or experiment -------------------------------------------------------------------------

@SQLITE
def test_a_bare_id_says_which_it_took_and_is_refused_where_it_is_both(api, capsys, tmp_path):
    register(api)
    for _ in range(2):   # experiment 1: runs 1, 2; experiment 2: runs 3, 4
        assert post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off", "threads": [1, 2]}).status_code == 201
    code, out, err = _cli(api, capsys, "artifacts", "1")
    assert code == 2 and out == "", err
    assert "1 is both run 1 and experiment 1: give R1 for the run or E1 for the experiment" in err
    code, out, err = _cli(api, capsys, "artifacts", "3")
    assert code == 0 and out.startswith("run 3: "), out + err
    assert err.strip() == "sme2-client: 3 taken as run 3 (no experiment 3 is visible; R3 or E3 says which)"
    # the explicit forms say nothing more and need no guess
    code, _, err = _cli(api, capsys, "artifacts", "3", "trace.etdump", "-o", str(tmp_path))   # a queued run has none
    assert code == 1 and "run 3 has no trace.etdump (list them with: sme2-client artifacts R3)" in err, err
    code, out, err = _cli(api, capsys, "artifacts", "E2")
    assert code == 0 and [line.split(":")[0] for line in out.splitlines()] == ["run 3", "run 4"] and err == ""
    code, out, err = _cli(api, capsys, "artifacts", "r1")
    assert code == 0 and out.startswith("run 1: ") and err == ""
    code, _, err = _cli(api, capsys, "artifacts", "9")
    assert code == 1 and "there is no run 9 and no experiment 9" in err
    code, _, err = _cli(api, capsys, "artifacts", "X1")
    assert code == 2 and "give R34 for a run or E12 for an experiment" in err
    # compare reads the same way: a bare 1 was experiment 1 there, run 1 in artifacts
    code, _, err = _cli(api, capsys, "compare", "1", "E2")
    assert code == 2 and "give R1 for the run or E1 for the experiment" in err
    code, _, err = _cli(api, capsys, "compare", "3", "R4")
    assert "3 taken as run 3" in err and code != 2, err
    code, _, err = _cli(api, capsys, "compare", "E1", "E2")
    assert "taken as" not in err and code != 2, err


# ---- devices -----------------------------------------------------------------------------------

@SQLITE
def test_devices_abbreviates_a_long_model_at_a_word_never_inside_a_parenthesis(api, capsys):
    _host_and_emulator(api)
    code, out, _ = _cli(api, capsys, "devices")
    assert code == 0, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("qemu-arm64-lab")]
    assert "QEMU 11.1.3 aarch64 -cpu max…" in line and "max (" not in line.split("cores")[0], line
    code, out, _ = _cli(api, capsys, "devices", "--json")
    assert QEMU_MODEL in [d["model"] for d in json.loads(out)]   # the whole name is one flag away


@pytest.mark.parametrize("text,width", [(QEMU_MODEL, 30), (QEMU_MODEL, 12), ("Pixel 9 Pro (Tensor G4) [lab 2]", 25),
                                        ("Apple M4 Max (14-core CPU, 32-core GPU)", 20), ("Board A - rev 2 (lab)", 12),
                                        ("x" * 40, 10)])
def test_an_abbreviated_model_keeps_whole_words_and_closed_parentheses(text, width):
    got = abbreviated(text, width)
    assert len(got) <= width and got.endswith("…"), got
    kept = got[:-1]
    assert text.startswith(kept) and kept.count("(") == kept.count(")") and kept.count("[") == kept.count("]"), got
    assert " " not in text or text[len(kept)] == " ", got   # cut after a word
    assert abbreviated(text, len(text)) == text


# ---- submit without --device -------------------------------------------------------------------

@SQLITE
def test_a_submit_without_device_names_the_devices_it_went_to(api, capsys, tmp_path):
    _host_and_emulator(api)
    model = tmp_path / "m.pte"
    model.write_bytes(EXAMPLE.read_bytes())
    code, out, err = _cli(api, capsys, "submit", str(model), "--sme2", "off")
    assert code == 0, err
    [line] = [ln for ln in err.splitlines() if "--device" in ln]
    assert line == ("sme2-client: no --device given, so on every device that can take it: host-test, "
                    "qemu-arm64-lab (emulated) (--device SERIAL or --device platform=... chooses)"), err
    code, out, err = _cli(api, capsys, "submit", str(model), "--sme2", "off", "--device", "host-test", "--json")
    assert code == 0 and "no --device given" not in err, err
    assert {r["device"]["serial"] for r in json.loads(out)["runs"]} == {"host-test"}


# ---- kit configs written for a platform ---------------------------------------------------------

def _kit(tmp_path, cfg, name="my_experiment.json"):
    (tmp_path / "toy_cnn_xnnpack_fp32.pte").write_bytes(EXAMPLE.read_bytes())
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


@SQLITE
def test_a_mac_kit_config_is_refused_without_a_mac_unless_any_platform(api, capsys, tmp_path):
    _host_and_emulator(api)
    config = _kit(tmp_path, template())   # the kit's mac template: mac_sme2_on / mac_sme2_off
    code, _, err = _cli(api, capsys, "submit", "--kit-config", config)
    assert code == 1, err
    assert "server said 422: spec.device: no device matches selector {'platform': 'macos'}" in err, err
    assert (f"kit config {config} is written for macOS (experiments[0].name 'mac_sme2_on') and this farm has no "
            f"macOS device that can take it; run it on a farm with one, or give --any-platform") in err
    assert _experiments(api) == 0   # nothing stored
    # run anywhere, as asked: the host and the emulator, said in the devices line
    code, out, err = _cli(api, capsys, "submit", "--kit-config", config, "--any-platform", "--json")
    assert code == 0, err
    assert {r["device"]["serial"] for r in json.loads(out)["runs"]} == {"host-test", "qemu-arm64-lab"}
    assert "no --device given, so on every device that can take it: host-test, qemu-arm64-lab (emulated)" in err
    # a Mac registered: the config goes there only
    mac = DeviceInfo(serial="mac-mini", platform="macos", model="Mac mini (M4)", cpu_cores=10, abi="arm64", sme2=True,
                     runner_platform="macos-arm64")
    register(api, devices=[mac], runners=[RunnerInfo(id="m", platform="macos-arm64", sme2="on")], name="agent-mac")
    code, out, err = _cli(api, capsys, "submit", "--kit-config", config, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["spec"]["device"]["platform"] == "macos" and {r["device"]["serial"] for r in rep["runs"]} == {"mac-mini"}
    # --device is the user's own choice: it wins over the config's platform
    code, out, err = _cli(api, capsys, "submit", "--kit-config", config, "--device", "host-test", "--json")
    assert code == 0 and {r["device"]["serial"] for r in json.loads(out)["runs"]} == {"host-test"}, err


@SQLITE
def test_a_kit_config_for_two_platforms_or_any_platform_without_a_config_is_exit_2(api, capsys, tmp_path):
    _host_and_emulator(api)
    cfg = template()
    cfg["output_root"] = "out_toy_cnn/runs/android"
    code, _, err = _cli(api, capsys, "submit", "--kit-config", _kit(tmp_path, cfg))
    assert code == 2 and "written for macOS (experiments[0].name 'mac_sme2_on') and Android (output_root" in err, err
    code, _, err = _cli(api, capsys, "submit", str(EXAMPLE), "--any-platform")
    assert code == 2 and "--any-platform is for --kit-config" in err
    # a config named for no platform ("machine" is not mac) goes wherever it can, as before
    cfg = template(output_root="out/machine")
    cfg["experiments"] = [{"name": "linux_sme2_off", "runs": 3, "warmup": 0, "threads": [1]}]
    code, _, err = _cli(api, capsys, "submit", "--kit-config", _kit(tmp_path, cfg, "plain.json"))
    assert code == 0 and "no --device given, so on every device that can take it: host-test" in err, err
    assert _experiments(api) == 1


# ---- list ----------------------------------------------------------------------------------------

@SQLITE
def test_list_shows_the_name_and_the_models_hash_only_where_there_is_none(api, capsys, tmp_path):
    register(api)
    model = tmp_path / "my_first_model.pte"
    model.write_bytes(EXAMPLE.read_bytes())
    assert _cli(api, capsys, "submit", str(model), "--sme2", "off")[0] == 0   # named after its file
    unnamed = post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off"}, filename="")   # no name, no file name
    assert unnamed.status_code == 201 and unnamed.json()["name"] is None
    code, out, _ = _cli(api, capsys, "list")
    assert code == 0, out
    header, newest, oldest = out.splitlines()[:3]
    sha = unnamed.json()["model_sha256"]
    assert header.split() == ["id", "status", "runs", "created", "owner", "name"], header
    assert oldest.endswith(" my_first_model") and sha[:12] not in oldest, oldest
    assert newest.endswith(f" model {sha[:12]}"), newest


@SQLITE
def test_commands_taking_an_experiment_read_e12_as_artifacts_does_and_refuse_a_run_id(api, capsys):
    register(api)
    exp = post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off"}).json()
    code, out, err = _cli(api, capsys, "status", f"E{exp['id']}", "--json")
    assert code == 0 and json.loads(out)["id"] == exp["id"], err
    with pytest.raises(SystemExit) as refused:
        _cli(api, capsys, "status", f"R{exp['runs'][0]['id']}")
    assert refused.value.code == 2 and "is a run id: this command takes an experiment (12 or E12)" in capsys.readouterr().err
    code, out, err = _cli(api, capsys, "cancel", f"e{exp['id']}")
    assert code == 0 and f"experiment {exp['id']}: " in out, err
    with pytest.raises(SystemExit) as refused:
        _cli(api, capsys, "report", f"R{exp['runs'][0]['id']}")
    assert refused.value.code == 2 and "is a run id" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        _cli(api, capsys, "scaling", "1", "--with", "E2,R3")
    assert refused.value.code == 2 and "'R3' is a run id" in capsys.readouterr().err


# ---- wording ---------------------------------------------------------------------------------------

def test_an_incomplete_comparison_refers_to_the_unschedulable_reason_once():
    """The comparison's reason as the server writes it (services/comparisons.py's _runs_text of the
    runs) names the run's reason, said once in the header: the comparison refers to it with the
    word unschedulable said once, not "unschedulable (unschedulable (the reason above))"."""
    from sme2farm.client.render import experiment_text
    from sme2farm.protocol import ExperimentReport
    from sme2farm.server.services.comparisons import _runs_text
    from sme2farm.server.store.models import Run

    why = "no device here has SME2: the SME2-on arm will be unschedulable"
    off = Run(id=5, status="succeeded", reason="")
    on = Run(id=6, status="unschedulable", reason=why)
    reason = f"SME2 on: {_runs_text([on])}"
    runs = [{"id": r.id, "experiment_id": 3, "sme2": arm, "threads": 1, "mode": "timing", "status": r.status,
             "reason": r.reason} for r, arm in ((off, "off"), (on, "on"))]
    exp = {"id": 3, "status": "unschedulable", "model_sha256": "c" * 64, "model_size": 1, "created_at": "2026-11-25T10:00:00",
           "spec": {"sme2": "both", "threads": [1]}, "runs": runs,
           "comparisons": [{"kind": "sme2", "variant": "A", "device": "host", "threads": 1, "mode": "timing",
                            "status": "incomplete", "reason": reason}]}
    text = experiment_text(ExperimentReport.model_validate(exp))
    assert f"  unschedulable run 6, reason: {why}" in text, text
    assert text.count(why) == 1, text
    [line] = [ln for ln in text.splitlines() if "no comparison" in ln]
    assert line.endswith("no comparison — SME2 on: run 6 unschedulable (the reason above)"), line


@SQLITE
def test_an_upload_without_a_name_is_called_after_its_model_file(api, capsys):
    """The API, as curl sends it: no spec name, the model part's file name (a path is never kept)."""
    register(api)
    toy = post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off"}, filename="toy.pte")
    assert toy.status_code == 201 and toy.json()["name"] == "toy"
    hostile = post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off"}, filename="../../etc/p\u00e4ss\nwd.pte")
    name = hostile.json()["name"]  # the base name in plain characters (httpx sends the newline as %0A)
    assert hostile.status_code == 201 and re.fullmatch(r"p[A-Za-z0-9_]*wd", name) and len(name) <= 64, name
    named = post_experiment(api, EXAMPLE.read_bytes(), {"sme2": "off", "name": "mine"}, filename="toy.pte")
    assert named.json()["name"] == "mine"
    code, out, _ = _cli(api, capsys, "list")
    assert code == 0 and [ln.split()[-1] for ln in out.splitlines()[1:4]] == ["mine", name, "toy"], out
