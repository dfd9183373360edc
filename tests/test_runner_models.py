"""Every model runs: inputs of every dtype (fp16, bf16, int64 ids, bool masks), scalar inputs,
several methods, an SME2IN01 inputs file, and a missing operator named in the failure.

The programs are exported here with torch/executorch; whether each one runs at all is checked
against ExecuTorch's own Python bindings (the independent reference), and the inputs file is
written with struct from the format's definition, not with the farm's writer."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sme2farm.agent.drivers.base import Job, failure_reason

from _helpers_runner import run_local_runner

pytestmark = pytest.mark.models

torch = pytest.importorskip("torch")

# ExecuTorch ScalarType codes (runtime/core/portable_type/scalar_type.h)
LONG, HALF, FLOAT, BOOL, BFLOAT16 = 4, 5, 6, 11, 15


def _save(program, path: Path) -> Path:
    path.write_bytes(program.to_executorch().buffer)
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
    from torch.export import export

    out = tmp_path_factory.mktemp("programs")
    torch.manual_seed(0)

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.conv(x).mean((2, 3)))

    class TwoBf16(torch.nn.Module):
        def forward(self, x, y):
            return (x * 2 + y).sum()

    class Tokens(torch.nn.Module):  # int64 ids, a bool mask, a float and an int scalar
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 8)

        def forward(self, ids, mask, scale: float, shift: int):
            return (self.emb(ids) * mask.unsqueeze(-1)).sum() * scale + shift

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Triple(torch.nn.Module):
        def forward(self, x):
            return x * 3

    lib = torch.library.Library("sme2test", "DEF")  # an operator no runner has a kernel for
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")

    def _twice_out(x, *, out):
        out.copy_(x * 2)
        return out

    lib.impl("twice.out", _twice_out, "CompositeExplicitAutograd")

    class Custom(torch.nn.Module):
        def forward(self, x):
            return torch.ops.sme2test.twice(torch.ops.sme2test.twice(x)) + 1   # two call sites, named once

    class Relu(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    fp16 = Conv().eval().half()
    channels_last = torch.ones(1, 2, 3, 4).to(memory_format=torch.channels_last)
    return {
        "channels_last": _save(to_edge(export(Relu(), (channels_last,))), out / "channels_last.pte"),
        "fp16": _save(to_edge_transform_and_lower(export(fp16, (torch.ones(1, 3, 16, 16, dtype=torch.half),)),
                                                  partitioner=[XnnpackPartitioner()]), out / "fp16.pte"),
        "bf16": _save(to_edge(export(TwoBf16(), (torch.ones(4, 4, dtype=torch.bfloat16),) * 2)), out / "bf16.pte"),
        "tokens": _save(to_edge(export(Tokens().eval(), (torch.ones(1, 5, dtype=torch.long),
                                                         torch.ones(1, 5, dtype=torch.bool), 2.0, 3))),
                        out / "tokens.pte"),
        "multi": _save(to_edge({"forward": export(AddOne(), (torch.ones(2),)),
                                "triple": export(Triple(), (torch.ones(3),))}), out / "multi.pte"),
        "custom": _save(to_edge(export(Custom(), (torch.ones(2),)),
                                compile_config=EdgeCompileConfig(_check_ir_validity=False)), out / "custom.pte"),
    }


def _bindings_run(path: Path, method: str, inputs: list) -> list:
    """ExecuTorch's own Python runtime: the reference for whether a program runs."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch
    return _load_for_executorch(str(path)).run_method(method, inputs)


def _inputs_file(path: Path, records: list[bytes]) -> Path:
    path.write_bytes(b"SME2IN01" + struct.pack("<I", len(records)) + b"".join(records))
    return path


def _tensor(scalar_type: int, sizes: tuple[int, ...], data: bytes) -> bytes:
    head = struct.pack("<BBBB", 1, scalar_type, len(sizes), 0) + struct.pack(f"<{len(sizes)}q", *sizes)
    return head + struct.pack("<Q", len(data)) + data


@pytest.mark.parametrize("name,bindings_inputs", [
    ("fp16", lambda: [torch.ones(1, 3, 16, 16, dtype=torch.half)]),
    ("bf16", lambda: [torch.ones(4, 4, dtype=torch.bfloat16)] * 2),
    ("tokens", lambda: [torch.ones(1, 5, dtype=torch.long), torch.ones(1, 5, dtype=torch.bool), 2.0, 3]),
])
def test_inputs_of_every_dtype_run_as_the_bindings_run_them(local_runner, programs, tmp_path, name, bindings_inputs):
    assert _bindings_run(programs[name], "forward", bindings_inputs())   # the reference runs it
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs[name]}", "--num_executions=2",
             "--etdump_path=t.etdump")
    assert r.returncode == 0, r.stderr
    assert "Model executed successfully 2 time(s)" in r.stdout
    assert (tmp_path / "t.etdump").stat().st_size > 0


def test_method_name_selects_another_method(local_runner, programs, tmp_path):
    assert _bindings_run(programs["multi"], "triple", [torch.ones(3)])[0].tolist() == [3.0, 3.0, 3.0]
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['multi']}", "--method_name=triple")
    assert r.returncode == 0, r.stderr
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['multi']}", "--method_name=encode")
    assert r.returncode == 1
    assert "no method 'encode' (it has: " in r.stderr and "triple" in r.stderr


def test_job_passes_the_method_and_inputs_file(local_runner, tmp_path):
    _, build = local_runner
    job = Job(run_id=1, model_path=tmp_path / "m.pte", runner=build, threads=1, iterations=3, warmup=1,
              timeout_s=10, workdir=tmp_path, method="triple", inputs_path=tmp_path / "in.bin")
    assert "--method_name=triple" in job.runner_args
    assert "--inputs_file=inputs.bin" in job.runner_args


def test_inputs_file_feeds_tensors_and_scalars(local_runner, programs, tmp_path):
    ids = struct.pack("<5q", 1, 2, 3, 4, 5)
    mask = bytes([1, 0, 1, 0, 1])
    inputs = _inputs_file(tmp_path / "inputs.bin", [
        _tensor(LONG, (1, 5), ids), _tensor(BOOL, (1, 5), mask),
        struct.pack("<Bd", 3, 2.0), struct.pack("<Bq", 2, 3)])
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['tokens']}", f"--inputs_file={inputs}",
             "--num_executions=3")
    assert r.returncode == 0, r.stderr
    # torch.export specialises scalar inputs: ExecuTorch refuses any other value, and says which.
    other = _inputs_file(tmp_path / "other.bin", [
        _tensor(LONG, (1, 5), ids), _tensor(BOOL, (1, 5), mask),
        struct.pack("<Bd", 3, 0.5), struct.pack("<Bq", 2, 3)])
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['tokens']}", f"--inputs_file={other}")
    assert r.returncode == 1
    assert "set_input failed for input 2 of method 'forward'" in r.stderr and "0.5" in r.stderr

    half = _inputs_file(tmp_path / "half.bin", [_tensor(HALF, (1, 3, 16, 16), struct.pack("<e", 0.25) * 768)])
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['fp16']}", f"--inputs_file={half}")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("records,message", [
    ([_tensor(FLOAT, (1, 3, 16, 16), b"\0" * 3072)],
     "the inputs file gives input 0 of method 'forward' as Float [1, 3, 16, 16], the method expects Half [1, 3, 16, 16]"),
    ([], "the inputs file gives 0 input(s), method 'forward' takes 1"),
    ([_tensor(HALF, (1, 3, 16, 16), b"\0" * 10)], "has 10 bytes"),
    ([struct.pack("<Bq", 2, 1)], "as a scalar, the method expects a tensor Half"),
])
def test_inputs_that_do_not_match_the_method_fail_naming_the_input(local_runner, programs, tmp_path, records, message):
    bad = _inputs_file(tmp_path / "bad.bin", records)
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['fp16']}", f"--inputs_file={bad}",
             "--etdump_path=t.etdump")
    assert r.returncode == 1
    assert message in r.stderr
    assert not (tmp_path / "t.etdump").exists()


def _printed(stdout: str) -> list[float]:
    line = next(line for line in stdout.splitlines() if line.startswith("Output 0: "))
    return [float(v) for v in line.split("] ", 1)[1].split()]


def test_inputs_file_values_reach_a_channels_last_input_in_logical_order(local_runner, programs, tmp_path):
    """The file holds row-major values; an input with dim order 0 2 3 1 must see the same logical
    tensor. --print_output against the Python bindings given that tensor decides it."""
    values = [float(v - 11) for v in range(24)]
    inputs = _inputs_file(tmp_path / "in.bin", [_tensor(FLOAT, (1, 2, 3, 4), struct.pack("<24f", *values))])
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['channels_last']}", f"--inputs_file={inputs}",
             "--num_executions=2", "--print_output")
    assert r.returncode == 0, r.stderr
    x = torch.tensor(values).reshape(1, 2, 3, 4).to(memory_format=torch.channels_last)
    expected = _bindings_run(programs["channels_last"], "forward", [x])[0].flatten().tolist()
    assert _printed(r.stdout) == expected
    # The channels-last memory order of the same tensor differs, so a scramble would show.
    assert torch.relu(x).permute(0, 2, 3, 1).flatten().tolist() != expected


def test_truncated_inputs_file_is_named(local_runner, programs, tmp_path):
    (tmp_path / "short.bin").write_bytes(b"SME2IN01\x01\x00")
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['fp16']}", "--inputs_file=short.bin")
    assert r.returncode == 1 and "inputs file 'short.bin' is truncated" in r.stderr


def test_missing_operator_is_named_and_leads_the_reason(local_runner, programs, tmp_path):
    r = run_local_runner(local_runner, tmp_path, f"--model_path={programs['custom']}")
    assert r.returncode == 1
    assert "error: this runner has no kernel for operator(s) sme2test::twice.out needed by method 'forward'" in r.stderr
    log = tmp_path / "runner.log"
    log.write_text(r.stdout + r.stderr)
    reason = failure_reason(log, r.returncode)
    assert reason.startswith("error: this runner has no kernel for operator(s) sme2test::twice.out"), reason


def test_reason_names_the_signal(tmp_path):
    log = tmp_path / "runner.log"
    log.write_text("I 00:00:00.000100 executorch:program.cpp:1] loading\nThreads: 1\n")
    assert failure_reason(log, -11).startswith("runner killed by SIGSEGV (exit -11)")
    assert failure_reason(log, 134).startswith("runner killed by SIGABRT (exit 134)")   # a shell's 128+N
    assert "loading" not in failure_reason(log, 1)   # INFO chatter never reaches the reason
