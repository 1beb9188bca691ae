"""Reprice a shop's catalogue: the shop's data in its own database, the job repository in
another.

``shop`` is an application resource: the engine on the shop's database (``SHOP_DATABASE_URL``),
made once in each process that runs a step of the job, when a step first asks for it, and
disposed when that process's worker stops. ``reprice`` is a partitioned job over the products'
ids (up to the highest id, read by the job's master when it splits the job); each chunk of ids
is repriced in a transaction of the shop's database. That transaction is not the chunk's own (the
job repository is elsewhere), so the chunk is idempotent: it sets each price from the product's
base price, and a chunk that runs twice (its node died before its chunk committed) changes
nothing more.

From the repository root:
    export SHOP_DATABASE_URL=sqlite:///shop.db            # the application's database
    export DBCLUSTER_URL=sqlite:///jobs.db                # the job repository (any database)
    python examples/shop.py 20000                         # create the shop: 20,000 products
    dbcluster init
    dbcluster worker --app examples.shop:registry         # on each node
    dbcluster launch --app examples.shop:registry reprice 'percent(int)=110'
    dbcluster schedules --app examples.shop:registry          # its nightly schedule
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    MetaData,
    Table,
    bindparam,
    create_engine,
    func,
    insert,
    select,
    update,
)

from dbcluster import ChunkContext, JobRegistry
from dbcluster.batch import JobParameters, ParametersValidator, Schedule

log = logging.getLogger(__name__)
registry = JobRegistry()

products = Table(
    "shop_products",
    MetaData(),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("base_cents", BigInteger, nullable=False),
    Column("price_cents", BigInteger, nullable=False),
)


@registry.resource
def shop() -> Iterator[Engine]:
    """The shop's database: one engine per worker process, disposed when the worker stops."""
    engine = create_engine(os.environ["SHOP_DATABASE_URL"], pool_pre_ping=True)
    log.info("opened the shop database")
    yield engine
    engine.dispose()
    log.info("closed the shop database")


def every_product(params: JobParameters) -> range:
    with shop().connect() as conn:
        return range(1, (conn.execute(select(func.max(products.c.id))).scalar() or 0) + 1)


@registry.partitioned_job(
    ids=every_product,
    partitions=8,
    chunk_size=500,
    validator=ParametersValidator(required={"percent": int}),  # checked at every launch
)
def reprice(ids: range, ctx: ChunkContext) -> None:
    """Each price from its base price: running a chunk twice changes nothing more."""
    percent = ctx.job_parameters["percent"]
    assert isinstance(percent, int)  # the validator saw to it
    with shop().begin() as conn:
        rows = conn.execute(
            select(products.c.id, products.c.base_cents).where(
                products.c.id.between(ids[0], ids[-1])
            )
        ).all()
        if rows:
            conn.execute(
                update(products)
                .where(products.c.id == bindparam("pid"))
                .values(price_cents=bindparam("price")),
                [{"pid": r.id, "price": r.base_cents * percent // 100} for r in rows],
            )


# Every night at 03:00 in Paris, fired once across the cluster by the nodes started with
# `dbcluster worker --accept-launches` (no cron host, no CronJob); each tick is a run of its own.
registry.schedule(
    Schedule(
        "reprice",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        params={"percent": 110},
        fire_time_param="run.at",
    )
)


def create_shop(count: int) -> None:
    """(Re)create the shop's catalogue: ``count`` products, base prices from 1.00 up."""
    engine = create_engine(os.environ["SHOP_DATABASE_URL"])
    try:
        products.drop(engine, checkfirst=True)
        products.create(engine)
        with engine.begin() as conn:
            for start in range(1, count + 1, 5000):
                rows = range(start, min(start + 5000, count + 1))
                conn.execute(
                    insert(products),
                    [{"id": i, "base_cents": 100 + i % 9_900, "price_cents": 0} for i in rows],
                )
    finally:
        engine.dispose()
    print(f"created {count} products")


if __name__ == "__main__":
    create_shop(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
