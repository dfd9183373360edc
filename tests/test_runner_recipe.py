"""The device build recipe, without a real ExecuTorch checkout or NDK: the argv it would run for
every variant, the manifest it writes (fake binaries), the whole flow with a stand-in cmake, and
its errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sme2farm.runners.catalog import Catalog
from sme2farm.runners.recipe import PLATFORMS, RecipeError, main, plan, register_binary, run_recipe

LIBCXX = "toolchains/llvm/prebuilt/linux-x86_64/sysroot/usr/lib/aarch64-linux-android/libc++_shared.so"


@pytest.fixture
def checkout(tmp_path):
    src = tmp_path / "executorch"
    (src / "examples/portable/executor_runner").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(executorch)\n")
    (src / "version.txt").write_text("1.6.0a0\n")
    return src


@pytest.fixture
def ndk(tmp_path, monkeypatch):
    root = tmp_path / "ndk"
    (root / "build/cmake").mkdir(parents=True)
    (root / "build/cmake/android.toolchain.cmake").write_text("")
    (root / LIBCXX).parent.mkdir(parents=True)
    (root / LIBCXX).write_bytes(b"libc++ stand-in")
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    return root


def defines(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("-D"))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dry_run_plans_every_variant(checkout, ndk, platform):
    plans = plan(checkout, platform, ndk=ndk, jobs=3)
    assert {(p.sme2, p.flavour) for p in plans} == {(s, f) for s in ("on", "off") for f in ("timing", "xnnlog")}
    assert len({p.build_dir for p in plans}) == 4
    for p in plans:
        assert all(isinstance(a, str) for a in p.configure + p.build)
        assert p.configure[:5] == ["cmake", "-S", str(checkout), "-B", str(p.build_dir)]
        d = defines(p.configure)
        switch = "ON" if p.sme2 == "on" else "OFF"
        assert d["XNNPACK_ENABLE_ARM_SME2"] == d["XNNPACK_ENABLE_ARM_SME"] == switch
        for option in ("EXECUTORCH_BUILD_EXECUTOR_RUNNER", "EXECUTORCH_BUILD_DEVTOOLS",
                       "EXECUTORCH_ENABLE_EVENT_TRACER", "EXECUTORCH_BUILD_XNNPACK", "EXECUTORCH_ENABLE_LOGGING"):
            assert d[option] == "ON"
        assert d["CMAKE_C_FLAGS"] == d["CMAKE_CXX_FLAGS"]
        if p.flavour == "xnnlog":
            assert d["CMAKE_C_FLAGS"].split() == ["-UXNN_NO_LOGGING", "-DXNN_LOG_LEVEL=5"]
        else:
            assert "-UXNN_NO_LOGGING" not in d["CMAKE_C_FLAGS"]
        assert p.build == ["cmake", "--build", str(p.build_dir), "--target", "executor_runner", "-j", "3"]
        assert p.binary == p.build_dir / "executor_runner"
        if platform == "android-arm64-v9a":
            assert d["CMAKE_TOOLCHAIN_FILE"] == str(ndk / "build/cmake/android.toolchain.cmake")
            assert (d["ANDROID_ABI"], d["ANDROID_STL"]) == ("arm64-v8a", "c++_shared")
            assert d["ANDROID_PLATFORM"].startswith("android-")
            assert p.extra_files == [ndk / LIBCXX]
        else:
            assert "CMAKE_TOOLCHAIN_FILE" not in d and p.extra_files == []
    # The on/off pair of a flavour differs in the SME switches only.
    by = {(p.sme2, p.flavour): defines(p.configure) for p in plans}
    for flavour in ("timing", "xnnlog"):
        diff = {k for k in by["on", flavour] if by["on", flavour][k] != by["off", flavour][k]}
        assert diff == {"XNNPACK_ENABLE_ARM_SME2", "XNNPACK_ENABLE_ARM_SME"}


def test_cli_dry_run_prints_the_plan(checkout, ndk, capsys):
    assert main(["--executorch-src", str(checkout), "--ndk", str(ndk), "--platform", "android-arm64-v9a",
                 "--dry-run", "--jobs", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [p.as_json() for p in plan(checkout, "android-arm64-v9a", ndk=ndk, jobs=2)]


def test_ndk_from_environment(checkout, ndk, monkeypatch):
    monkeypatch.setenv("ANDROID_NDK", str(ndk))
    assert plan(checkout, "android-arm64-v9a")[0].extra_files == [ndk / LIBCXX]


def test_missing_checkout_and_ndk_give_clear_errors(tmp_path, checkout, ndk, capsys):
    with pytest.raises(RecipeError, match="not an ExecuTorch checkout"):
        plan(tmp_path / "nowhere", "macos-arm64")
    with pytest.raises(RecipeError, match="needs the Android NDK"):
        plan(checkout, "android-arm64-v9a")
    with pytest.raises(RecipeError, match="android.toolchain.cmake is missing"):
        plan(checkout, "android-arm64-v9a", ndk=tmp_path)
    with pytest.raises(RecipeError, match="unknown platform"):
        plan(checkout, "windows-x86")
    assert main(["--executorch-src", str(tmp_path / "nowhere"), "--platform", "linux-arm64", "--dry-run"]) == 2
    assert "not an ExecuTorch checkout" in capsys.readouterr().err


def test_register_fake_binaries_updates_and_replaces(tmp_path):
    manifest = tmp_path / "runners" / "manifest.json"
    first, second, lib = tmp_path / "a" / "executor_runner", tmp_path / "b" / "executor_runner", tmp_path / "libc++_shared.so"
    for f, content in ((first, b"build one"), (second, b"build two"), (lib, b"libcxx")):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(content)

    on = register_binary(first, "android-arm64-v9a", "on", manifest=manifest, executorch_commit="c1",
                         executorch_version="1.6", extra_files=[lib])
    off = register_binary(first, "android-arm64-v9a", "off", manifest=manifest, executorch_commit="c1")
    catalog = Catalog.load(manifest)
    assert len(catalog.builds) == 2
    got = catalog.find("android-arm64-v9a", "on", "timing")
    assert got == on and got.sha256 == hashlib.sha256(b"build one").hexdigest()
    assert (got.executorch_commit, got.executorch_version, got.supports_warmup) == ("c1", "1.6", False)
    assert catalog.resolve(got).read_bytes() == b"build one"
    assert [(manifest.parent / f).read_bytes() for f in got.extra_files] == [b"libcxx"]

    # The same (platform, sme2, flavour) again: replaced, not duplicated; the other entry stays.
    again = register_binary(second, "android-arm64-v9a", "on", manifest=manifest, executorch_commit="c2")
    catalog = Catalog.load(manifest)
    assert len(catalog.builds) == 2
    assert catalog.find("android-arm64-v9a", "on") == again
    assert again.sha256 == hashlib.sha256(b"build two").hexdigest() and again.id != on.id
    assert catalog.find("android-arm64-v9a", "off") == off
    # The registered copy is independent of the build tree it came from.
    second.write_bytes(b"rebuilt later")
    assert catalog.resolve(again).read_bytes() == b"build two"


def test_register_rejects_missing_binary(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        register_binary(tmp_path / "nope", "macos-arm64", "on", manifest=tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_register_cli_reads_commit_from_checkout(tmp_path, checkout, capsys):
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    binary = tmp_path / "executor_runner"
    binary.write_bytes(b"mac runner")
    manifest = tmp_path / "manifest.json"
    assert main(["register", "--binary", str(binary), "--platform", "macos-arm64", "--sme2", "off",
                 "--flavour", "xnnlog", "--executorch-src", str(checkout), "--manifest", str(manifest)]) == 0
    printed = json.loads(capsys.readouterr().out)
    (entry,) = json.loads(manifest.read_text())["builds"]
    assert entry == printed
    assert (entry["executorch_commit"], entry["executorch_version"], entry["flavour"]) == (head, "1.6.0a0", "xnnlog")


FAKE_CMAKE = """#!{python}
# Stand-in for cmake: records its argv and, for --build, produces the target binary.
import json, os, sys
with open(os.environ["FAKE_CMAKE_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "--build":
    os.makedirs(sys.argv[2], exist_ok=True)
    with open(os.path.join(sys.argv[2], sys.argv[4]), "w") as f:
        f.write("runner built in " + sys.argv[2])
"""


def test_run_recipe_runs_the_planned_commands_and_registers_each_variant(tmp_path, checkout, ndk, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "cmake").write_text(FAKE_CMAKE.format(python=sys.executable))
    (bindir / "cmake").chmod(0o755)
    log = tmp_path / "cmake.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CMAKE_LOG", str(log))
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    manifest = tmp_path / "farm" / "manifest.json"

    builds = run_recipe(checkout, "android-arm64-v9a", ndk=ndk, manifest=manifest, jobs=2)

    planned = plan(checkout, "android-arm64-v9a", ndk=ndk, jobs=2)
    ran = [json.loads(line) for line in log.read_text().splitlines()]
    assert ran == [argv[1:] for p in planned for argv in (p.configure, p.build)]
    catalog = Catalog.load(manifest)
    assert sorted((b.sme2, b.flavour) for b in catalog.builds) == sorted((p.sme2, p.flavour) for p in planned)
    for b, p in zip(builds, planned):
        assert catalog.resolve(b).read_text() == f"runner built in {p.build_dir}"
        assert b.sha256 == hashlib.sha256(p.binary.read_bytes()).hexdigest()
        assert len(b.executorch_commit) == 40 and b.executorch_version == "1.6.0a0"
        assert [Path(f).name for f in b.extra_files] == ["libc++_shared.so"]
