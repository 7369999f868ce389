"""Opening a finished run: its model (eval mode), tokenizer and config, checked against each other.

The one way ``generate``, ``evaluate``, ``inspect`` and a Python script open a run, as nanoGPT's
``sample.py`` and ``transformers``' ``from_pretrained`` hand back a model and its tokenizer::

    run = load_run("runs/tiny")
    logits, _ = run.model(torch.tensor([run.tokenizer.encode("ROMEO:")]))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ..config.schema import Config
from ..errors import MinigptError
from ..model.gpt import GPT
from ..run import folder as runs
from ..run.checkpoint import has_ema, load_model
from ..runtime.device import resolve_device
from ..runtime.kernels import swap as swap_kernels
from ..tokenizer.kinds import Tokenizer, load_run_tokenizer


@dataclass(frozen=True)
class LoadedRun:
    """A trained run, opened: ``run.model(ids)`` gives (logits (B, T, V), None);
    ``run.tokenizer.encode(text)`` ids."""

    model: GPT
    tokenizer: Tokenizer
    config: Config
    run_dir: Path
    checkpoint: (
        Path  # the checkpoint folder read: ``best`` falls back to ``last`` before the first eval
    )
    step: Optional[
        int
    ]  # the optimizer step it was saved at; None for checkpoints whose meta.json lacks it
    ema: bool = False  # the weights are the moving average the run kept (train.ema_decay)
    # The checkpoint holds that average (with ema False: the raw weights were asked for).
    has_ema: bool = False
    raw_asked: bool = False  # --raw-weights was given (a note where the run kept no average)

    def describe(self) -> str:
        """``checkpoint best, step 30`` (the step left out when unknown), ``, EMA weights`` when
        they are the moving average."""
        return (
            f"checkpoint {self.checkpoint.name}"
            + (f", step {self.step}" if self.step is not None else "")
            + (", EMA weights" if self.ema else "")
        )

    def weights_note(self) -> Optional[str]:
        """The line a command says for a run trained with EMA: which weights it uses; for a run
        without, a note where --raw-weights was given, else None."""
        if self.ema:
            decay = self.config.train.ema_decay
            return (
                "using the EMA weights (the moving average of the weights"
                + (f", decay {decay:g}" if decay is not None else "")
                + "); --raw-weights takes the trained weights"
            )
        if self.has_ema:
            return "using the raw trained weights (--raw-weights), not the run's EMA weights"
        if self.raw_asked:
            return (
                "note: --raw-weights has no effect: this run kept no moving average of its weights "
                "(train.ema_decay null), so its trained weights are the only ones"
            )
        return None


def _check_finite(model: torch.nn.Module, ckpt: Path) -> None:
    """Refuse weights holding NaN or infinity (a run that diverged): sampling from them cannot
    work."""
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point() or not tensor.numel():
            continue
        # aminmax reads the weights once, allocating nothing (10x faster than isfinite().all() on
        # the 10.7M model); a NaN anywhere makes both NaN, an infinity makes one of them infinite.
        extremes = torch.stack(torch.aminmax(tensor.view(-1)))
        if not bool(torch.isfinite(extremes).all()):
            other = runs.LAST if ckpt.name == runs.BEST else runs.BEST
            raise MinigptError(
                f"checkpoint {str(ckpt)!r} has NaN or infinite weights ({name}): the run diverged "
                f"before it was saved; try --checkpoint {other}, or retrain with a lower "
                "train.learning_rate"
            )


def _mismatch(tok: Tokenizer, cfg: Config, meta: dict) -> Optional[str]:
    """How the run's tokenizer differs from the one its checkpoint was trained with, cheapest check
    first (the fingerprint hashes the whole vocabulary); None when it does not."""
    if cfg.model.vocab_size < tok.vocab_size:
        return f"{tok.vocab_size} entries for a model of {cfg.model.vocab_size}"
    if tok.kind != cfg.tokenizer.kind:
        return f"a {tok.kind} tokenizer; the run trained with tokenizer.kind {cfg.tokenizer.kind}"
    if meta.get("tokenizer_fingerprint") not in (
        None,
        tok.fingerprint(),
    ):  # None: from before it was recorded
        return "its fingerprint differs"
    return None


def load_run(
    run: Optional[str | Path] = None,
    checkpoint: str = runs.BEST,
    device: str | torch.device = "cpu",
    ema: bool = True,
) -> LoadedRun:
    """The model of a run's checkpoint (eval mode, on ``device``, linear layers on the fastest
    kernel), its config and the run's tokenizer; ``run`` None: the newest run under ``runs/``.
    A run trained with ``train.ema_decay`` gives its EMA weights, unless ``ema`` is False.

    Raises:
        MinigptError: no such run or checkpoint, damaged files, non-finite weights, or a
            tokenizer.json that is not the one the checkpoint was trained with.
    """
    run_dir, ckpt = runs.open_checkpoint(run, checkpoint)
    dev = resolve_device(device) if isinstance(device, str) else device
    averaged = has_ema(ckpt)
    model, cfg = load_model(ckpt, dev, ema=ema)
    swap_kernels(model)
    tok = load_run_tokenizer(run_dir, cfg)
    _check_finite(model, ckpt)
    meta = runs.read_meta(
        ckpt
    )  # refuses a missing or damaged one: it names the tokenizer trained with
    why = _mismatch(tok, cfg, meta)
    if why is not None:
        raise MinigptError(
            f"{run_dir / runs.TOKENIZER} is not the tokenizer this checkpoint was trained with "
            f"({why}); restore the run's own tokenizer.json"
        )
    step = meta.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else None
    return LoadedRun(
        model,
        tok,
        cfg,
        run_dir,
        ckpt,
        step,
        ema=ema and averaged,
        has_ema=averaged,
        raw_asked=not ema,
    )
