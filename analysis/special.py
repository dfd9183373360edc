"""Special functions and quantiles, numpy/math only (no scipy in the light core): the
regularized incomplete beta and gamma functions, and the quantiles of the normal, Student t and
chi-square distributions that the verdict (verdict.py), the noise model (noise.py) and the
regression detector (regression.py) use.
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["betainc", "gammainc", "norm_quantile", "t_quantile", "t_critical", "t_two_sided_p", "chi2_quantile"]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    bt = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return bt * _betacf(a, b, x) / a
    return 1.0 - bt * _betacf(b, a, 1.0 - x) / b


def gammainc(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x)."""
    if x <= 0.0:
        return 0.0
    lg = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = s = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            s += term
            if abs(term) < abs(s) * 1e-16:
                break
        return s * math.exp(lg)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-16:
            break
    return 1.0 - math.exp(lg) * h


def _bisect(f, lo: float, hi: float) -> float:
    """Root of increasing f on [lo, hi] (hi grown until f(hi) >= 0)."""
    while f(hi) < 0:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-11 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@lru_cache(maxsize=4096)
def norm_quantile(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -norm_quantile(1.0 - p)
    return _bisect(lambda z: 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0)) - p, 0.0, 8.0)


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Quantile p of Student's t with df (> 0, may be fractional or inf) degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if not df > 0:
        raise ValueError("df must be > 0")
    if math.isinf(df) or df > 1e7:
        return norm_quantile(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if df >= 30:
        # Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5): within 1e-6 of the exact
        # quantile from 30 df on, and free (the exact inversion below costs ~1 ms)
        z = norm_quantile(p)
        z2 = z * z
        return (z + z * (z2 + 1) / (4 * df) + z * ((5 * z2 + 16) * z2 + 3) / (96 * df ** 2)
                + z * (((3 * z2 + 19) * z2 + 17) * z2 - 15) / (384 * df ** 3)
                + z * ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) / (92160 * df ** 4))
    # P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2
    return _bisect(lambda t: (1.0 - 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))) - p, 0.0, 16.0)


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with df degrees of freedom (normal from 1000 on)."""
    t = abs(t)
    if df >= 1000:
        return math.erfc(t / math.sqrt(2))
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_critical(p: float, df: float) -> float:
    """The t whose two-sided p-value is p (t_two_sided_p's inverse; df capped at 1e6)."""
    return t_quantile(1.0 - p / 2.0, min(df, 1e6))


@lru_cache(maxsize=4096)
def chi2_quantile(p: float, df: float) -> float:
    """Quantile p of the chi-square distribution with df degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if not df > 0:
        raise ValueError("df must be > 0")
    return _bisect(lambda x: gammainc(df / 2.0, x / 2.0) - p, 0.0, max(2.0 * df, 4.0))
