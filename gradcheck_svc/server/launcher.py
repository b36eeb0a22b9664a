"""Start `gradcheck-svc serve` as a child process on a free loopback port (make run, benchmarks, tests)."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path


class LocalServer:
    """`gradcheck-svc serve --port 0 ARGS` in a child process; the bound port comes from its first stdout line."""

    def __init__(self, *args: str, env: dict | None = None, log_path: Path | None = None, startup: float = 60,
                 cwd: Path | None = None):
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gradcheck_svc.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=self._log, env=env if env is not None else os.environ.copy(),
            text=True, cwd=cwd)  # cwd: where `-m gradcheck_svc` is found first (a test's copy of the package)
        ready, _, _ = select.select([self.proc.stdout], [], [], startup)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()
            if self._log is not subprocess.DEVNULL:
                self._log.close()
            raise RuntimeError(f"gradcheck-svc serve did not start (exit status {self.proc.returncode})")
        self.info = json.loads(line)
        self.port = self.info["port"]
        self.target = f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (graceful drain), then SIGKILL after `timeout`; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
