"""The job repository's data access objects, one per record kind, behind
:class:`~dbcluster.batch.repository.JobRepository`.

``statements`` (the fixed statements, built once) and ``rows`` (rows to records and back) are
shared; ``combined`` builds, per database, the statements that do in one round trip what would
otherwise take several; ``connections`` says where a DAO's statements run. The DAOs:
``job_instances``, ``job_executions``, ``step_executions``, ``contexts``, and ``creation`` (new job
and step executions, in as few statements as the database allows).
"""
