"""A first job: count the primes below 200,000 in 8 partitions, spread over every worker.

From the repository root:
    dbcluster init   --url sqlite:///hello.db
    dbcluster worker --url sqlite:///hello.db --app examples.hello:registry    # in two terminals
    dbcluster launch --url sqlite:///hello.db --app examples.hello:registry count_primes
"""

import logging

from dbcluster import ChunkContext, JobRegistry

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
