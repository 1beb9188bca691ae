"""The batch model: jobs, steps, chunks, partitions and a restartable SQL job repository."""

from dbcluster.batch.chunk import ChunkStep, step_scope
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
from dbcluster.batch.flow import Decider, Flow, Split, decider
from dbcluster.batch.items import (
    ClassifierItemWriter,
    CompositeItemWriter,
    CsvItemReader,
    CsvItemWriter,
    FunctionItemWriter,
    ItemProcessor,
    ItemReader,
    ItemStream,
    ItemWriter,
    IterableItemReader,
    JsonLinesItemReader,
    JsonLinesItemWriter,
    ListItemWriter,
    SqlCursorItemReader,
    SqlItemWriter,
    SqlKeyRangeReader,
    SqlPagingItemReader,
    item_writer,
)
from dbcluster.batch.job import AutoRestart, Job
from dbcluster.batch.jobstep import JobStep
from dbcluster.batch.launcher import JobLauncher
from dbcluster.batch.listeners import (
    ChunkListener,
    ItemProcessListener,
    ItemReadListener,
    ItemWriteListener,
    JobListener,
    RetryListener,
    SkipListener,
    StepListener,
)
from dbcluster.batch.local import LocalPartitionHandler
from dbcluster.batch.parameters import (
    JobParameter,
    JobParameters,
    ParametersValidator,
    RunIdIncrementer,
)
from dbcluster.batch.partition import (
    BasePartitioner,
    FunctionPartitioner,
    Partitioner,
    PartitionStep,
    PartitionWork,
    partitioner,
)
from dbcluster.batch.partitioned import partitioned_job
from dbcluster.batch.partitioners import ColumnRangePartitioner, IntegerRangePartitioner
from dbcluster.batch.policy import Backoff, SkipPolicy
from dbcluster.batch.registry import JobRegistry, load_registry
from dbcluster.batch.repository import JobRepository
from dbcluster.batch.resources import Resource
from dbcluster.batch.runtime import BatchRuntime, PartitionHandler
from dbcluster.batch.schedule import Schedule
from dbcluster.batch.scope import ChunkContext
from dbcluster.batch.status import BatchStatus, ExitStatus
from dbcluster.batch.step import Step
from dbcluster.batch.tasklet import RepeatStatus, TaskletStep, tasklet

__all__ = [
    "AutoRestart",
    "Backoff",
    "BasePartitioner",
    "BatchError",
    "BatchRuntime",
    "BatchStatus",
    "ChunkContext",
    "ChunkListener",
    "ChunkStep",
    "ClassifierItemWriter",
    "ColumnRangePartitioner",
    "CompositeItemWriter",
    "ContextValueError",
    "CsvItemReader",
    "CsvItemWriter",
    "Decider",
    "ExecutionContext",
    "ExitStatus",
    "Flow",
    "FunctionItemWriter",
    "FunctionPartitioner",
    "IntegerRangePartitioner",
    "ItemProcessListener",
    "ItemProcessor",
    "ItemReadListener",
    "ItemReader",
    "ItemStream",
    "ItemWriteListener",
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
    "JobStep",
    "JsonLinesItemReader",
    "JsonLinesItemWriter",
    "ListItemWriter",
    "LocalPartitionHandler",
    "NoSuchJobError",
    "NoSuchJobExecutionError",
    "NoSuchStepError",
    "OptimisticLockingFailureError",
    "ParametersValidator",
    "PartitionFailedError",
    "PartitionHandler",
    "PartitionStep",
    "PartitionWork",
    "Partitioner",
    "RegistryLoadError",
    "RepeatStatus",
    "Resource",
    "RetryListener",
    "RunIdIncrementer",
    "Schedule",
    "SkipLimitExceededError",
    "SkipListener",
    "SkipPolicy",
    "Split",
    "SqlCursorItemReader",
    "SqlItemWriter",
    "SqlKeyRangeReader",
    "SqlPagingItemReader",
    "StartLimitExceededError",
    "Step",
    "StepConfigurationError",
    "StepExecution",
    "StepListener",
    "TaskletStep",
    "decider",
    "item_writer",
    "load_registry",
    "partitioned_job",
    "partitioner",
    "step_scope",
    "tasklet",
]
