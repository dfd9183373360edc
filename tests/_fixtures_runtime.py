"""Runtime fixtures: the locally built runner and exported example models (session-scoped,
because a build takes seconds and an export several); the multi-method programs and bundled
programs the inputs and outputs tests export."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["local_runner", "example_pte", "toy_pte", "pte", "arm64_runners", "resolved_runner"]


@pytest.fixture(scope="session")
def local_runner(tmp_path_factory):
    """(Catalog, RunnerBuild): the wheel-linked runner, built into runners/build/<platform>/ and
    registered in a session-private manifest so tests never edit the repo's manifest."""
    pytest.importorskip("executorch")
    from sme2farm.runners.build import build_local
    from sme2farm.runners.catalog import Catalog

    manifest = tmp_path_factory.mktemp("runner") / "manifest.json"
    build = build_local(manifest)
    return Catalog.load(manifest), build


@pytest.fixture(scope="session")
def example_pte(tmp_path_factory):
    """Factory example_pte(name, **kw) -> Path; each (name, kw) is exported once per session, and
    once for all the pytest-xdist workers of a run (the first exports, under a file lock, the
    others wait for it). SME2_TEST_EXAMPLES_DIR, set by `make test` for its two pytest runs, shares
    them between runs too."""
    pytest.importorskip("torch")
    from sme2farm.runners.examples import export_example

    out_dir = shared_exports_dir(tmp_path_factory)
    cache: dict[tuple, Path] = {}

    def make(name: str, **kw) -> Path:
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            out = out_dir / f"{name}{''.join(f'-{k}{v}' for k, v in key[1])}.pte"
            cache[key] = export_once(out, lambda partial: export_example(name, partial, **kw))
        return cache[key]

    return make


def shared_exports_dir(tmp_path_factory) -> Path:
    """Where a run's exported models are kept for every pytest-xdist worker of the run and, under
    `make test` (SME2_TEST_EXAMPLES_DIR), for both of its pytest runs."""
    if os.environ.get("SME2_TEST_EXAMPLES_DIR"):
        out_dir = Path(os.environ["SME2_TEST_EXAMPLES_DIR"])
    elif os.environ.get("PYTEST_XDIST_WORKER"):   # the run's base temp, above each worker's own
        out_dir = tmp_path_factory.getbasetemp().parent / "examples"
    else:
        out_dir = tmp_path_factory.getbasetemp() / "examples"
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def export_once(out: Path, export) -> Path:
    """`out`, made by export(partial_path) unless it exists: the first process to ask exports
    under a file lock, the others wait for it and reuse the file."""
    from filelock import FileLock

    with FileLock(str(out) + ".lock"):
        if not out.exists():
            partial = out.with_suffix(f".{os.getpid()}.partial")
            export(partial)
            os.replace(partial, out)
    return out


@pytest.fixture(scope="session")
def toy_pte(example_pte) -> Path:
    """toy_cnn's program file."""
    return example_pte("toy_cnn")


@pytest.fixture
def pte(toy_pte) -> bytes:
    """toy_cnn's program: the bytes a client uploads."""
    return toy_pte.read_bytes()


@pytest.fixture(scope="session")
def arm64_runners(tmp_path_factory):
    """Catalog with the wheel cross-built aarch64 runners (linux-arm64 folder and the Android
    bundle, both SME2 arms each), registered in a session-private manifest."""
    from sme2farm.runners.catalog import Catalog
    from sme2farm.runners.cross import build_platform

    manifest = tmp_path_factory.mktemp("arm64") / "manifest.json"
    for platform in ("linux-arm64", "android-arm64"):
        build_platform(platform, manifest)
    return Catalog.load(manifest)


def multi_method_modules():
    """Scale (int and bool inputs), HalfConv (fp16) and Mixed (five dtypes): the modules the inputs
    and outputs tests export."""
    import torch
    from torch import nn

    class Scale(nn.Module):
        def forward(self, x, n: int, flag: bool):
            return x * n if flag else x

    class HalfConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x))

    class Mixed(nn.Module):
        def forward(self, a, b, c, d, e):
            return (a.float() + b.float()).sum() + c.float().sum() + d.float().sum() + e.to(torch.float32).sum()

    return Scale, HalfConv, Mixed


def export_methods(methods: dict, *, xnnpack: bool = True):
    """{method: (module, example inputs)} -> ExecutorchProgramManager (several methods in one program)."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    eps = {name: torch.export.export(m, args) for name, (m, args) in methods.items()}
    parts = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        parts = [XnnpackPartitioner()]
    return to_edge_transform_and_lower(eps, partitioner=parts).to_executorch()


def bundle(program, suites: dict[str, list[tuple]], *, pte_path=None) -> bytes:
    """ExecuTorch's own bundled-program writer. With pte_path it skips its input validation,
    which is how a .bpte whose inputs do not fit its method is made."""
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    ts = [MethodTestSuite(name, [MethodTestCase(inputs=list(c)) for c in cases]) for name, cases in suites.items()]
    bp = BundledProgram(None, ts, pte_file_path=str(pte_path)) if pte_path else BundledProgram(program, ts)
    return serialize_from_bundled_program_to_flatbuffer(bp)


def resolved_runner(local_runner) -> str:
    """The path of local_runner's executor_runner (the catalog resolves the build)."""
    catalog, build = local_runner
    return str(catalog.resolve(build))
