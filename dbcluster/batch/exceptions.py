"""The errors the batch model raises on purpose. Every one derives from :class:`DbclusterError`."""

from __future__ import annotations

from dbcluster.errors import ConfigurationError, DbclusterError


class BatchError(DbclusterError):
    """Base of the batch model's errors."""


class ContextValueError(BatchError, ValueError):
    """An execution-context value (or key) that JSON cannot hold."""


class JobParametersError(BatchError, ValueError):
    """A job parameter that is malformed, of an unsupported type, or unparseable."""


class OptimisticLockingFailureError(BatchError):
    """An UPDATE guarded by ``version`` (and any write guard) changed no row: the in-memory copy is
    stale, or the writer was fenced."""


class JobExecutionAlreadyRunningError(BatchError):
    """An execution of the same job instance is STARTING, STARTED or STOPPING."""


class JobInstanceAlreadyCompleteError(BatchError):
    """The job instance already COMPLETED; launch with different identifying parameters."""


class JobRestartError(BatchError):
    """The job (or one of its steps) may not be started again."""


class StartLimitExceededError(JobRestartError):
    """A job or step has been started ``start_limit`` times already."""


class NoSuchJobError(BatchError, LookupError):
    """No job of that name is registered."""


class NoSuchStepError(BatchError, LookupError):
    """No step of that name is registered."""


class NoSuchJobExecutionError(BatchError, LookupError):
    """No job execution with that id exists."""


class RegistryLoadError(ConfigurationError):
    """A ``module:attribute`` registry reference that cannot be loaded."""


class SkipLimitExceededError(BatchError):
    """A chunk step skipped more items than its ``skip_limit`` allows."""


class PartitionFailedError(BatchError):
    """At least one partition of a partitioned step did not complete. ``exit_code`` is the
    step's exit code (``NODE_LOST`` when every failed partition was lost with its node)."""

    def __init__(self, message: str, exit_code: str = "FAILED") -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StepConfigurationError(ConfigurationError):
    """A step definition that cannot work (e.g. a reader without ``read``)."""
