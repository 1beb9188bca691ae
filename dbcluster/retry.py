"""Trying again: the one retry primitive of dbcluster.

Every loop that rides out the database's passing trouble is a :class:`Retry`: the coordination
store's statements, the batch model's transactions, a master that waits the database out, a node
recording a partition's end after an error, a caller following a job to its end. Each says which
errors are worth another try (``retry_on``); the primitive says when to stop and how long to wait:

- ``attempts``: tries in all, the first included (None: no bound);
- ``deadline_s``: counted from the first error worth another try, not from the first try, so
  that time spent before it (a long body, a process stopped mid-transaction) never leaves no
  repetition at all (None: no bound);
- the pause before each repetition: ``pause_s`` first, then ``growth`` times the previous one,
  at most ``max_pause_s``; each drawn at random between ``1 - jitter`` and ``1 + jitter`` times
  that, so that nodes that failed together do not all try again together;
- ``give_up()``: asked before each repetition (a fenced node's writes would be refused anyway);
- ``on_retry(what, attempt, error)``: told of each repetition before its pause (logging).

The clock, the sleep and the random draw are injectable, so a test runs a policy without waiting.
This module imports nothing of dbcluster: it sits at the bottom of the house, beside
:mod:`dbcluster.states` and :mod:`dbcluster.points`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def _never() -> bool:
    return False


def brief(error: BaseException) -> str:
    """One line for a log: the driver's error (not SQLAlchemy's wrapper with its SQL text and
    parameters), its type and first line."""
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def log_retry(what: str, attempt: int, error: BaseException) -> None:
    """The default ``on_retry``: one INFO line for the first repetition (a routine blip, not a
    warning), DEBUG for the next ones (an outage repeats many statements many times: the
    services say once that the database is unavailable)."""
    level = logging.INFO if attempt == 1 else logging.DEBUG
    log.log(level, "transient error in %s (attempt %d): %s", what, attempt, brief(error))


def warn_once(logger: logging.Logger) -> Callable[[str, int, BaseException], None]:
    """An ``on_retry`` for a wait that outlasts blips (an outage): one WARNING on ``logger`` for
    the whole wait, "<what> yet: <error>", the error in :func:`brief` (``what`` says what cannot
    be done: "master n1 cannot place")."""

    def warn(what: str, attempt: int, error: BaseException) -> None:
        if attempt == 1:
            logger.warning("%s yet: %s", what, brief(error))

    return warn


def quietly(what: str, attempt: int, error: BaseException) -> None:
    """An ``on_retry`` that says nothing (a loop that polls on regardless)."""


@dataclass(frozen=True)
class Retry:
    """A retry policy (see the module doc); :meth:`call` runs a function under it, and
    :meth:`start` begins one run for a loop that needs more than a call (a transaction that
    verifies an unclear commit before it repeats)."""

    retry_on: Callable[[BaseException], bool]
    attempts: int | None = None
    deadline_s: float | None = None
    pause_s: float = 0.05
    growth: float = 2.0
    max_pause_s: float | None = None
    jitter: float = 0.5
    give_up: Callable[[], bool] = _never
    on_retry: Callable[[str, int, BaseException], None] = log_retry
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    draw: Callable[[], float] = field(default=random.random, repr=False)

    @classmethod
    def every(cls, pause_s: float, retry_on: Callable[[BaseException], bool], **more: Any) -> Retry:
        """A policy that waits the same ``pause_s`` before every repetition, without jitter (a
        loop that keeps to its own interval)."""
        return cls(retry_on, pause_s=pause_s, growth=1.0, jitter=0.0, **more)

    def pause_after(self, pause_s: float | None) -> float:
        """The pause that follows ``pause_s`` (None: the first), before its jitter."""
        if pause_s is None:
            return self.pause_s
        grown = pause_s * self.growth
        return grown if self.max_pause_s is None else min(grown, self.max_pause_s)

    def jittered(self, pause_s: float) -> float:
        """``pause_s`` with its jitter."""
        return pause_s * (1 - self.jitter + 2 * self.jitter * self.draw())

    def start(self, what: str = "work", *, deadline: float | None = None) -> Retrying:
        """One run of this policy; ``deadline`` (on :attr:`clock`): one already running (a
        verification that must end when the run it belongs to does)."""
        return Retrying(self, what, deadline)

    def call(self, work: Callable[[], T], what: str = "work") -> T:
        """``work()``, tried again while the policy says so; the last error is raised."""
        run = self.start(what)
        while True:
            try:
                return work()
            except Exception as error:
                if not run.again(error):
                    raise

    def but(self, **changes: object) -> Retry:
        """This policy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


class Retrying:
    """One run of a :class:`Retry`: the tries made so far, the deadline once it started."""

    def __init__(self, policy: Retry, what: str, deadline: float | None = None) -> None:
        self.policy = policy
        self.what = what
        #: The try under way (1 for the first).
        self.attempt = 1
        #: When repetitions end (on the policy's clock); None until an error starts it.
        self.deadline = deadline
        self._pause: float | None = None

    def accepts(self, error: BaseException) -> bool:
        """Whether ``error`` is one the policy tries again after; the first such error starts
        the deadline."""
        policy = self.policy
        if not policy.retry_on(error):
            return False
        if self.deadline is None and policy.deadline_s is not None:
            self.deadline = policy.clock() + policy.deadline_s
        return True

    def exhausted(self) -> bool:
        """Whether no repetition is left: the tries are spent, the deadline passed, or the
        policy gives up."""
        policy = self.policy
        return (
            (policy.attempts is not None and self.attempt >= policy.attempts)
            or (self.deadline is not None and policy.clock() >= self.deadline)
            or policy.give_up()
        )

    def again(self, error: BaseException) -> bool:
        """After a failed try: whether to try again. True once the pause before the next try
        has passed; False (the caller raises) when ``error`` is not worth another try or none
        is left."""
        if not self.accepts(error) or self.exhausted():
            return False
        policy = self.policy
        policy.on_retry(self.what, self.attempt, error)
        self._pause = policy.pause_after(self._pause)
        policy.sleep(policy.jittered(self._pause))
        self.attempt += 1
        return True
