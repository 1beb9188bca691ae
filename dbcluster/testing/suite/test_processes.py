"""The cluster invariants with real node processes and real faults: a short, seeded chaos run.

One of each fault (SIGKILL, SIGSTOP past the cleanup threshold then SIGCONT, SIGTERM, a cut
database connection), on worker nodes and on a job's master, checked from data afterwards. The
longer soak is ``dbcluster chaos --faults 20`` (see the README).
"""

from __future__ import annotations

from typing import Any

from dbcluster.testing.requirements import requires

__all__ = ["test_a_short_chaos_run_keeps_every_invariant"]


@requires("multiple_processes")
def test_a_short_chaos_run_keeps_every_invariant(
    dbc_backend: Any, dbc_chaos_options: dict[str, int], tmp_path: Any
) -> None:
    from dbcluster.testing.app import ledger_metadata
    from dbcluster.testing.chaos import KINDS, format_summary, run_chaos

    ledger_metadata.drop_all(dbc_backend.engine)
    ledger_metadata.create_all(dbc_backend.engine)
    faults = dbc_chaos_options["faults"]
    summary = run_chaos(
        dbc_backend.url,
        nodes=3,
        jobs=2,
        faults=faults,
        seed=dbc_chaos_options["seed"],
        window=max(6.0, faults * 1.5),
        delay_ms=2000,
        tick_ms=250,
        settle_timeout=120,
        workdir=tmp_path / "chaos",
    )
    report = format_summary(summary)
    assert summary["ok"], report
    if faults >= len(KINDS):
        assert set(summary["faults_by_kind"]) == set(KINDS), report
    assert summary["lost_partitions"] == 0 and summary["stuck_jobs"] == 0, report
