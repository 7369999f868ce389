"""What the loop reads from the host only at log intervals: the steps skipped as non-finite
(:class:`Skips`), and a stop request or the time budget agreed over the ranks (:class:`Stops`).
Between two reads the step stays on the device: no ``.item()``, ``bool()`` or object broadcast per
step (STYLE.md, habit 18)."""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from ..runtime.distributed import Dist, all_max
from .signals import StopFlag

#: Consecutive non-finite steps after which a run stops.
MAX_NONFINITE = 5


class Skips:
    """The steps whose loss or gradient was not finite (their update skipped on the device), read at
    log intervals: each is logged, and :data:`MAX_NONFINITE` in a row stop the run.

    :meth:`record` keeps a step's two 0-dim device tensors; :meth:`read` takes the host's one look
    at all those kept since the last read (one ``tolist``), so the count is exact whatever the
    interval."""

    def __init__(self, log: Callable[[str], None], diverged: Callable[[int, int], Exception]):
        self.log = log
        self.diverged = diverged  # the error for MAX_NONFINITE skipped steps, first to last
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        #: Non-finite steps in a row up to the last step read, and how many were skipped in all.
        self.in_a_row, self.total = 0, 0

    def record(self, step: int, loss: torch.Tensor, skipped: torch.Tensor) -> None:
        """Keep step ``step``'s mean loss and skip flag (1.0: skipped) for the next :meth:`read`."""
        self.pending.append((step, loss, skipped))

    def read(self) -> Optional[bool]:
        """Log each skipped step since the last read; whether the latest step was skipped (None:
        none kept).

        Raises:
            MinigptError: :data:`MAX_NONFINITE` steps in a row were skipped (``diverged``'s error,
                which names them and says what to change).
        """
        if not self.pending:
            return None
        steps = [step for step, _, _ in self.pending]
        flat = torch.stack([torch.stack([loss.float(), skip]) for _, loss, skip in self.pending])
        rows = flat.tolist()  # the one host read of the interval
        self.pending = []
        for step, (loss, skipped) in zip(steps, rows):
            if not skipped:
                self.in_a_row = 0
                continue
            self.in_a_row += 1
            self.total += 1
            self.log(f"step {step}: non-finite loss or gradient ({loss}); step skipped")
            if self.in_a_row == MAX_NONFINITE:
                raise self.diverged(step - MAX_NONFINITE + 1, step)
        return bool(rows[-1][1])


class Stops:
    """A stop request (SIGINT/SIGTERM/SIGHUP) and ``train.max_seconds``, as every rank sees them.

    One process asks its own flag and clock at every step (no collective). Under torchrun the ranks
    agree in :meth:`agree`, which the loop calls at log intervals: one MAX all-reduce of two numbers
    (a stop on any rank; rank 0's clock, as metrics.jsonl's ``elapsed_s`` is rank 0's); between two
    agreements the answers are the last agreed ones, the same on every rank, so that all stop at the
    same step."""

    def __init__(
        self,
        flag: StopFlag,
        dist: Dist,
        device: torch.device,
        max_seconds: Optional[float],
        t0: float,
    ):
        self.flag, self.dist, self.device = flag, dist, device
        self.max_seconds, self.t0 = max_seconds, t0
        self.agreed_stop, self.agreed_late = False, False

    def _late(self) -> bool:
        return self.max_seconds is not None and time.perf_counter() - self.t0 >= self.max_seconds

    def agree(self) -> None:
        """Under torchrun, take the ranks' stop requests and rank 0's clock into the agreed
        answers."""
        if not self.dist.enabled:
            return
        mine = [float(self.flag.signal is not None), float(self.dist.main and self._late())]
        agreed = all_max(torch.tensor(mine, device=self.device), self.dist).tolist()
        self.agreed_stop, self.agreed_late = agreed[0] > 0, agreed[1] > 0

    def stop_requested(self) -> bool:
        """Whether a signal asked to stop (under torchrun: as last agreed)."""
        return self.agreed_stop if self.dist.enabled else self.flag.signal is not None

    def out_of_time(self) -> bool:
        """Whether ``train.max_seconds`` has passed on the run's clock (under torchrun: as last
        agreed)."""
        return self.agreed_late if self.dist.enabled else self._late()
