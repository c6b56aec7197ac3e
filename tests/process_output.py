"""A running process's output, read line by line as it comes: a test waits for the line
that says something happened (``PYTHONUNBUFFERED=1`` in the process's environment)."""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Any


class Output:
    """A running process's output lines, read as they come (two threads)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self.threads = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (process.stdout, process.stderr)
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def starting(self, text: str) -> list[str]:
        return [line for line in list(self.lines) if line.startswith(text)]

    def tail(self) -> str:
        return "\n".join(self.lines[-40:])

    def stop(self, timeout: float = 30) -> str:
        """SIGTERM; all its output once it exited (an exit code other than 0 fails)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        for thread in self.threads:
            thread.join(10)
        assert code == 0, f"exit {code}\n{self.tail()}"
        return "\n".join(self.lines)
