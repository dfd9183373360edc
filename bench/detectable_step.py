"""Is `suite show`'s "detectable step" (services/suites.detectable_step) honest? On simulated
flat series of 12 nights (between-night sigma 2, 5, 10%; 40 iterations a night, CV 0.5%), the
estimate is computed from each series' own history (no learned noise model, as a new device
has), then a step of 0.5x, 1x and 1.5x that estimate is added on two more nights and
analysis/regression.detect is asked whether it confirmed a change at the step's night.
An honest estimate is confirmed about half the time at 1x, rarely at 0.5x, mostly at 1.5x.

    .venv/bin/python bench/detectable_step.py            # ~10 s
    .venv/bin/python bench/detectable_step.py --series 300
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from sme2farm.analysis import regression as R
from sme2farm.server.services.suites import detectable_step_levels


def _night(rng, level: float) -> R.Point:
    return R.Point(samples=(10.0 * math.exp(level) * np.exp(rng.normal(0, 0.005, 40))).tolist())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-effect", type=float, default=0.03)
    ap.add_argument("--alpha", type=float, default=0.0005)
    a = ap.parse_args(argv)
    params = R.DetectorParams(min_effect=a.min_effect, alpha=a.alpha, flag_alpha=max(0.05, a.alpha))
    rng = np.random.default_rng(a.seed)
    for sigma in (0.02, 0.05, 0.10):
        ests, hits = [], {0.5: 0, 1.0: 0, 1.5: 0}
        for _ in range(a.series):
            pts = [_night(rng, v) for v in rng.normal(0, sigma, 12)]
            lv, _ = R.levels(pts, params)
            step = math.log1p(detectable_step_levels(lv, prior=None, params=params)["step"])
            ests.append(math.expm1(step))
            for m in hits:
                after = [_night(rng, m * step + rng.normal(0, sigma)) for _ in range(2)]
                det = R.detect(pts + after, params=params)
                hits[m] += any(c.status == R.CONFIRMED and c.index == 12 for c in det.changes)
        print(f"sigma {sigma:.0%}: median estimate {np.median(ests):.1%}; confirmed within two nights at "
              + ", ".join(f"{m:g}x: {hits[m] / a.series:.0%}" for m in hits))


if __name__ == "__main__":
    main()
