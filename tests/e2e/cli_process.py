"""Run the ``pyxds`` command as a user would: a subprocess of this checkout's code.

:class:`PyxdsProcess` starts ``python -m pyxds.cli ARGS`` with this
worktree's ``src`` first on ``PYTHONPATH`` and collects stdout and stderr
lines on reader threads; every wait is bounded.  :func:`run_pyxds` runs a
command to completion.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    env.pop("GRPC_XDS_BOOTSTRAP_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_pyxds(
    *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``pyxds ARGS`` to completion: returncode, stdout, stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", "pyxds.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
        stdin=subprocess.DEVNULL,
    )


class PyxdsProcess:
    """A long-running ``pyxds`` command (``serve``, ``inspect --watch``)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyxds.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=cli_env(env),
        )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stderr_lines: list[str] = []
        self._stderr_changed = threading.Condition()
        threading.Thread(target=self._read_out, daemon=True).start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line.rstrip("\n"))
        self.stdout.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._stderr_changed:
                self.stderr_lines.append(line.rstrip("\n"))
                self._stderr_changed.notify_all()

    def stdout_line(self, timeout: float = 20.0) -> str:
        try:
            line = self.stdout.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"no stdout line in {timeout}s; stderr: {self.stderr_lines}"
            ) from None
        if line is None:
            self.proc.wait(5)
            raise RuntimeError(
                f"pyxds exited ({self.proc.returncode}); stderr: {self.stderr_lines}"
            )
        return line

    def wait_stderr(self, pattern: str, timeout: float = 20.0, after: int = 0) -> str:
        """The first stderr line (from index ``after``) matching regex ``pattern``."""
        deadline = time.monotonic() + timeout
        with self._stderr_changed:
            while True:
                for line in self.stderr_lines[after:]:
                    if re.search(pattern, line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no stderr line matching {pattern!r}: {self.stderr_lines}")
                self._stderr_changed.wait(left)

    def all_stderr(self, timeout: float = 10.0) -> list[str]:
        """Every stderr line, once the process has closed stderr (it exited)."""
        self._err_reader.join(timeout)
        if self._err_reader.is_alive():
            raise TimeoutError(f"stderr still open after {timeout}s: {self.stderr_lines}")
        return self.stderr_lines

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> PyxdsProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
