"""The batch model: jobs, steps, chunks, partitions and a restartable SQL job repository."""

from dbcluster.batch.chunk import ChunkStep
from dbcluster.batch.context import ExecutionContext
from dbcluster.batch.domain import JobExecution, JobInstance, StepExecution
from dbcluster.batch.exceptions import (
    BatchError,
    ContextValueError,
    JobExecutionAlreadyRunningError,
    JobInstanceAlreadyCompleteError,
    JobParametersError,
    JobRestartError,
    NoSuchJobError,
    NoSuchJobExecutionError,
    NoSuchStepError,
    OptimisticLockingFailureError,
    PartitionFailedError,
    RegistryLoadError,
    SkipLimitExceededError,
    StartLimitExceededError,
    StepConfigurationError,
)
from dbcluster.batch.items import (
    CsvItemReader,
    CsvItemWriter,
    FunctionItemWriter,
    ItemProcessor,
    ItemReader,
    ItemStream,
    ItemWriter,
    IterableItemReader,
    ListItemWriter,
    SqlItemWriter,
    SqlKeyRangeReader,
    item_writer,
)
from dbcluster.batch.job import Job
from dbcluster.batch.launcher import JobLauncher
from dbcluster.batch.listeners import JobListener, StepListener
from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.parameters import JobParameter, JobParameters
from dbcluster.batch.partition import (
    BasePartitioner,
    FunctionPartitioner,
    Partitioner,
    PartitionHandler,
    PartitionStep,
    PartitionWork,
    partitioner,
)
from dbcluster.batch.partitioners import ColumnRangePartitioner, IntegerRangePartitioner
from dbcluster.batch.registry import JobRegistry, load_registry
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.runtime import BatchRuntime
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step
from dbcluster.batch.tasklet import RepeatStatus, TaskletStep, tasklet

__all__ = [
    "BasePartitioner",
    "BatchError",
    "BatchRuntime",
    "BatchStatus",
    "ChunkContext",
    "ChunkStep",
    "ColumnRangePartitioner",
    "ContextValueError",
    "CsvItemReader",
    "CsvItemWriter",
    "ExecutionContext",
    "ExitStatus",
    "FunctionItemWriter",
    "FunctionPartitioner",
    "IntegerRangePartitioner",
    "ItemProcessor",
    "ItemReader",
    "ItemStream",
    "ItemWriter",
    "IterableItemReader",
    "Job",
    "JobExecution",
    "JobExecutionAlreadyRunningError",
    "JobInstance",
    "JobInstanceAlreadyCompleteError",
    "JobLauncher",
    "JobListener",
    "JobParameter",
    "JobParameters",
    "JobParametersError",
    "JobRegistry",
    "JobRepository",
    "JobRestartError",
    "ListItemWriter",
    "LocalPartitionHandler",
    "NoSuchJobError",
    "NoSuchJobExecutionError",
    "NoSuchStepError",
    "OptimisticLockingFailureError",
    "PartitionFailedError",
    "PartitionHandler",
    "PartitionStep",
    "PartitionWork",
    "Partitioner",
    "RegistryLoadError",
    "RepeatStatus",
    "SkipLimitExceededError",
    "SqlItemWriter",
    "SqlKeyRangeReader",
    "StartLimitExceededError",
    "Step",
    "StepConfigurationError",
    "StepExecution",
    "StepListener",
    "TaskletStep",
    "item_writer",
    "load_registry",
    "partitioner",
    "tasklet",
]
