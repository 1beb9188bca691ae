"""A first job: count the primes below 200,000 in 8 partitions, spread over every worker.

In one process (a one-node cluster on a temporary SQLite file): python examples/hello.py

From the repository root, on a cluster:
    dbcluster init   --url sqlite:///hello.db
    dbcluster worker --url sqlite:///hello.db --app examples.hello:registry    # in two terminals
    dbcluster launch --url sqlite:///hello.db --app examples.hello:registry count_primes
    dbcluster job 1  --url sqlite:///hello.db    # each partition's primes, in its context
"""

import logging
import tempfile
from pathlib import Path

from dbcluster import ChunkContext, Cluster, JobRegistry
from dbcluster.batch import JobRepository
from dbcluster.dialects import make_engine
from dbcluster.migrations import init

log = logging.getLogger(__name__)
registry = JobRegistry()


def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))


@registry.partitioned_job(ids=range(1, 200_000), partitions=8, chunk_size=5_000)
def count_primes(ids: range, ctx: ChunkContext) -> None:
    """Called with 5,000 ids at a time; each call commits with its partition's progress."""
    found = sum(1 for n in ids if is_prime(n))
    ctx.step_context.put("primes", ctx.step_context.get("primes", 0) + found)
    log.info("%d primes in %d..%d", found, ids[0], ids[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'hello.db'}")
        init(engine)  # what `dbcluster init` does: the dbcluster tables
        with Cluster(engine, registry) as cluster:
            execution = cluster.launch("count_primes")
        steps = JobRepository(engine).get_step_executions(execution)
        engine.dispose()
        partitions = [s for s in steps if ":" in s.step_name]
        for s in partitions:
            print(f"  {s.step_name:<38} primes {s.execution_context['primes']}")
        total = sum(s.execution_context["primes"] for s in partitions)
        print(f"job status: {execution.status.value}; primes below 200,000: {total}")
        if execution.status.value != "COMPLETED" or total != 17_984:
            raise SystemExit("MISMATCH")
        print("OK")


if __name__ == "__main__":
    main()
