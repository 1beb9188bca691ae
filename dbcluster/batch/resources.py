"""Application resources: the application's own engine, session factory or settings, made once
per worker process on first use and closed when that process's node stops.

Every process that runs jobs (``dbcluster worker``, ``launch``, ``restart``, a ``Cluster`` in
your code) imports the application's module and so gets its :class:`~dbcluster.JobRegistry`;
a resource registered there is built by its factory the first time a step (a partitioner, a
reader, a tasklet) calls it in that process, shared by the process's threads, and closed after
the last node of the process that uses the registry stopped::

    @registry.resource
    def shop() -> Iterator[Engine]:
        engine = create_engine(os.environ["SHOP_DATABASE_URL"])
        yield engine  # what shop() returns in this process
        engine.dispose()  # when the worker stops

Nothing is built where nothing calls it (``dbcluster submit`` imports the module but runs no
step). The resource belongs to the application: it may live in another database than the job
repository. See docs/jobs.md ("Your application's resources").
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

from dbcluster.batch.exceptions import StepConfigurationError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Resource(Generic[T]):
    """A value made by ``factory()`` once per process, on first call, closed by :meth:`close`.

    Call the resource to get the value: ``shop()``. A generator factory yields the value once;
    the code after its ``yield`` runs at :meth:`close`. A plain factory's value is closed with
    its ``dispose()`` (a SQLAlchemy engine) or ``close()`` method when it has one. After a close
    the next call builds a new value; so does the first call in a forked child process (the
    parent's value is left to the parent).
    """

    def __init__(self, factory: Callable[[], T] | Callable[[], Iterator[T]]) -> None:
        if not callable(factory):
            raise StepConfigurationError(f"a resource needs a function, not {factory!r}")
        self.factory = factory
        self.name: str = getattr(factory, "__qualname__", None) or repr(factory)
        self._lock = threading.RLock()
        self._value: T | None = None
        self._generator: Iterator[T] | None = None
        self._pid: int | None = None  # the process the value was made in; None: not made
        self._making = False
        self.__doc__ = getattr(factory, "__doc__", None)
        self.__wrapped__ = factory

    def __repr__(self) -> str:
        return f"Resource({self.name})"

    @property
    def is_open(self) -> bool:
        """Whether this process holds a value made by the factory."""
        return self._pid == os.getpid()

    def __call__(self) -> T:
        if self._pid == os.getpid():  # made here already: no lock on the hot path
            return cast(T, self._value)
        with self._lock:
            if self._pid == os.getpid():
                return cast(T, self._value)
            if self._making:
                raise StepConfigurationError(f"resource {self.name} calls itself while it is made")
            self._making = True
            try:
                self._value, self._generator = self._make()
            finally:
                self._making = False
            self._pid = os.getpid()
            log.debug("made resource %s in process %d", self.name, self._pid)
            return self._value

    def _make(self) -> tuple[T, Iterator[T] | None]:
        if inspect.isgeneratorfunction(self.factory):
            generator = cast(Iterator[T], self.factory())
            try:
                value = next(generator)
            except StopIteration:
                raise StepConfigurationError(
                    f"resource {self.name} is a generator that yielded nothing: yield its value"
                ) from None
            return value, generator
        return cast(T, self.factory()), None

    def close(self) -> None:
        """Close this process's value (run the generator's code after ``yield``, or the value's
        ``dispose()``/``close()``) and forget it. A failure to close is logged, not raised: a
        stopping worker must go on stopping."""
        with self._lock:
            if self._pid != os.getpid():
                self._value, self._generator, self._pid = None, None, None
                return
            value, generator = self._value, self._generator
            self._value, self._generator, self._pid = None, None, None
        try:
            if generator is not None:
                try:
                    next(generator)
                except StopIteration:
                    pass
                else:
                    log.warning("resource %s yielded a second value; only one is used", self.name)
            else:
                closer = getattr(value, "dispose", None) or getattr(value, "close", None)
                if callable(closer):
                    closer()
        except Exception:
            log.warning("closing resource %s failed", self.name, exc_info=True)


class Resources:
    """The resources of one registry, and how many running nodes of this process use them.

    :meth:`hold` is called when a node starts, :meth:`release` when it stops; the last release
    closes every resource, so that several nodes in one process (tests, a master beside a
    worker) do not close what another still uses."""

    def __init__(self) -> None:
        self._resources: list[Resource[Any]] = []
        self._holders = 0
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[Resource[Any]]:
        return iter(list(self._resources))

    def __len__(self) -> int:
        return len(self._resources)

    def add(self, resource: Resource[T]) -> Resource[T]:
        with self._lock:
            if resource not in self._resources:
                self._resources.append(resource)
        return resource

    def hold(self) -> None:
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders = max(0, self._holders - 1)
            last = self._holders == 0
        if last:
            self.close()

    def close(self) -> None:
        """Close every resource this process made, the last registered first."""
        for resource in reversed(list(self._resources)):
            resource.close()
