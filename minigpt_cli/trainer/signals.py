"""Stopping a run cleanly: SIGINT, SIGTERM and SIGHUP become a flag the loop checks."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional


class CutShort(Exception):
    """A stop request inside work that a stop throws away anyway (:meth:`StopFlag.cutting`)."""


class StopFlag:
    """SIGINT/SIGTERM/SIGHUP set a flag the loop checks between steps and eval batches; a second
    Ctrl-C aborts at once. Inside :meth:`cutting` (an eval) a stop also cuts the work short at once,
    not after its batch."""

    def __init__(self):
        self.signal: Optional[str] = None
        self.signum: int = signal.SIGINT
        self._old: dict[int, Any] = {}
        self._cut = False

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
        if self._cut:
            self._cut = False
            raise CutShort  # between two of the forward's operations: one eval batch can take minutes

    @contextmanager
    def cutting(self, enabled: bool = True) -> Iterator[None]:
        """While inside, a stop request raises :class:`CutShort` at once, which this swallows: for
        work that leaves no state behind (an eval) and runs in one process (other ranks would wait
        in a collective)."""
        self._cut = enabled
        try:
            yield
        except CutShort:
            pass
        finally:
            self._cut = False

    def __exit__(self, exc_type, exc, tb):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False
