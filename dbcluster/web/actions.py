"""The dashboard's actions and who may take them (and, with a token, who may read it).

Actions exist only when the dashboard was started with a token (``dbcluster web --token``, or
``DBCLUSTER_WEB_TOKEN``), and then only for a request that carries it: an ``Authorization:
Bearer <token>`` header, or the session cookie the login form sets (an HMAC of the token, never
the token itself; HttpOnly, SameSite=Strict, so another site cannot make a browser use it).
The same token guards reading the pages and ``/metrics`` unless ``--public-read``.

Restart: a FAILED, STOPPED or ABANDONED execution is restarted by a background ``dbcluster
restart --no-work`` process of its own (the master of the new execution; the dashboard itself
never joins the cluster), with the application given to ``dbcluster web --app``.

Stop: a STARTING or STARTED execution is stopped by running ``dbcluster stop`` (one row update;
the dashboard imports no cluster code), which makes it STOPPING; every node then stops its
partitions at their next chunk boundary and its master ends it STOPPED.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("dbcluster.web")

SESSION_COOKIE = "dbcluster_session"


class Access:
    """Whether actions exist and whether a request may take them."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def session_value(self) -> str:
        assert self.token is not None
        return hmac.new(self.token.encode(), b"dbcluster-web-session", hashlib.sha256).hexdigest()

    def check_token(self, given: str | None) -> bool:
        return (
            self.token is not None
            and given is not None
            and hmac.compare_digest(given.encode(), self.token.encode())
        )

    def allowed(self, authorization: str | None, cookie: str | None) -> bool:
        if self.token is None:
            return False
        if authorization and authorization.lower().startswith("bearer "):
            return self.check_token(authorization[7:].strip())
        return cookie is not None and hmac.compare_digest(cookie, self.session_value())


class Restarter:
    """Starts ``dbcluster restart`` for an execution in a background process; returns its pid.
    The URL travels in the child's environment, never on a command line."""

    def __init__(self, url: str, app: str, log_dir: Path | None = None) -> None:
        self.url = url
        self.app = app
        self.log_dir = Path(log_dir or tempfile.gettempdir())

    def restart(self, execution_id: int) -> tuple[int, Path]:
        log_path = self.log_dir / (
            f"dbcluster-web-restart-{execution_id}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        )
        args = [sys.executable, "-m", "dbcluster.cli", "restart", "--app", self.app]
        args += ["--no-work", "-q", str(execution_id)]
        env = {**os.environ, "DBCLUSTER_URL": self.url}
        with open(log_path, "ab") as out:
            child = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
            )
        log.info("restart of execution %s: pid %d, log %s", execution_id, child.pid, log_path)
        threading.Thread(
            target=self._reap, args=(child, execution_id), name="dbcluster-web-reaper", daemon=True
        ).start()
        return child.pid, log_path

    def _reap(self, child: subprocess.Popen[bytes], execution_id: int) -> None:
        code = child.wait()
        log.info("restart of execution %s (pid %d) exited %d", execution_id, child.pid, code)


class Stopper:
    """Runs ``dbcluster stop`` for an execution (it returns at once); the URL travels in the
    child's environment, never on a command line."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self, execution_id: int) -> tuple[bool, str]:
        """(whether the execution is now STOPPING, the command's one line)."""
        args = [sys.executable, "-m", "dbcluster.cli", "stop", str(execution_id)]
        env = {**os.environ, "DBCLUSTER_URL": self.url}
        done = subprocess.run(
            args, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60
        )
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        log.info("stop of execution %s exited %d", execution_id, done.returncode)
        return done.returncode == 0, lines[-1] if lines else f"exit status {done.returncode}"
