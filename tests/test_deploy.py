"""The deployment kit agrees with itself and with the worker: every service manager waits longer
than the worker drains, probes ask the paths and ports the worker serves, the image runs as a
non-root user. (The tools that validate each file, systemd-analyze, kubernetes-validate and
hadolint, run in .ci/run through deploy/check.sh.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dbcluster.cluster import ClusterSettings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DEFAULT_DRAIN_S = ClusterSettings().drain_timeout / 1000


def _documents(path: Path) -> list[str]:
    return [doc for doc in path.read_text().split("\n---\n") if "kind:" in doc]


def _deployments() -> list[tuple[str, str]]:
    return [
        (path.name, doc)
        for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for doc in _documents(path)
        if re.search(r"^kind: Deployment$", doc, re.M)
    ]


def _drain_s(text: str) -> float:
    """The drain timeout a file sets (DBCLUSTER_DRAIN_TIMEOUT, ms), else the default."""
    found = re.search(r"DBCLUSTER_DRAIN_TIMEOUT\W+value: \"(\d+)\"", text) or re.search(
        r"^DBCLUSTER_DRAIN_TIMEOUT=(\d+)$", text, re.M
    )
    return int(found.group(1)) / 1000 if found else DEFAULT_DRAIN_S


def _worker_option(args: str, name: str) -> str:
    found = re.search(rf"--{name}\W+(\d+)", args)
    assert found, f"the worker is not started with --{name}: {args}"
    return found.group(1)


def test_the_default_drain_equals_kubernetes_default_grace_period() -> None:
    """Why the kit sets a grace period at all: 30 s of drain in 30 s of grace is a SIGKILL."""
    assert DEFAULT_DRAIN_S == 30


def test_systemd_waits_longer_than_the_worker_drains_and_restarts_it() -> None:
    unit = (DEPLOY / "systemd" / "dbcluster-worker.service").read_text()
    env = (DEPLOY / "systemd" / "worker.env.example").read_text()
    timeout = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))  # type: ignore[union-attr]
    assert timeout >= _drain_s(env) + 15
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    assert re.search(r"^EnvironmentFile=/etc/dbcluster/worker\.env$", unit, re.M)
    assert re.search(r"^RestartPreventExitStatus=2$", unit, re.M)  # a usage error stays down
    assert re.search(r"^User=dbcluster$", unit, re.M)
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)  # type: ignore[union-attr]
    assert exec_start.split()[1] == "worker"
    for name in ("DBCLUSTER_URL", "DBCLUSTER_APP"):
        assert re.search(rf"^{name}=", env, re.M)


@pytest.mark.parametrize(("name", "doc"), _deployments(), ids=lambda v: v[:30])
def test_every_deployment_drains_within_its_grace_period_and_probes_the_worker(
    name: str, doc: str
) -> None:
    grace = int(re.search(r"terminationGracePeriodSeconds: (\d+)", doc).group(1))  # type: ignore[union-attr]
    assert grace >= _drain_s(doc) + 15, name
    args = re.search(r"args: \[(.*?)\]", doc, re.S).group(1)  # type: ignore[union-attr]
    assert '"worker"' in args
    health = _worker_option(args, "health-port")
    metrics = _worker_option(args, "metrics-port")
    assert f"name: health\n              containerPort: {health}" in doc
    assert f"name: metrics\n              containerPort: {metrics}" in doc
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        assert re.search(rf"{probe}:\n\s+httpGet:\n\s+path: {path}\n\s+port: health", doc), probe
    assert "secretRef:\n                name: dbcluster" in doc
    assert "runAsNonRoot: true" in doc


def test_the_scheduler_accepts_launches_instead_of_a_cronjob() -> None:
    manifests = "\n".join(p.read_text() for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    assert "kind: CronJob" not in manifests
    scheduler = dict(_deployments())["scheduler.yaml"]
    assert '"--accept-launches"' in scheduler
    assert re.search(r"replicas: [2-9]", scheduler)


def test_the_image_runs_the_worker_as_a_user_and_checks_its_health_endpoint() -> None:
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    user = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert user and not user[-1].startswith(("root", "0:", "0")), user
    cmd = re.search(r"^CMD \[(.*)\]$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    health = _worker_option(cmd, "health-port")
    assert f"http://127.0.0.1:{health}/healthz" in dockerfile
    assert re.search(rf"^EXPOSE .*\b{health}\b", dockerfile, re.M)
    assert re.search(r"^ENTRYPOINT \[\"dbcluster\"\]$", dockerfile, re.M)


def test_the_worker_takes_the_options_the_kit_passes() -> None:
    """The options the unit, the image and the manifests give ``dbcluster worker`` exist."""
    help_text = subprocess.run(
        [sys.executable, "-m", "dbcluster.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    unit = (DEPLOY / "systemd" / "dbcluster-worker.service").read_text()
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    command_lines = [
        re.search(r"^ExecStart=(.*)$", unit, re.M).group(1),  # type: ignore[union-attr]
        re.search(r"^CMD \[(.*)\]$", dockerfile, re.M).group(1),  # type: ignore[union-attr]
        *(re.search(r"args: \[(.*?)\]", doc, re.S).group(1) for _, doc in _deployments()),  # type: ignore[union-attr]
    ]
    used = {option for line in command_lines for option in re.findall(r"--[a-z-]+", line)}
    assert {"--health-port", "--metrics-port", "--accept-launches"} <= used
    for option in sorted(used):
        assert option in help_text, f"{option} is not an option of dbcluster worker"
