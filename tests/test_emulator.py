"""The farm's SME2 emulator (runners/emulator.py, `sme2-farm emulator install|status`): a real
install through apt-get with private directories from the mirror this machine's apt uses (fast
here: one 70 MB .deb), its manifest and idempotence, status, the failures and their message, and
the emulated CPU's feature names against QEMU's own /proc/cpuinfo."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from sme2farm.runners import emulator

FARM = [sys.executable, "-m", "sme2farm.farm.cli"]


def _farm(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FARM, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def _manual_steps_in(text: str, directory: Path) -> None:
    assert "by hand" in text and "apt-get download qemu-user/trixie-backports" in text
    assert "dpkg-deb -x" in text and str(directory / "qemu-aarch64") in text


@pytest.mark.sme2emu
def test_emulated_sme2_install_records_a_manifest_and_is_idempotent(tmp_path, sme2_emulator):
    cache = tmp_path / "cache"
    said: list[str] = []
    manifest, new = emulator.install(cache, say=said.append)
    binary = cache / "qemu-aarch64"
    assert new is True and binary.is_file() and os.access(binary, os.X_OK)
    assert said and said[0].startswith(f"{manifest['suite']}: fetching qemu-user")
    assert json.loads((cache / "manifest.json").read_text()) == manifest
    assert manifest["package"] == "qemu-user" and manifest["suite"] in emulator.SUITES
    assert manifest["qemu_version"] in manifest["package_version"]
    assert manifest["sha256"] == emulator.sha256_file(binary)
    assert len(manifest["deb_sha256"]) == 64 and manifest["deb"].endswith(".deb")
    assert datetime.strptime(manifest["installed_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert manifest["sme2"] is True and int(manifest["hwcap2"], 16) >> 37 & 1
    # The same package as the session's emulator: same binary, same CPU.
    assert manifest["sha256"] == emulator.sha256_file(sme2_emulator.path)
    assert manifest["hwcap2"] == f"{sme2_emulator.cpu.hwcap2:#x}"

    stamp = binary.stat().st_mtime_ns
    again, new = emulator.install(cache)
    assert new is False and again == manifest and binary.stat().st_mtime_ns == stamp
    done = _farm("emulator", "install", env={"SME2_EMULATOR_DIR": str(cache)})
    assert done.returncode == 0 and "already installed" in done.stdout and "nothing to do" in done.stdout

    # A binary that no longer matches its manifest is not used, and the next install replaces it.
    with open(binary, "ab") as f:
        f.write(b"\0")
    assert emulator.installed(cache) is None and emulator.choose_qemu(cache) == emulator.SYSTEM_QEMU
    st = emulator.status(cache)
    assert st["installed"]["sha256_verified"] is False and st["uses"] == "system"
    manifest2, new = emulator.install(cache)
    assert new is True and emulator.installed(cache) == binary and manifest2["sha256"] == manifest["sha256"]


@pytest.mark.sme2emu
def test_emulated_sme2_install_skips_a_suite_whose_qemu_has_no_sme2(tmp_path, sme2_emulator):
    # Debian 13's own qemu (10.0) sets no SME2 bit: the installer says so and takes the next suite.
    said: list[str] = []
    manifest, new = emulator.install(tmp_path / "cache", suites=("trixie", "trixie-backports"), say=said.append)
    assert new and manifest["suite"] == "trixie-backports" and manifest["sme2"] is True
    assert [s.partition(":")[0] for s in said] == ["trixie", "trixie", "trixie-backports"], said
    assert said[1].startswith("trixie: qemu-aarch64 ") and "-cpu max" in said[1] and "bit 37 (SME2) clear" in said[1]


@pytest.mark.sme2emu
def test_emulated_sme2_status_json_reports_sme2(sme2_emulator):
    done = _farm("emulator", "status", "--json", env=sme2_emulator.env)
    assert done.returncode == 0, done.stderr
    st = json.loads(done.stdout)
    assert st["sme2"] is True and st["uses"] == "installed"
    assert st["emulator"] == f"qemu-aarch64 {sme2_emulator.cpu.version} -cpu max (user mode)"
    inst = st["installed"]
    assert inst["path"] == str(sme2_emulator.path) and inst["sha256_verified"] is True
    assert inst["sha256"] == inst["manifest"]["sha256"]
    # Probed now, not copied from the manifest: the emulated CPU's HWCAP2 has bit 37.
    assert inst["cpu"]["sme2"] is True and inst["cpu"]["hwcap2"] == f"{sme2_emulator.cpu.hwcap2:#x}"
    assert st["system"]["path"] == shutil.which("qemu-aarch64") and "hwcap2" in st["system"]["cpu"]

    text = _farm("emulator", "status", env=sme2_emulator.env)
    assert text.returncode == 0
    assert f"installed: {sme2_emulator.path}" in text.stdout and "sha256 verified" in text.stdout
    assert "emulated devices use: installed" in text.stdout and "SME2 yes" in text.stdout


def test_emulator_status_without_an_install_falls_back_to_the_system_qemu(tmp_path):
    done = _farm("emulator", "status", "--json", env={"SME2_EMULATOR_DIR": str(tmp_path)})
    st = json.loads(done.stdout)
    assert st["installed"] is None and st["uses"] == "system"
    # Debian 12's qemu 7.2: SME without SME2, so the farm's emulated devices would have no SME2.
    assert st["sme2"] is False and done.returncode == 1
    text = _farm("emulator", "status", env={"SME2_EMULATOR_DIR": str(tmp_path)})
    assert "installed: none (`sme2-farm emulator install`)" in text.stdout and text.returncode == 1


def test_emulator_install_without_apt_get_says_how_to_install_by_hand(tmp_path):
    cache = tmp_path / "cache"
    done = _farm("emulator", "install", env={"SME2_EMULATOR_DIR": str(cache), "PATH": str(tmp_path)})
    assert done.returncode == 1
    assert "apt-get is not on PATH" in done.stderr
    _manual_steps_in(done.stderr, cache)
    assert not (cache / "qemu-aarch64").exists()


@pytest.mark.sme2emu
def _qemu_without_sme2() -> str:
    """A qemu-aarch64 on PATH whose -cpu max has no SME2 (Debian 12's 7.2), wherever the SME2 one
    sits on PATH (helpers put it first)."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        q = Path(d or ".") / "qemu-aarch64"
        if q.is_file() and os.access(q, os.X_OK):
            try:
                if not emulator.probe(str(q)).sme2:
                    return str(q)
            except emulator.EmulatorError:
                continue
    pytest.skip("no qemu-aarch64 without SME2 on PATH")


@pytest.mark.sme2emu
def test_emulated_sme2_install_records_a_binary_copied_in_by_hand(tmp_path, sme2_emulator):
    """The manual steps end with copying qemu-aarch64 into the cache: install then checks its CPU
    and records it, with no apt at all (PATH holds no apt-get here)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copy(sme2_emulator.path, cache / "qemu-aarch64")
    before = _farm("emulator", "status", env={"SME2_EMULATOR_DIR": str(cache)})
    assert "without a manifest: not used until `sme2-farm emulator install`" in before.stdout
    assert "emulated devices use: system" in before.stdout
    done = _farm("emulator", "install", env={"SME2_EMULATOR_DIR": str(cache), "PATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["suite"] == "by hand" and manifest["deb"] is None and manifest["sme2"] is True
    assert sme2_emulator.cpu.version in manifest["package_version"]
    assert emulator.installed(cache) == cache / "qemu-aarch64"
    # A copied emulator without SME2 (the system's) is not recorded: install goes to apt for one.
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(_qemu_without_sme2(), other / "qemu-aarch64")
    done = _farm("emulator", "install", env={"SME2_EMULATOR_DIR": str(other), "PATH": str(tmp_path)})
    assert done.returncode == 1 and "apt-get is not on PATH" in done.stderr
    assert not (other / "manifest.json").exists()


def _apt_dir(root: Path, sources: str) -> Path:
    (root / "sources.list.d").mkdir(parents=True)
    (root / "sources.list.d" / "debian.sources").write_text(sources)
    return root


def test_emulator_install_with_an_unreachable_mirror_fails_with_the_manual_steps(tmp_path):
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keyring = emulator.apt_mirrors()[0].signed_by
    apt = _apt_dir(tmp_path / "apt", f"Types: deb\nURIs: http://127.0.0.1:{port}/debian\nSuites: bookworm\n"
                                     f"Components: main\nSigned-By: {keyring}\n")
    cache = tmp_path / "cache"
    with pytest.raises(emulator.EmulatorError) as e:
        emulator.install(cache, apt_dir=apt)
    msg = str(e.value)
    for suite in emulator.SUITES:
        assert f"{suite}: apt-get update: " in msg and f"apt-get download qemu-user/{suite}: " in msg
    assert f"Could not connect to 127.0.0.1:{port}" in msg
    _manual_steps_in(msg, cache)
    assert not (cache / "manifest.json").exists() and not (cache / "qemu-aarch64").exists()


@pytest.mark.sme2emu
def test_emulated_sme2_install_gets_past_an_unreachable_mirror_beside_a_working_one(tmp_path, sme2_emulator):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    real = emulator.apt_mirrors()[0]   # the machine's own mirror, as its apt configuration names it
    apt = _apt_dir(tmp_path / "apt", f"Types: deb\nURIs: http://127.0.0.1:{port}/debian {real.uri}\n"
                                     f"Suites: bookworm\nComponents: main\nSigned-By: {real.signed_by}\n")
    manifest, new = emulator.install(tmp_path / "cache", apt_dir=apt)
    assert new and manifest["sha256"] == emulator.sha256_file(sme2_emulator.path)


def test_emulator_install_without_a_mirror_in_the_apt_configuration(tmp_path):
    apt = _apt_dir(tmp_path / "apt", "Types: deb\nURIs: http://example.invalid/debian-security\n"
                                     "Suites: bookworm-security\nComponents: main\n")
    with pytest.raises(emulator.EmulatorError, match="no Debian mirror in") as e:
        emulator.install(tmp_path / "cache", apt_dir=apt)
    _manual_steps_in(str(e.value), tmp_path / "cache")


def test_emulator_install_into_an_unwritable_cache_names_the_variable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(emulator.EmulatorError, match="cannot write the emulator cache .*SME2_EMULATOR_DIR"):
        emulator.install(blocker / "cache")


def test_apt_mirrors_reads_deb822_and_one_line_sources_and_skips_the_security_archive(tmp_path):
    apt = _apt_dir(tmp_path / "apt", (
        "Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/a.gpg\n\n"
        "# the security archive holds no backports\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
        "Types: deb\nURIs: http://inline.example/debian\nSuites: bookworm\nComponents: main\n"
        "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n AAAA\n -----END PGP PUBLIC KEY BLOCK-----\n"))
    (apt / "sources.list").write_text(
        "deb [arch=amd64 signed-by=/usr/share/keyrings/b.gpg] http://one.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n# deb http://commented.example/debian bookworm main\n"
        "deb http://plain.example/debian bookworm main\n")
    mirrors = emulator.apt_mirrors(apt)
    assert [(m.uri, m.signed_by) for m in mirrors] == [
        ("http://mirror.example/debian", "/usr/share/keyrings/a.gpg"),
        ("http://inline.example/debian",
         "\n-----BEGIN PGP PUBLIC KEY BLOCK-----\n.\nAAAA\n-----END PGP PUBLIC KEY BLOCK-----"),
        ("http://one.example/debian", "/usr/share/keyrings/b.gpg"),
        ("http://plain.example/debian", None),
    ]
    # Written back as deb822 for the private apt run, the inline key keeps its continuation lines.
    text = emulator._sources_file(mirrors[1:2], "trixie-backports")
    assert text == ("Types: deb\nURIs: http://inline.example/debian\nSuites: trixie-backports\nComponents: main\n"
                    "Signed-By: \n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n AAAA\n"
                    " -----END PGP PUBLIC KEY BLOCK-----\n")


def test_cpuinfo_feature_names_follow_the_kernels_hwcap_bits():
    cpu = emulator.CpuProbe(qemu="q", version="0", cpu="max", hwcap=(1 << 0) | (1 << 1) | (1 << 32),
                            hwcap2=(1 << 23) | (1 << 37) | (1 << 63))
    assert cpu.features() == ["fp", "asimd", "gcs", "sme", "sme2", "poe"]
    assert cpu.sme2 and not emulator.CpuProbe("q", "0", "max", 0, 1 << 23).sme2


@pytest.mark.sme2emu
def test_emulated_sme2_cpu_features_match_qemus_own_proc_cpuinfo(sme2_emulator, tmp_path):
    """QEMU emulates /proc/cpuinfo for aarch64 guests from the same HWCAPs: an aarch64 program
    that prints it gives the Features line the loopback phone is built from (QEMU's own table has
    holes, printed "(null)": any name of ours is accepted there)."""
    gcc = shutil.which("aarch64-linux-gnu-gcc") or shutil.which("aarch64-linux-gnu-g++")
    assert gcc, "the aarch64 cross compiler (Debian: g++-aarch64-linux-gnu, in .ci/apt-packages.txt) is missing"
    src = tmp_path / "cat.c"
    src.write_text('#include <stdio.h>\nint main(void){FILE*f=fopen("/proc/cpuinfo","r");int c;'
                   'if(!f)return 1;while((c=fgetc(f))!=EOF)putchar(c);return 0;}\n')
    subprocess.run([gcc, "-x", "c", "-O1", "-o", str(tmp_path / "cat"), str(src)], check=True, timeout=120)
    out = subprocess.run([str(sme2_emulator.path), "-cpu", "max", "-L", str(emulator.SYSROOT), str(tmp_path / "cat")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    theirs = next(ln for ln in out.splitlines() if ln.startswith("Features")).partition(":")[2].split()
    ours = sme2_emulator.cpu.features()
    assert len(theirs) == len(ours) and "sme2" in ours
    assert all(t in (o, "(null)") for t, o in zip(theirs, ours)), list(zip(theirs, ours))
