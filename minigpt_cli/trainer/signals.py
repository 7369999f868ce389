"""Stopping a run cleanly: SIGINT, SIGTERM and SIGHUP become a flag the loop checks."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional


class StopFlag:
    """SIGINT/SIGTERM/SIGHUP set a flag the loop checks between steps and eval batches; a second Ctrl-C aborts at once."""

    def __init__(self):
        self.signal: Optional[str] = None
        self.signum: int = signal.SIGINT
        self._old: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set handlers (a run inside some test runners)
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name
        self.signum = int(signum)

    def __exit__(self, exc_type, exc, tb):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False
