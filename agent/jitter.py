"""Jitter for every agent interval, so a lab's agents do not call the farm in step (after an
outage they would all reconnect together, then heartbeat, sync and claim together for hours).

- A periodic interval (heartbeat, device sync, the claim long-poll's wait) is drawn from
  [(1 - JITTER) x interval, interval]: never longer than set, so a heartbeat still beats within
  its lease and a sync is never late.
- A retry's wait is the doubling delay times [0.5, 1.5], never past the cap: the cap is the
  longest an agent stays away from a farm that is back (docs/operations.md, "Outages and bounds").
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sme2farm.agent.config import BACKOFF_CAP_S, JITTER

FIRST_DELAY_S = 0.2


def jittered(interval: float, *, jitter: float = JITTER, rand: Callable[[], float] = random.random) -> float:
    """interval shortened by up to `jitter` of itself, at random."""
    return max(0.0, interval * (1.0 - jitter * rand()))


class Backoff:
    """The waits between tries: FIRST_DELAY_S doubling, each drawn from [0.5, 1.5] x the delay
    and capped at `cap` (SME2_AGENT_BACKOFF_CAP_S)."""

    def __init__(self, cap: float = BACKOFF_CAP_S, *, first: float = FIRST_DELAY_S,
                 rand: Callable[[], float] = random.random):
        self.cap, self.first, self.rand = cap, min(first, cap), rand
        self.delay = self.first

    def next(self, at_least: float = 0.0) -> float:
        """The next wait; `at_least` (a server's Retry-After) is honoured up to the cap."""
        wait = min(self.cap, max(self.delay * (0.5 + self.rand()), min(at_least, self.cap)))
        self.delay = min(self.delay * 2, self.cap)
        return wait

    def reset(self) -> None:
        self.delay = self.first
