"""Every coordination status, once: the only spellings of the strings the coordination tables
hold (and of the job and step execution statuses the query provider writes itself).

They are plain ``str`` constants, not enum members: a status is bound as a parameter, compared
with a row's value and rendered into a statement exactly as the string it is, on every driver.
Each family has a tuple of its values, in the order they are shown.

The batch model's own statuses (:class:`~dbcluster.batch.status.BatchStatus`,
:class:`~dbcluster.batch.status.ExitStatus`) live with the batch model; the constants below that
spell some of them (``JOB_*``, ``STEP_*``) are for the provider and the store, which do not import
the batch model, and a test holds them equal.
"""

from __future__ import annotations

from typing import Final

# --- batch_nodes.status ---------------------------------------------------------------------------

NODE_ACTIVE: Final = "ACTIVE"
NODE_UNREACHABLE: Final = "UNREACHABLE"
#: Only ever inside a sweeper's removal transaction (never committed): marks the rows it deletes.
NODE_REMOVING: Final = "REMOVING"
#: What a reader of ``batch_nodes`` can see.
NODE_STATUSES: Final = (NODE_ACTIVE, NODE_UNREACHABLE)

# --- batch_partitions.status --------------------------------------------------------------------

PARTITION_PENDING: Final = "PENDING"
PARTITION_CLAIMED: Final = "CLAIMED"
PARTITION_COMPLETED: Final = "COMPLETED"
PARTITION_FAILED: Final = "FAILED"
PARTITION_STATUSES: Final = (
    PARTITION_PENDING,
    PARTITION_CLAIMED,
    PARTITION_COMPLETED,
    PARTITION_FAILED,
)
PARTITION_IN_FLIGHT: Final = (PARTITION_PENDING, PARTITION_CLAIMED)

#: Outcomes of a running partition's final write besides COMPLETED and FAILED (never stored: the
#: row goes back to PENDING): a transferable partition stopped by a graceful shutdown is handed
#: back; a failed try of one that has tries left is put back for another.
PARTITION_RELEASED: Final = "RELEASED"
PARTITION_RETRIED: Final = "RETRIED"

# --- batch_job_coordination.status (the mastership) ---------------------------------------------

COORD_CREATED: Final = "CREATED"
COORD_STARTED: Final = "STARTED"
COORD_COMPLETED: Final = "COMPLETED"
COORD_FAILED: Final = "FAILED"
COORD_RECOVERING: Final = "RECOVERING"
COORD_ABANDONED: Final = "ABANDONED"
COORD_STATUSES: Final = (
    COORD_CREATED,
    COORD_STARTED,
    COORD_RECOVERING,
    COORD_COMPLETED,
    COORD_FAILED,
    COORD_ABANDONED,
)
COORD_IN_FLIGHT: Final = (COORD_CREATED, COORD_STARTED, COORD_RECOVERING)
#: In flight under a working master (RECOVERING rows belong to a survivor's recovery).
COORD_MASTERED: Final = (COORD_CREATED, COORD_STARTED)

# --- batch_job_masters.reason (why a node became an execution's master) --------------------------

MASTER_LAUNCHED: Final = "launched"
#: A survivor that runs the job on under the next epoch.
MASTER_TAKEOVER: Final = "takeover"
#: A survivor that fails the job, to be restarted.
MASTER_ABANDON: Final = "abandon"
MASTER_REASONS: Final = (MASTER_LAUNCHED, MASTER_TAKEOVER, MASTER_ABANDON)

# --- batch_launch_requests.status ---------------------------------------------------------------

LAUNCH_PENDING: Final = "PENDING"
LAUNCH_CLAIMED: Final = "CLAIMED"
LAUNCH_LAUNCHED: Final = "LAUNCHED"
LAUNCH_FAILED: Final = "FAILED"
LAUNCH_STATUSES: Final = (LAUNCH_PENDING, LAUNCH_CLAIMED, LAUNCH_LAUNCHED, LAUNCH_FAILED)

# --- the batch model's spellings the provider writes itself ---------------------------------------

#: Job execution statuses the stop request reads and writes (``BatchStatus`` values).
JOB_STARTING: Final = "STARTING"
JOB_STARTED: Final = "STARTED"
JOB_STOPPING: Final = "STOPPING"
JOB_COMPLETED: Final = "COMPLETED"

#: A step execution's status and exit code once a claim started it (the job repository's
#: spellings: ``BatchStatus.STARTED``, ``ExitStatus.EXECUTING``).
STEP_STARTED: Final = "STARTED"
STEP_EXECUTING: Final = "EXECUTING"
