"""What every part of the scale bench shares: the interpreter, the run states, the simulated
runners, small helpers.
"""

from __future__ import annotations

import socket
import sys

PY = sys.executable
TERMINAL = ("succeeded", "failed", "cancelled", "unschedulable")  # the run states nothing leaves
SIM_TAG = "scale-sim"  # experiments select the simulated devices by this tag
RUNNERS = [  # what a simulated phone's agent holds: the Android bundle, both arms
    {"id": "sim-android-sme2on-timing", "platform": "android-arm64-v9a", "sme2": "on", "flavour": "timing",
     "executorch_version": "1.5.1", "sha256": "0" * 64, "origin": "wheel-cross"},
    {"id": "sim-android-sme2off-timing", "platform": "android-arm64-v9a", "sme2": "off", "flavour": "timing",
     "executorch_version": "1.5.1", "sha256": "0" * 64, "origin": "wheel-cross"},
]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def ms(v: float) -> str:
    return f"{v * 1000:.1f} ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
