"""analysis/numerics.py: how two runs' outputs differ (max abs / rel error, SNR, per-dtype tolerance,
the verdict in words), and `sme2-client analyze --outputs A.bin B.bin` over real container files."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from sme2farm.analysis import numerics
from sme2farm.runners import inputs as containers
from sme2farm.runners.inputs import TensorInput

LABELS = ("SME2 off", "SME2 on")


def half(seed: int = 0, shape=(1, 10)) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float16)


def ulp16(x: float) -> float:
    return float(np.spacing(np.float16(x)))


def test_identical_outputs_are_bit_identical_with_no_snr():
    a = half()
    r = numerics.compare([("Half", a)], [("Half", a.copy())], LABELS)
    [o] = r["outputs"]
    assert r["status"] == "compared" and r["verdict"] == "same within tolerance"
    assert o["identical"] and o["snr_db"] is None and o["max_abs"] == 0 and o["max_rel"] == 0
    assert r["sentence"] == "SME2 off and SME2 on give bit-identical outputs (1 output)."
    json.dumps(r, allow_nan=False)  # the answer goes into JSON columns and responses as it is


def test_fp16_difference_beyond_two_ulps_of_the_peak_is_a_numerics_change():
    a = half()
    peak_at = int(np.argmax(np.abs(a)))
    b = a.copy()
    # 4 ulps at the peak, on the element holding the peak: twice the fp16 tolerance
    b.flat[peak_at] = np.float16(float(a.flat[peak_at]) + 4 * np.sign(a.flat[peak_at]) * ulp16(a.flat[peak_at]))
    r = numerics.compare([("Half", a)], [("Half", b)], LABELS)
    [o] = r["outputs"]
    assert r["verdict"] == "numerics change" and not o["within_tolerance"]
    diff = abs(float(b.flat[peak_at]) - float(a.flat[peak_at]))
    assert o["max_abs"] == pytest.approx(diff)
    assert o["max_rel"] == pytest.approx(diff / float(np.abs(a).max()))
    signal = float(np.sum(a.astype(np.float64) ** 2))
    assert o["snr_db"] == pytest.approx(10 * math.log10(signal / diff ** 2))
    assert o["tolerance"]["max_abs_allowed"] == pytest.approx(2.0 ** -9 * float(np.abs(a).max()))
    s = r["sentence"]
    assert s.startswith("SME2 on changes output 0 (Half [1, 10]): max abs ")
    assert "SNR " in s and "dB" in s and "beyond the fp16 tolerance" in s


def test_fp16_one_rounding_step_is_within_tolerance():
    a = half(1)
    b = a.copy()
    i = int(np.argmax(np.abs(a)))
    b.flat[i] = np.nextafter(a.flat[i], np.float16(np.inf))
    r = numerics.compare([("Half", a)], [("Half", b)], LABELS)
    assert r["verdict"] == "same within tolerance" and r["outputs"][0]["within_tolerance"]
    assert r["outputs"][0]["snr_db"] > 60
    assert r["sentence"].startswith("SME2 on differs from SME2 off within tolerance on 1 output")


def test_fp32_reordered_accumulation_passes_and_a_real_change_does_not():
    rng = np.random.default_rng(2)
    w, x = rng.standard_normal((64, 512)).astype(np.float32), rng.standard_normal(512).astype(np.float32)
    base = (w @ x).astype(np.float32)
    reordered = np.array([np.sum(row[::-1] * x[::-1], dtype=np.float32) for row in w], dtype=np.float32)
    assert not np.array_equal(base, reordered)  # the order changes the rounding
    r = numerics.compare([("Float", base)], [("Float", reordered)], LABELS)
    assert r["verdict"] == "same within tolerance", r["sentence"]
    # the same product accumulated in fp16: the kind of change the tolerance exists to catch
    fp16 = (w.astype(np.float16) @ x.astype(np.float16)).astype(np.float32)
    r = numerics.compare([("Float", base)], [("Float", fp16)], LABELS)
    assert r["verdict"] == "numerics change" and "beyond the fp32 tolerance" in r["sentence"]


def test_max_rel_is_relative_to_the_peak_not_elementwise():
    base = np.array([1.0, 1e-8, -0.5], dtype=np.float32)
    cand = np.array([1.0, 2e-8, -0.5], dtype=np.float32)  # elementwise that is a 100% error
    [o] = numerics.compare([("Float", base)], [("Float", cand)], LABELS)["outputs"]
    assert o["max_rel"] == pytest.approx(1e-8, rel=1e-3) and o["within_tolerance"]


@pytest.mark.parametrize("dtype,np_dtype,step,within", [
    ("Char", np.int8, 1, True), ("Char", np.int8, 2, False), ("Byte", np.uint8, 1, True),
    ("Long", np.int64, 1, False), ("Int", np.int32, 1, False), ("Bool", np.bool_, 1, False),
])
def test_integer_outputs_one_lsb_for_quantized_exact_for_indices(dtype, np_dtype, step, within):
    base = np.array([[3, 7, 1, 0]], dtype=np_dtype)
    cand = base.copy()
    cand[0, 1] = (base[0, 1] + step) if dtype != "Bool" else not base[0, 1]
    r = numerics.compare([(dtype, base)], [(dtype, cand)], LABELS)
    assert r["outputs"][0]["within_tolerance"] is within
    assert r["verdict"] == ("same within tolerance" if within else "numerics change")


def test_64_bit_integers_are_compared_exactly_beyond_float64_precision():
    """2**53 and 2**53 + 1 are one float64: a Long output (an index, a hash) that differs there is
    still a different answer, never 'bit-identical'."""
    base = np.array([2**53, 5], dtype=np.int64)
    cand = np.array([2**53 + 1, 5], dtype=np.int64)
    r = numerics.compare([("Long", base)], [("Long", cand)], LABELS)
    [o] = r["outputs"]
    assert r["verdict"] == "numerics change" and not o["identical"] and not o["within_tolerance"]
    assert o["max_abs"] == 1.0


def test_bfloat16_is_read_from_its_bit_patterns():
    values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert numerics.as_float("BFloat16", bits).tolist() == values.tolist()
    bumped = bits.copy()
    bumped[1] += 4  # 4 bf16 ulps at the peak (-2.5)
    r = numerics.compare([("BFloat16", bits)], [("BFloat16", bumped)], LABELS)
    assert r["verdict"] == "numerics change" and "bf16 tolerance" in r["sentence"]


def test_non_finite_values_agree_only_where_both_sides_hold_them():
    base = np.array([np.nan, np.inf, 1.0], dtype=np.float32)
    same = numerics.compare([("Float", base)], [("Float", base.copy())], LABELS)
    assert same["outputs"][0]["identical"] and same["verdict"] == "same within tolerance"
    moved = numerics.compare([("Float", base)], [("Float", np.array([1.0, np.inf, 1.0], dtype=np.float32))], LABELS)
    o = moved["outputs"][0]
    assert o["nonfinite_mismatch"] == 1 and not o["within_tolerance"]
    assert "1 NaN/inf element(s) differ" in moved["sentence"]


def test_all_zero_baseline_against_a_nonzero_candidate():
    r = numerics.compare([("Float", np.zeros(4, np.float32))], [("Float", np.full(4, 1e-3, np.float32))], LABELS)
    o = r["outputs"][0]
    assert o["max_rel"] is None and o["snr_db"] is None and r["verdict"] == "numerics change"


@pytest.mark.parametrize("cand,reason", [
    ([("Half", half()), ("Half", half())], "not comparable: SME2 off has 1 output(s), SME2 on has 2"),
    ([("Float", half().astype(np.float32))], "not comparable: output 0 is Half [1, 10] for SME2 off, Float [1, 10] for SME2 on"),
    ([("Half", half(shape=(2, 5)))], "not comparable: output 0 is Half [1, 10] for SME2 off, Half [2, 5] for SME2 on"),
    ([None], "not comparable: output 0 is not recorded for SME2 on"),
])
def test_count_dtype_shape_mismatch_is_not_compared(cand, reason):
    r = numerics.compare([("Half", half())], cand, LABELS)
    assert r == {"status": "mismatch", "sentence": reason, "verdict": None, "outputs": []}


def test_scalars_and_uncarried_outputs():
    base = [("int", np.asarray(3)), None, ("double", np.asarray(0.5))]
    r = numerics.compare(base, [("int", np.asarray(3)), None, ("double", np.asarray(0.5))], ("model A", "model B"))
    assert [o["index"] for o in r["outputs"]] == [0, 2] and r["verdict"] == "same within tolerance"
    assert "Output(s) 1 could not be recorded" in r["sentence"]
    r = numerics.compare(base, [("int", np.asarray(4)), None, ("double", np.asarray(0.5))], ("model A", "model B"))
    assert r["verdict"] == "numerics change" and r["sentence"].startswith("model B changes output 0 (int [])")


# ---- sme2-client analyze --outputs --------------------------------------------------------------


def _write(path, arrays):
    path.write_bytes(containers.write([TensorInput.from_numpy(a) for a in arrays]))
    return path


def _analyze(*args):
    return subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "analyze", *args],
                          capture_output=True, text=True, timeout=60)


def test_cli_compares_two_outputs_files(tmp_path):
    a = half(3)
    b = a.copy()
    b[0, 0] = np.float16(float(a[0, 0]) + 0.25)
    base = _write(tmp_path / "off.bin", [a, np.arange(4, dtype=np.int64)])
    cand = _write(tmp_path / "on.bin", [b, np.arange(4, dtype=np.int64)])
    r = _analyze("--outputs", str(base), str(cand), "--labels", "SME2 off", "SME2 on")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("SME2 on changes output 0 (Half [1, 10])")
    assert "the other 1 output(s) are within tolerance" in lines[0]
    assert "output 0: Half [1, 10]" in lines[1] and "BEYOND fp16 tolerance" in lines[1]
    assert "output 1: Long [4]" in lines[2] and "SNR identical" in lines[2]
    js = _analyze("--outputs", str(base), str(cand), "--json")
    doc = json.loads(js.stdout)
    assert doc["verdict"] == "numerics change" and doc["sentence"].startswith("on.bin changes output 0")
    assert [o["within_tolerance"] for o in doc["outputs"]] == [False, True]


def test_cli_names_a_pte_or_etdump_given_as_outputs(tmp_path, example_pte, portable_trace):
    good = _write(tmp_path / "a.bin", [half()])
    r = _analyze("--outputs", str(good), str(example_pte("mlp")))
    assert r.returncode == 2 and "this is a .pte program, not an outputs file" in r.stderr
    r = _analyze("--outputs", str(portable_trace), str(good))
    assert r.returncode == 2 and "this is an ETDump trace, not an outputs file" in r.stderr
    (tmp_path / "short.bin").write_bytes(good.read_bytes()[:-3])
    r = _analyze("--outputs", str(good), str(tmp_path / "short.bin"))
    assert r.returncode == 2 and "truncated outputs container" in r.stderr
    r = _analyze(str(portable_trace), "--outputs", str(good), str(good))
    assert r.returncode == 2 and "give no trace" in r.stderr
    other = _write(tmp_path / "f32.bin", [half().astype(np.float32)])  # valid, but not the same outputs
    r = _analyze("--outputs", str(good), str(other))
    assert r.returncode == 1 and r.stdout.strip(), r.stderr
