"""sme2farm.analysis: ETDump bytes in, numbers out.

Pure package (numpy only: no torch, pandas or executorch), imported by the laptop client and
by the worker. Public API:

- :func:`analyze` (ETDump bytes -> JSON report; with an ETRecord, :func:`read_etrecord`, and the
  .pte, operators traced to modules: attribution.py), :func:`check_against_program`, :func:`compare` (two reports -> speedup, CI,
  verdict, narrative), :class:`EtdumpError`;
- :func:`verdict` (calibrated verdict on two arms of sessions) and :class:`NoiseModel` (a
  device's between-session noise, learned from A/A runs; JSON);
- renderers :func:`to_markdown`, :func:`to_csv`, :func:`to_terminal` (render_text.py) and
  :func:`to_perfetto` (perfetto.py); the sentences they share with the client live in wording.py;
- :func:`parse_kernel_log`, :func:`read_etdump` (the raw event arrays), :func:`category_of`;
- :func:`kernel_path` (an XNNPACK operator name -> SME2 / NEON / portable ...), :func:`arch_of`
  (runner platform -> arm64 / x86_64), :func:`coverage_sentence` (a run's SME2 coverage in words).
"""

from .categories import CATEGORIES, category_of
from .compare import compare, compare_emulated
from .etdump import EtdumpError, Events, read_etdump
from .etrecord import Etrecord, EtrecordError, check_against_program, read_etrecord
from .kernel_paths import arch_of, coverage_sentence, kernel_path
from .kernels import classify_kernel, parse_kernel_log
from .perfetto import to_perfetto
from .render_text import to_csv, to_markdown, to_terminal
from .report import analyze
from .stats import bootstrap_ratio, latency_stats
from .noise import NoiseModel
from .verdict import Verdict, verdict

__all__ = [
    "analyze", "compare", "compare_emulated", "EtdumpError", "to_markdown", "to_csv", "to_perfetto", "to_terminal",
    "parse_kernel_log", "classify_kernel", "read_etdump", "Events", "category_of", "CATEGORIES",
    "latency_stats", "bootstrap_ratio", "verdict", "Verdict", "NoiseModel", "kernel_path", "arch_of",
    "coverage_sentence", "read_etrecord", "check_against_program", "Etrecord", "EtrecordError",
]
