"""The fault plan of ``dbcluster chaos``: which faults fall where and when, a pure function of
the seed and the run's shape (:func:`plan_faults`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from dbcluster.testing.dbfaults import DB_KINDS

#: Fault kinds. ``freeze-tx``: a worker parked inside a chunk transaction (its partition row
#: verifiably locked), then SIGSTOPped past the cleanup threshold. ``stop-between``: a master
#: parked between two steps of its job, then SIGSTOPped past the cleanup threshold. ``blip``: only
#: a master's connection cut, for less than the unreachable threshold.
#: ``leader-kill`` and ``leader-freeze``: the node process that holds the sweep lease (the
#: maintenance leader, see ``cluster/maintenance/leases.py``) is SIGKILLed, or SIGSTOPped past the
#: cleanup threshold (it wakes after another node took its lease over, and was removed).
KINDS = (
    "kill",
    "stop",
    "term",
    "cut",
    "freeze-tx",
    "stop-between",
    "blip",
    "leader-kill",
    "leader-freeze",
)
#: Kinds that hit whichever process holds the sweep lease when they fall (``--target any``
#: only), and the node kind each acts as.
LEADER_KINDS = {"leader-kill": "kill", "leader-freeze": "stop"}
#: Kinds that hit a job's master only.
MASTER_KINDS = ("stop-between", "blip")
#: Kinds that only make sense on a worker (a master's partitions run on the workers).
WORKER_KINDS = ("term", "freeze-tx")
#: Every kind a plan may use: the node kinds above and the database's own (dbfaults.py), which
#: fall on the database whatever ``--target`` says.
ALL_KINDS = KINDS + DB_KINDS
#: Seconds between two database faults of a plan, at least (a restart takes several).
DB_FAULT_SPACING_S = 12.0
#: ``--target``: which processes the faults fall on (``any``: workers and masters, mixed).
TARGETS = ("any", "masters", "workers")
JOB_NAMES = ("ledger-steps", "ledger-mixed", "ledger-fixed", "ledger")
#: Jobs whose master runs a step after the partitioned one (``stop-between`` needs one).
STEPPED_JOBS = ("ledger-steps",)


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``at`` seconds after the first job launch, on slot ``target`` (``w<i>``
    a worker, ``m<j>`` the master of job ``j``, ``db`` the database, ``db<k>`` the server of
    the k-th URL, ``leader`` the holder of the sweep lease then), lasting ``duration`` s (stop,
    cut, leader-freeze, and a Galera node's time down)."""

    at: float
    kind: str
    target: str
    duration: float = 0.0


#: The fault point each parking kind arms.
POINTS = {"freeze-tx": "chunk.before_commit", "stop-between": "master.between_steps"}
#: Seconds the harness waits for an armed fault point to be reached (a master reaches the end of
#: its partitioned step only once every partition has run).
PARK_WAIT_S = {"chunk.before_commit": 8.0, "master.between_steps": 25.0}


def launch_times(jobs: int, window: float) -> list[float]:
    return [round(j * window / max(1, jobs), 3) for j in range(jobs)]


def plan_faults(
    seed: int,
    faults: int,
    nodes: int,
    jobs: int,
    *,
    window: float,
    cleanup_ms: int,
    unreachable_ms: int,
    on: str = "any",
    kinds: Sequence[str] | None = None,
    db_nodes: int = 1,
) -> list[Fault]:
    """The fault plan: a pure function of its arguments. Every kind appears once before any
    repeats (when ``faults`` >= the number of kinds); about a quarter of kills and stops hit a
    job's master. ``on="masters"`` puts every fault on a master (the kinds a master can
    take), ``"workers"`` every fault on a worker; the leader kinds (:data:`LEADER_KINDS`) fall
    only in a mixed plan (``"any"``), on whichever process holds the sweep lease then.

    ``kinds`` (default: the node kinds, :data:`KINDS`) chooses the kinds; database kinds fall
    on the database whatever ``on`` says, at least :data:`DB_FAULT_SPACING_S` apart where the
    window allows, and ``galera-kill`` on one of the servers ``2..db_nodes`` (the first URL is
    the run's own, for its checks)."""
    if on not in TARGETS:
        raise ValueError(f"faults fall on one of {', '.join(TARGETS)}, not {on!r}")
    chosen = tuple(kinds) if kinds is not None else KINDS
    unknown = [k for k in chosen if k not in ALL_KINDS]
    if unknown or not chosen:
        raise ValueError(
            f"unknown fault kind(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(ALL_KINDS)}"
        )
    if "galera-kill" in chosen and db_nodes < 2:
        raise ValueError("galera-kill needs at least two database URLs (it never kills the first)")
    pool = {
        "any": chosen,
        "masters": tuple(k for k in chosen if k not in WORKER_KINDS + tuple(LEADER_KINDS)),
        "workers": tuple(k for k in chosen if k not in MASTER_KINDS + tuple(LEADER_KINDS)),
    }[on]
    if not pool:
        raise ValueError(f"none of the kinds {', '.join(chosen)} can fall on {on}")
    rng = random.Random(seed)
    kinds = list(pool)
    rng.shuffle(kinds)
    while len(kinds) < faults:
        kinds.append(rng.choice(pool))
    kinds = kinds[:faults]
    starts = launch_times(jobs, window)
    stepped = [j for j in range(jobs) if JOB_NAMES[j % len(JOB_NAMES)] in STEPPED_JOBS]
    master_hit = False
    plan: list[Fault] = []
    db_total = sum(k in DB_KINDS for k in kinds)
    db_seen = 0
    for kind in kinds:
        if kind in DB_KINDS:
            # Spread over the window, one slot each (a command runs only after the last ends).
            slot = max(window / db_total, min(DB_FAULT_SPACING_S, window))
            at = 1.0 + db_seen * slot + rng.uniform(0.0, slot * 0.4)
            db_seen += 1
            target, duration = "db", 0.0
            if kind == "galera-kill":
                target, duration = f"db{rng.randint(2, db_nodes)}", rng.uniform(2.0, 6.0)
            plan.append(Fault(round(at, 3), kind, target, round(duration, 3)))
            continue
        if kind in LEADER_KINDS:
            # Whoever holds the lease when it falls (resolved then).
            duration = cleanup_ms / 1000 * rng.uniform(1.3, 1.8) if kind == "leader-freeze" else 0
            at = rng.uniform(1.0, window)
            plan.append(Fault(round(at, 3), kind, "leader", round(duration, 3)))
            continue
        to_master = kind in MASTER_KINDS or (
            kind in ("kill", "stop", "cut")
            and (rng.random() < 0.25 or (kind == "kill" and not master_hit))
        )
        if on != "any":
            to_master = on == "masters"
        if kind == "stop-between" and not stepped:
            kind = "stop"
            to_master = on == "masters"
        if to_master and jobs > 0:
            master_hit = master_hit or kind == "kill"
            j = rng.choice(stepped) if kind == "stop-between" else rng.randrange(jobs)
            # A master is parked between steps once its partitioned step is over.
            lead = (0.5, 1.5) if kind == "stop-between" else (1.5, 3.0)
            target, at = f"m{j}", starts[j] + rng.uniform(*lead)
        else:
            target, at = f"w{rng.randrange(nodes)}", rng.uniform(1.0, window)
        duration = 0.0
        if kind in ("stop", "freeze-tx", "stop-between"):
            duration = cleanup_ms / 1000 * rng.uniform(1.3, 1.8)
        elif kind == "blip":
            duration = unreachable_ms / 1000 * rng.uniform(0.2, 0.6)
        elif kind == "cut":
            if rng.random() < 0.4:  # a blip shorter than the unreachable threshold
                duration = unreachable_ms / 1000 * rng.uniform(0.2, 0.6)
            else:
                duration = cleanup_ms / 1000 * rng.uniform(1.3, 1.8)
        plan.append(Fault(round(at, 3), kind, target, round(duration, 3)))
    plan.sort(key=lambda f: f.at)
    return plan
