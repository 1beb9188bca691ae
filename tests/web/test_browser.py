"""The dashboard in a real browser (headless Chromium through chromedriver): a small cluster of
`dbcluster worker` processes runs a job, the job page shows its partitions progress without a
reload, a worker is killed, and the page shows its partitions moving to the survivor.

Without Chromium and chromedriver (Debian's ``chromium`` and ``chromium-driver``; ``.ci/run``
installs them) the test is skipped, saying so.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from dbcluster.demo import APP, demo_metadata, load_receipts, receipts, results
from dbcluster.schema import partitions
from dbcluster.testing.backends import Backend
from dbcluster.testing.harness import Harness, NodeProcess
from dbcluster.testing.harness import wait_until as wait

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser() -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("no browser test: selenium is not installed (pip install -e '.[dev]')")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "no headless browser: install Debian's chromium and chromium-driver "
            "(apt-get install -y chromium chromium-driver; .ci/run does)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1500")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _browser()
    yield driver
    driver.quit()


@pytest.fixture
def receipts_engine(backend: Backend) -> Iterator[Engine]:
    """The demo's 60,000 receipts (8 partitions of 15 pages on two workers)."""
    engine = backend.engine
    demo_metadata.drop_all(engine)
    demo_metadata.create_all(engine)
    load_receipts(engine)
    yield engine
    demo_metadata.drop_all(engine)


class Dashboard:
    """``dbcluster web`` as a process of its own, ended by its pid."""

    def __init__(self, url: str, log: Path) -> None:
        command = [sys.executable, "-m", "dbcluster.cli", "web", "--url", url]
        command += ["--host", "127.0.0.1", "--port", "0", "--refresh", "0.5"]
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        self.log = log

    def base(self) -> str:
        found = wait(
            lambda: (
                re.search(r"dashboard on (http://[\d.:]+)/", self.log.read_text())
                or self.popen.poll() is not None
            ),
            30,
            "the dashboard to listen",
        )
        if self.popen.poll() is not None:
            pytest.fail(f"dbcluster web exited: {self.log.read_text()[-2000:]}")
        return str(found.group(1))

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def cells(driver: Any) -> list[dict[str, str]]:
    """The job page's partition grid, as the browser shows it now."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#partitions .cell[data-partition]'))"
            ".map(c => Object.assign({}, c.dataset));"
        )
    )


def claimed_on(engine: Engine, process: NodeProcess) -> dict[str, int]:
    """The partitions CLAIMED by one of the process's node ids: name -> attempt."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(partitions.c.partition_name, partitions.c.attempt).where(
                partitions.c.status == "CLAIMED",
                partitions.c.assigned_node.like(f"{process.prefix}-%"),
            )
        ).all()
    return {r.partition_name: int(r.attempt) for r in rows}


@pytest.mark.backends("sqlite")
def test_the_job_page_shows_partitions_progress_and_move_off_a_killed_worker(
    backend: Backend, receipts_engine: Engine, browser: Any, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    dashboard = Dashboard(backend.url, tmp_path / "web.log")
    with Harness(backend.url, tmp_path / "cluster", app=APP) as harness:
        try:
            survivor: NodeProcess = harness.start_worker("a")
            victim: NodeProcess = harness.start_worker("b")
            wait(
                lambda: (
                    harness.node_ids(backend.engine, survivor)
                    and harness.node_ids(backend.engine, victim)
                ),
                30,
                "the two workers to join",
            )
            base = dashboard.base()
            browser.get(f"{base}/jobs")
            browser.execute_script("window.notReloaded = true;")
            launcher = harness.start_launcher("m", "reconcile-receipts", {"pace_ms(int)": 150})

            # The new execution appears in the list by itself; open it (one script: the live
            # update may replace the row at any moment).
            wait(
                lambda: browser.execute_script(
                    "return document.querySelector('#jobs tr[data-execution] a') !== null;"
                ),
                30,
                "the execution to appear on the jobs list",
            )
            assert browser.execute_script("return window.notReloaded === true;")
            browser.execute_script("document.querySelector('#jobs tr[data-execution] a').click();")
            wait(lambda: len(cells(browser)) == 8, 20, "the 8 partitions on the job page")
            browser.execute_script("window.notReloaded = true;")

            def on(process: NodeProcess, node: str | None) -> bool:
                """Whether a node id is one of the process's (a node that fenced itself under
                load rejoins under a new id)."""
                return bool(node) and str(node).startswith(f"{process.prefix}-")

            # Partitions progress: claimed on both nodes, shown without reloading the page.
            def claimed_by() -> set[str]:
                nodes = {c["node"] for c in cells(browser) if c["status"] == "CLAIMED"}
                return {p.prefix for p in (victim, survivor) if any(on(p, n) for n in nodes)}

            wait(lambda: claimed_by() == {victim.prefix, survivor.prefix}, 20, "both claiming")
            browser.save_screenshot(str(shots / "1-running.png"))
            lost = wait(lambda: claimed_on(backend.engine, victim), 10, "the victim's claims")
            harness.kill(victim)

            # The survivor's own partitions complete while the job runs on.
            def status() -> str:
                return str(
                    browser.execute_script(
                        "return document.getElementById('job-status').textContent;"
                    )
                ).strip()

            wait(
                lambda: (
                    sum(
                        c["status"] == "COMPLETED" and on(survivor, c["node"])
                        for c in cells(browser)
                    )
                    >= 1
                    and status() == "STARTED"
                ),
                30,
                "the survivor's partitions to complete while the job runs",
            )

            # The victim's partitions move to the survivor under their next attempt.
            def moved() -> bool:
                now = {c["partition"]: c for c in cells(browser)}
                return all(
                    on(survivor, now[name]["node"]) and int(now[name]["attempt"]) > attempt
                    for name, attempt in lost.items()
                )

            wait(moved, 40, "the killed worker's partitions to move on the page")

            def moved_on_timeline(name: str, moves: list[str]) -> bool:
                return any(
                    m.startswith(f"{name} moved from {victim.prefix}-")
                    and f" to {survivor.prefix}-" in m
                    for m in moves
                )

            def timeline() -> list[str]:
                return list(
                    browser.execute_script(
                        "return Array.from(document.querySelectorAll('#timeline li.move-item'))"
                        ".map(li => li.textContent);"
                    )
                )

            # The timeline follows on its own refresh: wait until it shows every move.
            wait(
                lambda: all(moved_on_timeline(name, timeline()) for name in lost),
                15,
                "every move on the timeline",
            )
            moves = timeline()
            for name in lost:
                assert moved_on_timeline(name, moves), (name, moves)
            lanes = browser.execute_script(
                "return Array.from(document.querySelectorAll('#timeline g.lane'))"
                ".map(g => [g.dataset.node, g.classList.contains('gone')]);"
            )
            assert any(on(victim, node) and gone for node, gone in lanes), lanes
            assert any(on(survivor, node) and not gone for node, gone in lanes), lanes
            browser.save_screenshot(str(shots / "2-reassigned.png"))

            wait(lambda: status() == "COMPLETED", 60, "the job to complete on the page")
            done = cells(browser)
            assert {c["status"] for c in done} == {"COMPLETED"}
            assert sum(int(c["attempt"]) > 1 for c in done) >= len(lost)
            assert browser.execute_script("return window.notReloaded === true;")
            browser.save_screenshot(str(shots / "3-completed.png"))
            wait(lambda: not launcher.alive(), 30, "the launcher to exit")
            assert launcher.popen.returncode == 0, launcher.log_tail()

            browser.get(f"{base}/")
            browser.save_screenshot(str(shots / "4-nodes.png"))
            # The pages keep to their Content-Security-Policy: the browser blocked nothing.
            blocked = [
                entry["message"]
                for entry in browser.get_log("browser")
                if "Content Security Policy" in entry["message"]
            ]
            assert blocked == [], blocked
        finally:
            dashboard.stop()
    with receipts_engine.connect() as conn:
        rows = conn.execute(select(results.c.total_cents)).all()
        expected = conn.execute(select(receipts.c.amount_cents)).all()
    assert sum(r.total_cents for r in rows) == sum(r.amount_cents for r in expected)
    assert sorted(p.name for p in shots.iterdir()) == [
        "1-running.png",
        "2-reassigned.png",
        "3-completed.png",
        "4-nodes.png",
    ]
