"""Numerics: how two runs' outputs differ (SME2 off vs on, model A vs B), per output, in numbers and
in words. numpy only; the farm decodes the runner's outputs file (runners/inputs.py) and hands the
values in as (dtype name, array) pairs.

A value is ``(dtype, array)`` or None (an output the runner's container cannot carry):
- dtype is ExecuTorch's scalar type name ("Float", "Half", "BFloat16", "Char", "Byte", "Short",
  "Int", "Long", "Double", "Bool") for a tensor, or "int" / "double" / "bool" for a scalar output;
- a BFloat16 array holds the uint16 bit patterns (numpy has no bfloat16).

Per output:
- ``max_abs``: the largest |baseline - candidate| over elements that are finite in both.
- ``max_rel``: ``max_abs / max(|baseline|)``, the error relative to the output's peak magnitude.
  Not elementwise: an element near zero (a ReLU's output, a logit that happens to be tiny) makes an
  elementwise ratio explode for a difference that is a rounding step, and an epsilon floor would
  only move that problem to a made-up scale. The peak is the scale the output's own rounding works
  at, so this reads as "how many of the output's ulps at its largest value". None when the baseline
  is all zero and the candidate is not.
- ``snr_db``: ``10*log10(sum(b^2) / sum((b-c)^2))`` over finite elements; None when the outputs are
  identical (infinite SNR: ``identical`` says so) or when the baseline is all zero.
- NaN/inf: equal where both sides hold the same non-finite value; elsewhere they count in
  ``nonfinite_mismatch``, and any such element puts the output outside its tolerance.

Tolerances (``TOLERANCES``), in units of the dtype's own precision so they say what they mean:
- Float (fp32): max_abs <= 2^-13 x peak, i.e. 1024 fp32 ulps at the peak. Two arms reorder the
  accumulation (SME2 outer products vs NEON dot products, other blockings) and round differently
  through several layers: sums of K terms reorder to errors of order sqrt(K)..K ulps. 2^-13
  (1.2e-4) admits that for K in the thousands and still flags any real arithmetic change (a
  different accumulation type, a dropped term) well before it reaches 0.1%.
- Double: 2^-42 x peak, the same 1024 ulps.
- Half (fp16): 2 ulps at the peak, 2^-9 x peak (~2e-3). The stored output is rounded to 11 bits,
  so equal arithmetic with a different order may land one step apart, two at a rounding boundary
  crossed twice; more than that means the arithmetic differs, e.g. an fp32 accumulator (SME2's
  fp16 kernels) in place of an fp16 one (NEON's): the change a user of an fp16 model must hear of.
- BFloat16: 2 ulps at the peak, 2^-6 x peak (8-bit significand), for the same reason.
- Char, Byte, Short (int8/uint8/int16: quantized outputs): +-1 LSB. The SME2 (PQS8) and NEON (QS8)
  paths requantize the int32 accumulator with different rounding implementations, so values on a
  half step may land one code apart; two codes means different arithmetic.
- Int, Long and integer/bool scalars, Bool: exact. These are indices, counts and masks; a different
  index is a different answer, not a rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .types import Section

Value = Optional[tuple[str, np.ndarray]]


@dataclass(frozen=True)
class Tolerance:
    kind: str          # "relative to peak" | "absolute"
    limit: float       # max_abs allowed: limit x peak (relative) or limit (absolute)
    describe: str      # in words, for sentences

    def allowed(self, peak: float) -> float:
        return self.limit * peak if self.kind == "relative to peak" else self.limit


_EXACT = Tolerance("absolute", 0.0, "exact")
TOLERANCES: dict[str, Tolerance] = {
    "Float": Tolerance("relative to peak", 2.0 ** -13, "fp32 tolerance (max abs 1024 ulp of the peak, 2^-13 x peak)"),
    "Double": Tolerance("relative to peak", 2.0 ** -42, "fp64 tolerance (max abs 1024 ulp of the peak, 2^-42 x peak)"),
    "Half": Tolerance("relative to peak", 2.0 ** -9, "fp16 tolerance (max abs 2 ulp of the peak, 2^-9 x peak)"),
    "BFloat16": Tolerance("relative to peak", 2.0 ** -6, "bf16 tolerance (max abs 2 ulp of the peak, 2^-6 x peak)"),
    "Char": Tolerance("absolute", 1.0, "int8 tolerance (+-1 LSB)"),
    "Byte": Tolerance("absolute", 1.0, "uint8 tolerance (+-1 LSB)"),
    "Short": Tolerance("absolute", 1.0, "int16 tolerance (+-1 LSB)"),
    "Int": _EXACT, "Long": _EXACT, "Bool": _EXACT, "int": _EXACT, "bool": _EXACT,
    "double": Tolerance("relative to peak", 2.0 ** -42, "fp64 tolerance (max abs 1024 ulp of the peak, 2^-42 x peak)"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedTolerance(Section):
    """A Tolerance with what it allows for one output (limit x its peak, or the limit)."""

    kind: str
    limit: float
    describe: str
    max_abs_allowed: float


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputDiff(Section):
    """One output compared (the module docstring defines each figure)."""

    index: int
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float | None
    snr_db: float | None
    identical: bool
    nonfinite_mismatch: int
    peak: float
    within_tolerance: bool
    tolerance: AppliedTolerance


def as_float(dtype: str, array) -> np.ndarray:
    """The values as float64 (BFloat16 from its uint16 bit patterns)."""
    a = np.asarray(array)
    if dtype == "BFloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def not_compared(status: str, sentence: str) -> dict:
    """The numerics answer when no comparison could be made ("not recorded", "mismatch", "too large")."""
    return {"status": status, "sentence": sentence, "verdict": None, "outputs": []}


def _shape(dtype: str, shape: Sequence[int]) -> str:
    return f"{dtype} [{', '.join(str(int(s)) for s in shape)}]"


def _two_digits(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2g}"


def _db(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} dB"


def compare(base: Sequence[Value], cand: Sequence[Value], labels: tuple[str, str] = ("baseline", "candidate")) -> dict:
    """Compare the candidate's outputs with the baseline's. labels = (baseline's, candidate's), e.g.
    ("SME2 off", "SME2 on") or ("model A", "model B"); they name the sides in the sentence."""
    lb, lc = labels
    if len(base) != len(cand):
        return not_compared("mismatch", f"not comparable: {lb} has {len(base)} output(s), {lc} has {len(cand)}")
    outputs, skipped = [], []
    for i, (b, c) in enumerate(zip(base, cand)):
        if b is None and c is None:
            skipped.append(i)  # neither side's container could carry it (a list output, say)
            continue
        if b is None or c is None:
            missing = lb if b is None else lc
            return not_compared("mismatch", f"not comparable: output {i} is not recorded for {missing}")
        (bt, ba), (ct, ca) = b, c
        ba, ca = np.asarray(ba), np.asarray(ca)
        if bt != ct or ba.shape != ca.shape:
            return not_compared("mismatch", f"not comparable: output {i} is {_shape(bt, ba.shape)} for {lb}, "
                                            f"{_shape(ct, ca.shape)} for {lc}")
        outputs.append(_one(i, bt, ba, ca))
    if not outputs:
        return not_compared("mismatch", "not comparable: no output could be recorded"
                            + (f" (outputs {', '.join(map(str, skipped))} are neither tensors nor scalars)" if skipped else ""))
    changed = [o for o in outputs if not o.within_tolerance]
    sentence = _sentence(outputs, changed, lb, lc)
    if skipped:
        sentence += f" Output(s) {', '.join(map(str, skipped))} could not be recorded and are not compared."
    return {"status": "compared", "verdict": "numerics change" if changed else "same within tolerance",
            "sentence": sentence, "outputs": [o.to_dict() for o in outputs]}


def _one(index: int, dtype: str, b: np.ndarray, c: np.ndarray) -> OutputDiff:
    tol = TOLERANCES.get(dtype, _EXACT)
    bf, cf = as_float(dtype, b), as_float(dtype, c)
    fb, fc = np.isfinite(bf), np.isfinite(cf)
    both = fb & fc
    # Non-finite elements agree only when both sides hold the same value (NaN with NaN, +inf with +inf).
    same_nonfinite = ~fb & ~fc & ((np.isnan(bf) & np.isnan(cf)) | (bf == cf))
    nonfinite_mismatch = int(np.count_nonzero(~both & ~same_nonfinite))
    d = np.abs(bf[both] - cf[both])
    max_abs = float(d.max()) if d.size else 0.0
    peak = float(np.abs(bf[both]).max()) if d.size else 0.0
    if b.dtype.kind in "iu" and b.dtype.itemsize == 8:
        # float64 holds integers exactly only up to 2**53: 64-bit ones are differenced as Python ints
        differ = b != c
        max_abs = float(max((abs(x - y) for x, y in zip(b[differ].tolist(), c[differ].tolist())), default=0))
    max_rel = max_abs / peak if peak > 0 else (0.0 if max_abs == 0 else None)
    signal, noise = float(np.sum(bf[both] ** 2)), float(np.sum(d ** 2))
    identical = nonfinite_mismatch == 0 and noise == 0.0 and max_abs == 0.0
    snr = 10 * math.log10(signal / noise) if noise > 0 and signal > 0 else None
    allowed = tol.allowed(peak)
    within = nonfinite_mismatch == 0 and max_abs <= allowed
    return OutputDiff(index=index, dtype=dtype, shape=[int(s) for s in b.shape], max_abs=max_abs, max_rel=max_rel,
                      snr_db=snr, identical=identical, nonfinite_mismatch=nonfinite_mismatch, peak=peak,
                      within_tolerance=bool(within),
                      tolerance=AppliedTolerance(kind=tol.kind, limit=tol.limit, describe=tol.describe,
                                                 max_abs_allowed=allowed))


def _describe(o: OutputDiff) -> str:
    parts = [f"max abs {_two_digits(o.max_abs)}"]
    if o.max_rel is not None and o.tolerance.kind == "relative to peak":
        parts.append(f"max rel {_two_digits(o.max_rel)} of the peak {_two_digits(o.peak)}")
    if o.snr_db is not None:
        parts.append(f"SNR {_db(o.snr_db)}")
    if o.nonfinite_mismatch:
        parts.append(f"{o.nonfinite_mismatch} NaN/inf element(s) differ")
    return ", ".join(parts)


def _sentence(outputs: list[OutputDiff], changed: list[OutputDiff], lb: str, lc: str) -> str:
    n = len(outputs)
    if changed:
        heads = []
        for o in changed:
            heads.append(f"output {o.index} ({_shape(o.dtype, o.shape)}): {_describe(o)}, beyond the "
                         f"{o.tolerance.describe}" + (f" = {_two_digits(o.tolerance.max_abs_allowed)}"
                                                      if o.tolerance.kind == "relative to peak" else ""))
        rest = n - len(changed)
        tail = f"; the other {rest} output(s) are within tolerance" if rest else ""
        return f"{lc} changes {'; '.join(heads)}{tail}."
    if all(o.identical for o in outputs):
        return f"{lb} and {lc} give bit-identical outputs ({n} output{'s' if n != 1 else ''})."
    worst = max(outputs, key=lambda o: (o.max_rel if o.max_rel is not None else o.max_abs))
    # not "matches": the outputs differ, by less than the dtype's tolerance
    return (f"{lc} differs from {lb} within tolerance on {'all ' if n > 1 else ''}{n} output{'s' if n != 1 else ''} "
            f"(largest difference: output {worst.index} ({_shape(worst.dtype, worst.shape)}): "
            f"{_describe(worst)}; {worst.tolerance.describe}).")
