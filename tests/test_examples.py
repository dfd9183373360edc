"""Bundled example models: light import, export to a real XNNPACK .pte, CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sme2farm.runners.examples import EXAMPLES, export_example, main

pytestmark = pytest.mark.models


def test_import_does_not_pull_torch():
    # Agents and clients import this module; torch must stay out of their processes.
    code = "import sys, sme2farm.runners.examples as e; print(sorted(e.EXAMPLES), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("['cnn_blocks', 'executorch_llama', 'executorch_llama_static', 'hf_llama', "
                           "'hf_llama_static', 'mlp', 'portable_mix', 'tiny_llama', 'tiny_llama_fp16', 'toy_cnn'] False")


def test_unknown_example_is_rejected(tmp_path):
    with pytest.raises(KeyError, match="toy_cnn"):
        export_example("nope", tmp_path / "x.pte")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_export_writes_a_delegated_program(example_pte, name):
    data = example_pte(name, **({"blocks": 2} if name == "cnn_blocks" else {})).read_bytes()
    assert data[4:8] == b"ET12"            # the .pte flatbuffer identifier
    assert b"XnnpackBackend" in data        # at least one XNNPACK delegate call


def test_cnn_blocks_size_follows_blocks(example_pte):
    assert example_pte("cnn_blocks", blocks=4).stat().st_size > example_pte("cnn_blocks", blocks=2).stat().st_size


def test_cli_exports_and_rejects_blocks_for_other_models(tmp_path, capsys):
    out = tmp_path / "m.pte"
    assert main(["cnn_blocks", str(out), "--blocks", "2"]) == 0
    assert out.read_bytes()[4:8] == b"ET12"
    with pytest.raises(SystemExit):
        main(["mlp", str(tmp_path / "x.pte"), "--blocks", "2"])
    assert "--blocks applies to cnn_blocks only" in capsys.readouterr().err


def test_examples_export_to_identical_bytes(tmp_path):
    """Fixed seed: re-exporting gives the same sha256, so the farm stores a bundled model once."""
    import hashlib

    from sme2farm.runners.examples import export_example

    a = export_example("mlp", tmp_path / "a.pte").read_bytes()
    b = export_example("mlp", tmp_path / "b.pte").read_bytes()
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()
