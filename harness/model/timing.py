"""Timing on the CPU: warm-up, adaptive repeats, median and spread.

``perf_counter`` around each call of ``run``; the number of repeats grows until the timed
calls add up to ``min_time`` seconds (at least ``min_repeats``, at most ``max_repeats``), so
a 10-microsecond product and a 10-second one are both measured sensibly. The median is the
reported time: it ignores the occasional run slowed by another process. The spread is the
interquartile range relative to the median.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

# Before timing on more than one thread of a machine with as many cores as threads: a pause,
# so that the previous library's idle workers no longer hold a core. OpenBLAS's spin for about
# 2**28 cycles (0.1 s) after a call before they sleep, c.packed's for 5 ms (compare and
# blas-grid wait this long).
SETTLE_SECONDS = 0.15


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    spread: float  # (75th - 25th percentile) / median
    repeats: int

    @classmethod
    def from_samples(cls, samples: list[float]) -> "Timing":
        median = statistics.median(samples)
        if len(samples) >= 4:
            quartiles = statistics.quantiles(samples, n=4)
            spread = (quartiles[2] - quartiles[0]) / median if median > 0 else 0.0
        else:
            spread = (max(samples) - min(samples)) / median if median > 0 else 0.0
        return cls(median, min(samples), max(samples), spread, len(samples))

    def as_dict(self) -> dict:
        return {
            "median_s": self.median_s,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "spread": self.spread,
            "repeats": self.repeats,
        }


def time_cpu(run, min_time: float = 0.2, min_repeats: int = 3, max_repeats: int = 1000, warmup: int = 1) -> Timing:
    for _ in range(warmup):
        run()
    samples: list[float] = []
    total = 0.0
    while len(samples) < min_repeats or (total < min_time and len(samples) < max_repeats):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        samples.append(elapsed)
        total += elapsed
    return Timing.from_samples(samples)


def seconds_per_call(call, sample_time: float) -> float:
    """Seconds per call: one call to size a batch, then a batch long enough to be timed at
    ``sample_time``, the batch's mean (one sample of an interleaved round: blas-grid, ab)."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    batch = max(1, int(sample_time / max(first, 1e-7)))
    start = time.perf_counter()
    for _ in range(batch):
        call()
    return (time.perf_counter() - start) / batch


def round_order(count: int, round_index: int) -> list[int]:
    """The order of ``count`` things timed in turn in round ``round_index``: the first round in
    order, the second reversed, then rotated by one every two rounds (and reversed every other
    round), so that none is always timed right after the same one (a cache another left warm,
    a core's clock another raised)."""
    order = [(index + round_index // 2) % count for index in range(count)]
    return order[::-1] if round_index % 2 else order


def interleaved_samples(calls: dict, rounds: int, sample_time: float, after_sample=None) -> dict[str, list[float]]:
    """``rounds`` rounds, each a ``seconds_per_call`` sample of every call in turn (in
    ``round_order``), so that a drift in the machine's speed hits them all alike: the samples
    by name. ``after_sample(name)``, if given, runs after each sample, outside it."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        for index in round_order(len(names), round_index):
            samples[names[index]].append(seconds_per_call(calls[names[index]], sample_time))
            if after_sample is not None:
                after_sample(names[index])
    return samples
