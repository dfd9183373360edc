"""The wire contract (sme2farm.protocol) is light: the agent and the client import it, and neither
needs numpy or the analysis for it, but for the report's and the comparison's definitions
(analysis/types.py, analysis/comparison_types.py, which the wire serves). Its defaults that the analysis also uses are kept equal."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_protocol_loads_the_report_and_comparison_definitions_but_no_analysis_nor_numpy():
    code = ("import json, sys; import sme2farm.protocol; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'numpy' or m.startswith(('numpy.', 'sme2farm.analysis')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["sme2farm.analysis", "sme2farm.analysis.comparison_types", "sme2farm.analysis.types"]


def test_the_verdicts_default_min_effect_is_the_contracts():
    from sme2farm.analysis.verdict import DEFAULT_MIN_EFFECT as VERDICT_DEFAULT
    from sme2farm.protocol import DEFAULT_MIN_EFFECT, ExperimentSpec

    assert VERDICT_DEFAULT == DEFAULT_MIN_EFFECT == ExperimentSpec().min_effect
