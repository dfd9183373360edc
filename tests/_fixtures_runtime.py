"""Runtime fixtures: the locally built runner and exported example models (session-scoped,
because a build takes seconds and an export several)."""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["local_runner", "example_pte", "arm64_runners"]


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
    """Factory example_pte(name, **kw) -> Path; each (name, kw) is exported once per session."""
    pytest.importorskip("torch")
    from sme2farm.runners.examples import export_example

    out_dir = tmp_path_factory.mktemp("examples")
    cache: dict[tuple, Path] = {}

    def make(name: str, **kw) -> Path:
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            suffix = "".join(f"-{k}{v}" for k, v in key[1])
            cache[key] = export_example(name, out_dir / f"{name}{suffix}.pte", **kw)
        return cache[key]

    return make


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
