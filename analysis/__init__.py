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
- :class:`AnalysisReport` (types.py): the report's shape, the one definition the wire serves;
- :func:`kernel_path` (an XNNPACK operator name -> SME2 / NEON / portable ...), :func:`arch_of`
  (runner platform -> arm64 / x86_64), :func:`coverage_sentence` (a run's SME2 coverage in words).
"""

import importlib
import importlib.util
import sys
import types

# name -> the module that defines it: loaded on first use (PEP 562), so importing
# sme2farm.analysis.types (the report's shape, which sme2farm.protocol serves) loads no numpy.
_WHERE = {
    "CATEGORIES": "categories", "category_of": "categories",
    "compare": "compare", "compare_emulated": "compare",
    "EtdumpError": "etdump", "Events": "etdump", "read_etdump": "etdump",
    "Etrecord": "etrecord", "EtrecordError": "etrecord", "check_against_program": "etrecord",
    "read_etrecord": "etrecord",
    "arch_of": "kernel_paths", "coverage_sentence": "kernel_paths", "kernel_path": "kernel_paths",
    "classify_kernel": "kernels", "parse_kernel_log": "kernels",
    "to_perfetto": "perfetto",
    "to_csv": "render_text", "to_markdown": "render_text", "to_terminal": "render_text",
    "analyze": "report",
    "bootstrap_ratio": "stats", "latency_stats": "stats",
    "NoiseModel": "noise",
    "Verdict": "verdict", "verdict": "verdict",
    "AnalysisReport": "types",
}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a submodule, e.g. analysis.numerics
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """compare and verdict name both a function and the module that defines it: the function wins,
    as when this package imported them eagerly (importing the submodule would set the module)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = list(_WHERE)
