"""A child process whose output a test reads line by line, for the tests that run real
processes (``meshbus run``, a node in a script of its own)."""

from __future__ import annotations

import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

WAIT = 30.0  # seconds any one step may take before the test gives up


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a child's listener)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Child:
    """``args`` running in ``cwd``; standard output and error are read by two threads.

    :param stdin: give the child a pipe on standard input, which :meth:`finish` closes
        to ask it to stop.
    """

    def __init__(self, args: list[str], cwd: Path, *, stdin: bool = False) -> None:
        self.process = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout.put)),
            threading.Thread(target=self._read, args=(self.process.stderr, self._stderr)),
        ]
        for reader in self._readers:
            reader.start()

    def _stderr(self, line: str | None) -> None:
        if line is not None:
            self.stderr_lines.append(line)

    @staticmethod
    def _read(stream: IO[str], put: Callable[[str | None], object]) -> None:
        try:
            for line in stream:
                put(line.rstrip("\n"))
        except (OSError, ValueError):  # closed under us when the test gives up
            pass
        finally:
            put(None)

    def next_line(self, deadline: float) -> str | None:
        """The next line of standard output; ``None`` at its end."""
        try:
            line = self.stdout.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(
                f"no output in time; so far: {self.stdout_lines}, stderr: {self.stderr_lines}"
            ) from None
        if line is not None:
            self.stdout_lines.append(line)
        return line

    def wait_for(self, prefix: str, count: int = 1, timeout: float = WAIT) -> list[str]:
        """Read standard output until ``count`` lines starting with ``prefix`` came."""
        deadline = time.monotonic() + timeout
        found: list[str] = []
        while len(found) < count:
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(
                    f"exited ({self.process.wait(WAIT)}) before {prefix!r}: "
                    f"stdout {self.stdout_lines}, stderr {self.stderr_lines}"
                )
            if line.startswith(prefix):
                found.append(line)
        return found

    def finish(self, signum: int | None = None) -> int:
        """Send ``signum``, or close standard input if the child has a pipe there; read
        everything and return the exit status."""
        if signum is not None:
            self.process.send_signal(signum)
        elif self.process.stdin is not None:
            self.process.stdin.close()
        status = self.process.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while self.next_line(deadline) is not None:
            pass
        for reader in self._readers:
            reader.join(WAIT)
        return status

    def close(self) -> None:
        """Kill it if it still runs, and stop reading."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(WAIT)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        for reader in self._readers:
            reader.join(WAIT)
