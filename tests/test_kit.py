"""Kit users: the SME2 learning-path kit's JSON config runs on the farm as one
experiment, bad configs are refused before anything is uploaded, and `--kit-json` writes the
kit's analysis_summary.json from the farm's analysis.

The configs below are the kit's own template (model_profiling/configs/templates/mac_template.json)
with the model path pointed at a real bundled model exported beside the config."""

from __future__ import annotations

import json
import shutil

import pytest

from sme2farm.analysis import analyze
from sme2farm.client import kit

from _fixtures_kit import template

# The kit's analysis_summary.json keys (its analyze_results.py, known-good fixture, and the
# learning path's operator_details): written out here, not imported, so a change to the module
# cannot silently change what the test expects.
KIT_KEYS = {"run_dir", "model", "etrecord", "etdump_count", "category_totals_ms", "kernel_hints",
            "per_etdump", "csv_files", "operator_details"}
OPERATOR_KEYS = {"name", "category", "avg_ms", "count", "total_ms"}
CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")



def kit_dir(tmp_path, pte):
    """The kit's layout: the exported model and the config in one folder."""
    d = tmp_path / "kit"
    d.mkdir(exist_ok=True)
    shutil.copy(pte, d / "toy_cnn_xnnpack_fp32.pte")
    return d


def write_config(d, cfg, name="my_experiment.json"):
    p = d / name
    p.write_text(json.dumps(cfg, indent=2))
    return p


# ---- the real farm -----------------------------------------------------------------------------


@pytest.mark.e2e
def test_kit_config_runs_as_one_experiment_on_the_farm(farm, example_pte, tmp_path):
    d = kit_dir(tmp_path, example_pte("toy_cnn"))
    config = write_config(d, template())
    # the kit's mac template on a farm without a Mac: refused, unless asked to run it here anyway
    refused = farm.cli("submit", "--kit-config", str(config))
    assert refused.returncode == 1 and "is written for macOS" in refused.stderr, refused.stderr
    done = farm.cli("submit", "--kit-config", str(config), "--any-platform", "--wait", "--json")
    assert done.returncode == 3, done.stderr + farm.log("worker") + farm.log("agent")  # SME2-on: unschedulable here
    # the fields the farm does not use are reported, not dropped
    assert "warning: kit config: experiments[].runner_path: not used" in done.stderr
    assert "warning: kit config: output_root: not used" in done.stderr
    rep = json.loads(done.stdout)
    spec = rep["spec"]
    assert (spec["sme2"], spec["threads"], spec["iterations"], spec["warmup"], spec["mode"]) == ("both", [1], 10, 1, "timing")
    assert rep["name"] == "my_experiment"
    assert rep["labels"] == {"kit_config": "my_experiment.json", "kit_sme2_on": "mac_sme2_on",
                             "kit_sme2_off": "mac_sme2_off"}
    off = next(r for r in rep["runs"] if r["sme2"] == "off")
    on = next(r for r in rep["runs"] if r["sme2"] == "on")
    assert len(rep["runs"]) == 2
    assert off["status"] == "succeeded", off["reason"]
    assert off["e2e_ms"]["n"] == 10 and off["categories_ms"]["Convolution"] > 0
    # this host has no SME2: the on arm is refused with the reason, never faked
    assert on["status"] == "unschedulable" and "SME2" in on["reason"]

    # the kit's analysis_summary.json from the farm's stored result
    out = tmp_path / "runs" / "mac" / "analysis_summary.json"
    st = farm.cli("status", str(rep["id"]), "--kit-json", str(out))
    assert st.returncode == 0, st.stderr
    summary = json.loads(out.read_text())
    assert set(summary) == KIT_KEYS
    assert summary["category_totals_ms"] == off["categories_ms"]  # the only succeeded run
    assert summary["etdump_count"] == 1 and summary["run_dir"] == str(out.parent)
    [per] = summary["per_etdump"]
    assert per["categories_ms"] == off["categories_ms"] and f"runs/{off['id']}/" in per["etdump"]
    # memory: the kit has no field for it; the farm's names in the trace's entry
    assert per["memory"]["planned_bytes"] == rep["program_memory"]["planned_bytes"] > 0
    assert per["memory"]["weights_bytes"] == rep["program_memory"]["weights_bytes"]
    assert per["memory"].get("peak_rss_bytes") == (off.get("memory") or {}).get("peak_rss_bytes")
    assert {o["name"] for o in summary["operator_details"]} == {o["name"] for o in off["operators"]}
    for o in summary["operator_details"]:
        assert OPERATOR_KEYS <= set(o) <= OPERATOR_KEYS | {"kernel_hint"}
        assert o["total_ms"] == pytest.approx(o["avg_ms"] * o["count"])


@pytest.mark.e2e
def test_kit_config_sme2_off_only_and_learning_path_spelling(farm, example_pte, tmp_path):
    """One arm in the config -> one arm on the farm; num_runs / num_threads (the learning path's
    words for runs / threads) are read; every run succeeds here."""
    d = kit_dir(tmp_path, example_pte("toy_cnn"))
    cfg = template()
    cfg.pop("output_root")
    cfg["experiments"] = [{"name": "linux_sme2_off", "num_runs": 5, "warmup": 0, "num_threads": 2}]
    done = farm.cli("submit", "--kit-config", str(write_config(d, cfg)), "--wait", "--json")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr  # nothing was set that the farm ignores
    rep = json.loads(done.stdout)
    assert rep["spec"]["sme2"] == "off" and rep["spec"]["threads"] == [2] and rep["spec"]["iterations"] == 5
    [run] = rep["runs"]
    assert run["status"] == "succeeded" and run["threads"] == 2 and run["e2e_ms"]["n"] == 5


BAD = {
    "unknown top-level field": (lambda c: c.update(batch_size=4), "batch_size: unknown field"),
    "unknown experiment field": (lambda c: c["experiments"][1].update(dtype="fp16"), "experiments[1].dtype: unknown field"),
    "missing model file": (lambda c: c.update(model="out_toy/artifacts/gone.pte"), "model: file not found"),
    "threads differ per arm": (lambda c: c["experiments"][0].update(threads=[1, 4]),
                               "SME2 on runs threads [1, 4] but SME2 off runs [1]"),
    "runs differ": (lambda c: c["experiments"][1].update(runs=20), "experiments[1].runs: 20 differs from experiments[0].runs = 10"),
    "runner flags": (lambda c: c["experiments"][0].update(extra_args=["--num_executions", "3"]),
                     "experiments[0].extra_args: the farm cannot pass runner flags"),
    "bad mode": (lambda c: c["experiments"][0].update(mode="profile"), "experiments[0].mode: 'profile' is not one of"),
    "arm unknown": (lambda c: c["experiments"][0].update(name="baseline", runner_path="cmake-out/x/executor_runner"),
                    "experiments[0]: cannot tell whether 'baseline' runs with SME2 on or off"),
    "arm contradicts runner": (lambda c: c["experiments"][0].update(runner_path="cmake-out/mac-arm64-sme2-off/executor_runner"),
                               "experiments[0]: the name 'mac_sme2_on' says SME2 on but runner_path"),
    "same arm twice": (lambda c: c["experiments"].append({"name": "mac_sme2_on_again", "runs": 10, "warmup": 1}),
                       "experiments[2].threads: SME2 on at 1 thread(s) is already run by experiments[0]"),
    "pair names no experiment": (lambda c: c["analysis"].update(compare_pairs=[
        {"baseline": {"experiment": "mac_sme2_off", "threads": 1}, "candidate": {"experiment": "nope", "threads": 1}}]),
        "analysis.compare_pairs[0].candidate.experiment: 'nope' is not an experiment"),
    "cpu_affinity not a mask": (lambda c: [e.update(cpu_affinity="cpu7") for e in c["experiments"]],
                                "experiments[0].cpu_affinity: 'cpu7' must be a hexadecimal CPU mask"),
}


@pytest.mark.e2e
def test_bad_kit_configs_exit_2_naming_the_problem_and_submit_nothing(farm, example_pte, tmp_path):
    d = kit_dir(tmp_path, example_pte("toy_cnn"))
    before = farm.client().experiments(page_size=1).total
    for case, (mutate, message) in BAD.items():
        cfg = template()
        mutate(cfg)
        done = farm.cli("submit", "--kit-config", str(write_config(d, cfg, f"{case.replace(' ', '_')}.json")))
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        assert message in done.stderr, (case, done.stderr)
    # not JSON; a model and a config at once; an option the config decides
    (d / "notes.json").write_text("runs: 10")
    done = farm.cli("submit", "--kit-config", str(d / "notes.json"))
    assert done.returncode == 2 and "not JSON" in done.stderr
    good = write_config(d, template())
    done = farm.cli("submit", str(d / "toy_cnn_xnnpack_fp32.pte"), "--kit-config", str(good))
    assert done.returncode == 2 and "either a model or --kit-config" in done.stderr
    done = farm.cli("submit", "--kit-config", str(good), "--threads", "4")
    assert done.returncode == 2 and "--threads cannot be combined with --kit-config" in done.stderr
    assert farm.client().experiments(page_size=1).total == before  # nothing was submitted


# ---- offline: the config mapping and analysis_summary.json -----------------------------------


def test_model_path_beside_the_config_then_the_kits_root(tmp_path, monkeypatch):
    """Relative model paths are read from the config's folder; the kit's shipped configs hold
    paths relative to the kit's root (where its scripts run), so that is tried next."""
    root = tmp_path / "executorch_sme2_kit"
    (root / "model_profiling" / "configs").mkdir(parents=True)
    art = root / "model_profiling" / "out_toy_cnn" / "artifacts"
    art.mkdir(parents=True)
    (art / "toy_cnn_xnnpack_fp16.pte").write_bytes(b"x")
    cfg = template(model="model_profiling/out_toy_cnn/artifacts/toy_cnn_xnnpack_fp16.pte")
    path = write_config(root / "model_profiling" / "configs", cfg, "toy_cnn_run.json")
    sub = kit.load_kit_config(path, cwd=root)
    assert sub.model == (art / "toy_cnn_xnnpack_fp16.pte").resolve()
    assert sub.notes and "current directory" in sub.notes[0]
    with pytest.raises(kit.KitConfigError, match="model: file not found"):
        kit.load_kit_config(path, cwd=tmp_path)
    # beside the config wins
    (root / "model_profiling" / "configs" / "m.pte").write_bytes(b"y")
    sub = kit.load_kit_config(write_config(root / "model_profiling" / "configs", template(model="m.pte")), cwd=root)
    assert sub.model.name == "m.pte" and not sub.notes


def test_kit_defaults_and_compare_pairs(tmp_path):
    (tmp_path / "m.pte").write_bytes(b"x")
    cfg = {"model": "m.pte", "experiments": [
        {"name": "android_sme2_on", "mode": "xnntrace", "threads": [1, 4], "cpu_affinity": "0x80"},
        {"name": "android_sme2_off", "mode": "xnntrace", "threads": [4, 1], "cpu_affinity": "0x80"}],
        "analysis": {"compare_pairs": [
            {"label": "on vs off", "baseline": {"experiment": "android_sme2_off", "threads": 4},
             "candidate": {"experiment": "android_sme2_on", "threads": 4}},
            {"label": "scaling", "baseline": {"experiment": "android_sme2_on", "threads": 1},
             "candidate": {"experiment": "android_sme2_on", "threads": 4}}]}}
    sub = kit.load_kit_config(write_config(tmp_path, cfg))
    s = sub.spec
    # fields left out take the kit's own defaults (runs 100, warmup 10)
    assert (s.sme2, s.iterations, s.warmup, s.mode, s.core_mask) == ("both", 100, 10, "trace", "0x80")
    assert sorted(s.threads) == [1, 4]
    # the off/on pair is what the farm compares anyway; the thread-scaling pair is reported
    [w] = sub.warnings
    assert w.startswith("analysis.compare_pairs[1] (scaling): not computed")


def _run_analyze(argv, capsys):
    import argparse

    from sme2farm.client import analyze_cmd

    p = argparse.ArgumentParser()
    analyze_cmd.add_arguments(p)
    rc = analyze_cmd.run(p.parse_args(argv))
    return rc, capsys.readouterr()


def test_analyze_kit_json_has_the_kits_keys_and_the_farms_totals(portable_trace, tmp_path, capsys):
    trace = tmp_path / "mac_sme2_on" / "mac_sme2_on_t1.etdump"
    trace.parent.mkdir()
    shutil.copy(portable_trace, trace)
    log = tmp_path / "xnn.log"
    log.write_text("Using gemm microkernel 'xnn_f32_gemm_minmax_ukernel_4x8__neonsme2'.\n")
    rc, out = _run_analyze([str(trace), "--kit-json", "--kernel-log", str(log)], capsys)
    assert rc == 0, out.err
    assert "E2E" in out.out  # the usual report still prints
    written = trace.parent / "analysis_summary.json"  # beside the trace, where the kit writes it
    summary = json.loads(written.read_text())
    rep = analyze(portable_trace.read_bytes(), kernel_log=log.read_text()).to_dict()
    assert set(summary) == KIT_KEYS
    assert summary["category_totals_ms"] == rep["categories_ms"]
    assert list(summary["category_totals_ms"]) == list(CATEGORIES)
    assert summary["kernel_hints"] == {"sme2": 1}
    details = {o["name"]: o for o in summary["operator_details"]}
    assert len(details) == len(rep["operators"])
    for op in rep["operators"]:
        d = details[op["name"]]
        assert OPERATOR_KEYS <= set(d) <= OPERATOR_KEYS | {"kernel_hint"}
        assert (d["category"], d["total_ms"], d["count"]) == (op["category"], op["total_ms"], op["count"])
        assert d["avg_ms"] == pytest.approx(op["avg_ms"])
        # a kernel hint only where the log names an XNNPACK microkernel, as in the kit (the
        # farm's own hint for a portable op or an unlogged kind is no kernel name)
        if "xnn_" in (op["kernel_hint"] or ""):
            assert d["kernel_hint"] == "xnn_f32_gemm_minmax_ukernel_4x8__neonsme2"
        else:
            assert "kernel_hint" not in d
    assert any("kernel_hint" in d for d in details.values() if d["category"] == "GEMM")
    assert not any("kernel_hint" in d for d in details.values() if d["category"] == "Elementwise")
    # a script written against the kit: operator totals by category + the remainder = totals
    by_cat = {c: 0.0 for c in CATEGORIES}
    for d in summary["operator_details"]:
        by_cat[d["category"]] += d["total_ms"]
    for c in CATEGORIES[:4]:
        assert by_cat[c] == pytest.approx(summary["category_totals_ms"][c])


def test_analyze_kit_json_over_two_traces_sums_like_the_kit(portable_trace, tmp_path, capsys):
    from _fixtures_analysis import make_real_trace

    other = make_real_trace("toy_cnn")
    rc, out = _run_analyze([str(portable_trace), "--compare", str(other), "--kit-json", "-"], capsys)
    assert rc == 0, out.err
    summary = json.loads(out.out)  # "-": the summary alone on stdout
    assert set(summary) == KIT_KEYS and summary["etdump_count"] == 2
    a, b = analyze(portable_trace.read_bytes()).to_dict(), analyze(other.read_bytes()).to_dict()
    assert [p["categories_ms"] for p in summary["per_etdump"]] == [a["categories_ms"], b["categories_ms"]]
    for c in CATEGORIES:
        assert summary["category_totals_ms"][c] == pytest.approx(a["categories_ms"][c] + b["categories_ms"][c])


def test_analyze_kit_json_loads_no_http_client_or_wire_schemas(portable_trace, tmp_path):
    """`sme2-client analyze TRACE --kit-json` writes the kit's file from the analysis' plain data
    (client/kit_json.py): like a plain analyze, it starts without httpx, pydantic or the protocol."""
    import subprocess
    import sys

    out = tmp_path / "analysis_summary.json"
    probe = ("import sys\nfrom sme2farm.client.main import main\n"
             f"rc = main(['analyze', {str(portable_trace)!r}, '--kit-json', {str(out)!r}])\n"
             "print(rc, ' '.join(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rc, mods = r.stdout.splitlines()[-1].split(" ", 1)
    mods = set(mods.split())
    assert rc == "0" and set(json.loads(out.read_text())) == KIT_KEYS
    assert "sme2farm.client.kit_json" in mods and "sme2farm.client.kit" not in mods
    assert not {m for m in mods if m.split(".")[0] in ("httpx", "pydantic") or m.startswith("sme2farm.protocol")}


def test_analyze_kit_json_will_not_overwrite_a_trace(portable_trace, tmp_path, capsys):
    victim = tmp_path / "other.etdump"
    victim.write_bytes(b"keep me")
    rc, out = _run_analyze([str(portable_trace), "--kit-json", str(victim)], capsys)
    assert rc == 2 and "looks like a trace or model" in out.err
    assert victim.read_bytes() == b"keep me"


def test_an_emulated_run_in_the_kit_summary_says_its_times_are_the_emulators():
    from sme2farm.client.kit import summary_from_experiment
    from sme2farm.protocol import ExperimentReport

    run = {"id": 3, "experiment_id": 1, "status": "succeeded", "sme2": "on", "threads": 1, "mode": "timing",
           "categories_ms": {}, "operators": []}
    rep = ExperimentReport.model_validate(
        {"id": 1, "status": "succeeded", "spec": {"sme2": "on"}, "model_sha256": "ab", "model_size": 1,
         "created_at": "2026-11-28T10:00:00Z",
         "runs": [{**run, "device": {"serial": "qemu", "platform": "linux", "emulator": "qemu-aarch64 11.1.3 -cpu max"}},
                  {**run, "id": 4, "device": {"serial": "pixel", "platform": "android"}}]})
    traces, _ = summary_from_experiment(rep, "http://farm:8000")
    # each entry's etdump is the trace's address on the server, not a description
    assert [t.label for t in traces] == ["http://farm:8000/runs/3/artifacts/trace.etdump",
                                              "http://farm:8000/runs/4/artifacts/trace.etdump"]
    emulated, hardware = kit.kit_summary(traces, run_dir="r")["per_etdump"]
    assert "emulated by qemu-aarch64 11.1.3 -cpu max: its times are the emulator's" in emulated["emulator"]
    assert "emulator" not in hardware
