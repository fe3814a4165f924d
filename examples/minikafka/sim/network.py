"""Simulated network delays."""

from __future__ import annotations

import random


class Latency:
    """A one-way delay: a fixed floor of half the mean plus an exponential tail.

    Called once per message; draws from the simulation's single random stream,
    so a seeded run sees the same delays in the same order.
    """

    __slots__ = ("_floor", "_rng", "_tail_rate", "mean")

    def __init__(self, rng: random.Random, mean: float) -> None:
        self._rng = rng
        self.mean = mean
        self._floor = mean / 2
        self._tail_rate = 2 / mean if mean > 0 else 0.0

    def __call__(self) -> float:
        if self._tail_rate == 0.0:
            return 0.0
        return round(self._floor + self._rng.expovariate(self._tail_rate), 6)
