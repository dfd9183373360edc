"""Microkernel proof from the emulator's translation log, with the standard (timing) runner build.

The parser on hand-made logs against the real cross-built XNNPACK library's symbols and unwind
table; then, on the SME2 emulator, a tiny fp16 model traced in both arms through the qemu-arm64
driver: the on arm's kernels.log names KleidiAI SME2 kernels, the off arm's none and NEON code
instead; a log over its bound stops the runner with the reason. Models are tiny (emulation is
~300x slower)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sme2farm.agent.drivers import translation
from sme2farm.agent.drivers.base import KERNEL_LOG_NAME, DriverError, Job
from sme2farm.agent.drivers.qemu import QemuArm64Driver
from sme2farm.analysis import analyze, parse_kernel_log, to_markdown, to_terminal
from sme2farm.analysis.kernels import kernel_hint
from sme2farm.runners.elf import function_symbols, unwind_ranges

XNNPACK_LIB = "libexecutorch_backend_xnnpack.so"
BASE = 0x7F0000400000


def _block(addr: int, *insns: str) -> str:
    lines = [f"0x{addr + 4 * i:016x}:  d503201f  {insn}" for i, insn in enumerate(insns or ("nop",))]
    return "----------------\nIN: \n" + "\n".join(lines) + "\n\n"


def _ld_debug(name: str, base: int, size: int) -> str:
    return (f"     42:\tfile={name} [0];  needed by /x/sme2farm_runner [0]\n"
            f"     42:\tfile={name} [0];  generating link map\n"
            f"     42:\t  dynamic: 0x{base + 0x1000:016x}  base: 0x{base:016x}   size: 0x{size:016x}\n"
            f"     42:\t    entry: 0x{base:016x}  phdr: 0x{base + 0x40:016x}  phnum:  9\n\n")


def test_block_parser_streams_across_chunk_boundaries(tmp_path, monkeypatch):
    addrs = [0x5500001000 + 0x40 * i for i in range(200)]
    log = tmp_path / "in_asm.log"
    log.write_text("".join(_block(a, "mov x0, x1", "ret") for a in addrs))
    whole = [a for a, _ in translation.blocks(log)]
    assert whole == addrs
    for chunk in (7, 64, 1000):   # headers, address lines and blocks cut at every kind of place
        monkeypatch.setattr(translation, "_CHUNK", chunk)
        assert [a for a, _ in translation.blocks(log)] == addrs, chunk
        assert all(t.count(b"\n0x") == 2 for _, t in translation.blocks(log))


@pytest.fixture(scope="module")
def xnnpack_lib(arm64_runners) -> Path:
    build = arm64_runners.find("linux-arm64", "on")
    return Path(arm64_runners.resolve(build)).parent / XNNPACK_LIB


@pytest.mark.arm64
def test_parser_names_exported_and_unexported_code_of_the_real_library(xnnpack_lib, tmp_path):
    syms = {s.name: s for s in function_symbols(xnnpack_lib)}
    exported = {s.start for s in syms.values()}
    sme2 = syms["kai_run_matmul_clamp_f16_f16p2vlx2_f16p2vlx2_2vlx2vl_sme2_mopa"]
    getter = next(s for n, s in syms.items() if n.endswith("__neonsme2_get_mr"))
    control = syms["xnn_initialize"]
    # An unexported function: an unwind entry no symbol starts at (a stripped local function).
    local_start, local_size = next((a, n) for a, n in unwind_ranges(xnnpack_lib) if a not in exported and n >= 64)
    fmla = ["fmla     v20.4s, v16.4s, v0.s[0]"] * 5
    log = tmp_path / "in_asm.log"
    log.write_text(
        _block(BASE + sme2.start, "smstart", "fmopa    za0.s, p0/m, p1/m, z0.h, z1.h")
        + _block(BASE + sme2.start + 8) + _block(BASE + sme2.start)        # translated again: counted again
        + _block(BASE + getter.start) + _block(BASE + control.start)        # not kernels
        + _block(BASE + local_start, *fmla) + _block(BASE + local_start + 32, *fmla)
        + _block(0x5500000000))                                              # the executable: no library
    loaded = translation.load_map(_ld_debug(XNNPACK_LIB, BASE, 0x300000) + _ld_debug("libc.so.6", 0x7F0001000000, 0x1000))
    ex = translation.executed_kernels(log, loaded, xnnpack_lib.parent)
    assert ex.blocks == 8 and ex.by_library == {XNNPACK_LIB: 7} and ex.nameless == {XNNPACK_LIB: 2}
    assert ex.kernels == {sme2.name: 3}
    local = translation.unexported_name(XNNPACK_LIB, local_start)
    assert {k: (u.blocks, u.vector_insns, u.isa) for k, u in ex.unexported_kernels().items()} == {local: (2, 10, "NEON")}

    text = translation.format_kernel_log(ex, "qemu-aarch64 -d in_asm")
    assert f"Executed gemm microkernel '{sme2.name}' (3 translated blocks) [emulator translation log]" in text
    k = parse_kernel_log(text)
    assert k["status"] == "ok" and k["source"] == "emulator translation log" and k["translated_blocks"] == 8
    assert k["by_kind"] == {"gemm": [{"name": sme2.name, "isa": "SME2", "blocks": 3}],
                            "unexported": [{"name": local, "isa": "NEON", "blocks": 2}]}
    assert k["sme2_used"] and k["isa_counts"]["SME2"] == 1 and k["isa_counts"]["NEON"] == 1
    assert kernel_hint("Fully Connected (NC, PF16) GEMM", k) == f"gemm: {sme2.name} [SME2]"


@pytest.mark.arm64
def test_parser_refuses_a_run_without_the_loader_map(xnnpack_lib, tmp_path):
    log = tmp_path / "in_asm.log"
    log.write_text(_block(BASE))
    with pytest.raises(ValueError, match="LD_DEBUG=files output missing"):
        translation.executed_kernels(log, [], xnnpack_lib.parent)


def test_kernel_log_sources_and_the_xnnpack_log_unchanged():
    using = "Using gemm microkernel 'xnn_f32_gemm_minmax_ukernel_4x8__aarch64_neonfma_lane_ld128'.\n"
    k = parse_kernel_log(using)
    assert k["source"] == "XNNPACK log" and "translated_blocks" not in k
    assert k["by_kind"] == {"gemm": [{"name": "xnn_f32_gemm_minmax_ukernel_4x8__aarch64_neonfma_lane_ld128",
                                      "isa": "NEON"}]}
    # A traced run whose libraries ran no kernel still says where the answer came from.
    none = parse_kernel_log("Translated blocks: 12 in total; libx.so 3 (3 in no exported function) "
                            "[emulator translation log]\n")
    assert none["status"] == "no kernels found" and none["source"] == "emulator translation log"
    both = parse_kernel_log(using + "Executed gemm microkernel 'kai_run_matmul_x_sme2_mopa' (2 translated blocks) "
                                    "[emulator translation log]\n")
    assert both["source"] == "XNNPACK log and emulator translation log" and both["n_lines"] == 2


def test_translation_log_bound_setting(monkeypatch):
    monkeypatch.delenv(translation.TRANSLATION_LOG_LIMIT_ENV, raising=False)
    assert translation.limit_bytes() == 256 << 20
    monkeypatch.setenv(translation.TRANSLATION_LOG_LIMIT_ENV, "1.5")
    assert translation.limit_bytes() == 3 << 19
    for bad in ("lots", "0", "-3"):
        monkeypatch.setenv(translation.TRANSLATION_LOG_LIMIT_ENV, bad)
        with pytest.raises(ValueError, match=translation.TRANSLATION_LOG_LIMIT_ENV):
            translation.limit_bytes()


# ---- on the SME2 emulator ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_fp16(tmp_path_factory) -> Path:
    """A linear and a conv in fp16: XNNPACK's PF16 GEMM/IGEMM (KleidiAI SME2) in the on arm."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte

    class LinearConv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.conv = nn.Linear(64, 32), nn.Conv2d(4, 8, 3, padding=1)

        def forward(self, x, y):
            return self.fc(x), self.conv(y)

    torch.manual_seed(0)
    inputs = (torch.randn(8, 64).half(), torch.randn(1, 4, 8, 8).half())
    return write_xnnpack_pte(LinearConv().eval().half(), inputs, tmp_path_factory.mktemp("tl") / "tiny_fp16.pte")


def _trace_job(catalog, driver, sme2: str, model: Path, workdir: Path, iterations: int = 2) -> Job:
    build = catalog.find("linux-arm64", sme2, driver.runner_flavour("trace"))
    assert build is not None and build.flavour == "timing"   # no logging build on an emulator
    workdir.mkdir(parents=True)
    return Job(run_id=1, model_path=model, runner=dataclasses.replace(build, path=str(catalog.resolve(build))),
               threads=1, iterations=iterations, warmup=1, timeout_s=300, workdir=workdir, mode="trace")


def _names(kernels: dict) -> list[tuple[str, str]]:
    return [(d["name"], d["isa"]) for ks in kernels["by_kind"].values() for d in ks]


@pytest.mark.sme2emu
def test_emulated_sme2_trace_names_sme2_kernels_in_the_on_arm_and_neon_in_the_off_arm(
        sme2_emulator, arm64_runners, tiny_fp16, tmp_path, monkeypatch):
    monkeypatch.delenv(translation.TRANSLATION_LOG_LIMIT_ENV, raising=False)
    driver = QemuArm64Driver(str(sme2_emulator.path))
    [dev] = driver.discover()
    assert dev.sme2
    kernels = {}
    for sme2 in ("on", "off"):
        # a comma in the work directory: the loader's variables reach the guest whatever the path holds
        job = _trace_job(arm64_runners, driver, sme2, tiny_fp16, tmp_path / f"arm,{sme2}")
        result = driver.execute(dev.serial, job)
        assert result.ok, result.reason
        assert result.kernel_log_path == job.workdir / KERNEL_LOG_NAME
        # The raw log and the loader's map are gone; only the compact kernels.log is kept.
        assert not (job.workdir / translation.TRANSLATION_LOG_NAME).exists()
        assert not list(job.workdir.glob(f"{translation.LD_DEBUG_PREFIX}.*"))
        text = result.kernel_log_path.read_text()
        assert len(text) < 20_000
        report = analyze(result.etdump_path.read_bytes(), kernel_log=text).to_dict()
        kernels[sme2] = report["kernels"]
        assert kernels[sme2]["status"] == "ok" and kernels[sme2]["source"] == "emulator translation log"
        assert "## Kernels" in to_markdown(report) and "from the emulator translation log" in to_markdown(report)
        assert "Kernels: " in to_terminal(report) and ", from the emulator translation log" in to_terminal(report)
        kernels[sme2]["markdown"] = to_markdown(report)
    on, off = _names(kernels["on"]), _names(kernels["off"])
    sme2_on = [n for n, isa in on if isa == "SME2"]
    assert any(n.startswith("kai_") and "sme2" in n for n in sme2_on), on
    assert kernels["on"]["sme2_used"] and "**SME2 kernels used**" in kernels["on"]["markdown"]
    assert not kernels["off"]["sme2_used"] and not [n for n, isa in off if isa in ("SME2", "SME")], off
    assert [n for n, isa in off if isa == "NEON"], off
    assert "no SME2 kernel" in kernels["off"]["markdown"]
    # The NEON GEMM code the off arm ran is not what the on arm ran: SME2 replaced it.
    assert not {n for n, isa in off if isa == "NEON"} <= {n for n, _ in on}


@pytest.mark.sme2emu
def test_emulated_sme2_trace_over_its_bound_stops_the_runner_with_the_reason(
        sme2_emulator, arm64_runners, tiny_fp16, tmp_path, monkeypatch):
    monkeypatch.setenv(translation.TRANSLATION_LOG_LIMIT_ENV, "0.5")   # start-up alone writes ~3 MiB
    driver = QemuArm64Driver(str(sme2_emulator.path))
    [dev] = driver.discover()
    job = _trace_job(arm64_runners, driver, "on", tiny_fp16, tmp_path / "w", iterations=50)
    result = driver.execute(dev.serial, job)
    assert not result.ok
    assert "over its bound of 0.5 MiB" in result.reason and translation.TRANSLATION_LOG_LIMIT_ENV in result.reason
    assert "runner was stopped" in result.reason
    # Stopped while it ran: the runner never reached its ETDump, and nothing of the raw log is left.
    assert result.etdump_path is None and not (job.workdir / "trace.etdump").exists()
    assert not (job.workdir / translation.TRANSLATION_LOG_NAME).exists()
    assert result.kernel_log_path is None


@pytest.mark.arm64
def test_a_log_found_over_its_bound_after_the_run_fails_it_and_is_removed(arm64_runners, tmp_path, monkeypatch):
    """The runner can end between two 50 ms polls with the log already past the bound: collect
    refuses it too, and the raw files go either way."""
    monkeypatch.setenv(translation.TRANSLATION_LOG_LIMIT_ENV, "0.001")
    driver = QemuArm64Driver("qemu-aarch64")
    job = _trace_job(arm64_runners, driver, "off", tmp_path / "model.pte", tmp_path / "w")
    (job.workdir / translation.TRANSLATION_LOG_NAME).write_text(_block(BASE) * 100)
    (job.workdir / f"{translation.LD_DEBUG_PREFIX}.42").write_text(_ld_debug(XNNPACK_LIB, BASE, 0x300000))
    with pytest.raises(DriverError, match="over its bound of 0.001 MiB; its kernels were not named"):
        driver.collect("qemu", job)
    assert sorted(p.name for p in job.workdir.iterdir()) == []


@pytest.mark.arm64
def test_the_agent_traces_on_the_emulator_with_the_timing_build(arm64_runners):
    """job.refuse asks the device's driver which flavour a trace run needs: the qemu device
    traces with the timing build; hardware still needs the xnnlog (logging) build."""
    from datetime import datetime, timezone

    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.job import refuse
    from sme2farm.protocol import DeviceInfo, RunAssignment

    info = DeviceInfo(serial="arm64", platform="linux", runner_platform="linux-arm64", sme2=True)
    a = RunAssignment(run_id=1, lease_id="x", lease_expires_at=datetime.now(timezone.utc), device_serial="arm64",
                      model_sha256="0" * 64, model_size=1, sme2="on", threads=1, iterations=1, warmup=0, mode="trace")
    assert refuse(a, (QemuArm64Driver("qemu-aarch64"), info), arm64_runners) == ""
    assert "(xnnlog flavour)" in refuse(a, (LocalDriver(), info), arm64_runners)


@pytest.mark.sme2emu
@pytest.mark.e2e
def test_emulated_sme2_farm_traces_both_arms_and_reports_which_kernels_ran(
        arm64_runners, sme2_emulator, tiny_fp16, tmp_path):
    """`submit --mode trace --sme2 both` on the emulated device: the server schedules it with the
    device's trace flavour (timing), the agent uploads kernels.log, ingest reports it per run."""
    from _fixtures_farm import start_farm, stop_farm

    farm = start_farm(tmp_path / "farm", arm64_runners.manifest, sme2_emulator.env, drivers="qemu-arm64")
    try:
        rep = farm.submit_json(str(tiny_fp16), "--sme2", "both", "--mode", "trace", "--iterations", "2",
                               "--warmup", "1", timeout=900)
        runs = {r["sme2"]: r for r in rep["runs"]}
    finally:
        stop_farm(farm.proc)
    for arm, run in runs.items():
        assert run["status"] == "succeeded", (arm, run["reason"])
        assert run["runner"]["flavour"] == "timing" and "kernels.log" in run["artifacts"]
        assert run["kernels"]["source"] == "emulator translation log", run["kernels"]
    assert runs["on"]["kernels"]["sme2_used"] and runs["on"]["kernels"]["isa_counts"]["SME2"] > 0
    assert not runs["off"]["kernels"]["sme2_used"] and runs["off"]["kernels"]["isa_counts"]["NEON"] > 0
