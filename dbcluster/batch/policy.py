"""Fault-tolerance policies of chunk steps: how long to wait before a retry, and which errors
are skipped."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dbcluster.errors import ConfigurationError

#: ``fn(error, skip_count) -> bool``: whether an item that failed with ``error`` is skipped, given
#: how many the step skipped so far (Spring's ``SkipPolicy.shouldSkip``).
SkipPolicy = Callable[[BaseException, int], bool]


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(frozen=True)
class Backoff:
    """The wait before retry ``n`` (1, 2, ...): ``initial * multiplier ** (n - 1)``, at most
    ``maximum``, then, with ``jitter`` (0..1), a random part of it taken off (0.5: between half
    and all of it), so retries of many partitions do not fall in step.

    ``Backoff.fixed(0.5)``, ``Backoff.exponential(0.1, multiplier=2, maximum=5, jitter=0.5)``.
    """

    initial: float = 0.0
    multiplier: float = 1.0
    maximum: float | None = None
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.initial < 0 or self.multiplier < 1 or not 0 <= self.jitter <= 1:
            raise ConfigurationError(
                f"a backoff needs initial >= 0, multiplier >= 1 and 0 <= jitter <= 1: {self!r}"
            )
        if self.maximum is not None and self.maximum < self.initial:
            raise ConfigurationError(f"a backoff's maximum is below its initial wait: {self!r}")

    @classmethod
    def fixed(cls, delay: float | timedelta, *, jitter: float = 0.0) -> Backoff:
        return cls(_seconds(delay), 1.0, None, jitter)

    @classmethod
    def exponential(
        cls,
        initial: float | timedelta,
        *,
        multiplier: float = 2.0,
        maximum: float | timedelta | None = None,
        jitter: float = 0.0,
    ) -> Backoff:
        return cls(
            _seconds(initial), multiplier, None if maximum is None else _seconds(maximum), jitter
        )

    def delay(self, retry: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        wait = self.initial * self.multiplier ** max(0, retry - 1)
        if self.maximum is not None:
            wait = min(wait, self.maximum)
        return wait * (1 - self.jitter * rng())
