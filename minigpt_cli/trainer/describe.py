"""What ``train --dry-run`` prints: the resolved config, the derived values and the learning rates."""

from __future__ import annotations

from pathlib import Path

from .. import params as P
from ..config import Config
from ..errors import MinigptError
from ..paths import default_tokenizer_path
from ..runtime import bytes_to_train
from ..tokenizer import load_tokenizer
from .schedule import lr_at


def describe_derived(cfg: Config) -> list[str]:
    """The values the config leaves to be derived (null keys), as ``--dry-run`` shows them.

    ``model.vocab_size`` comes from the tokenizer file when it exists already
    (it is trained at the first ``train`` otherwise); with it, the parameter
    count and the memory estimate of :func:`check_memory` follow.
    """
    mc, tc = cfg.model, cfg.tokenizer
    lines = ["derived values (\"(set)\": given in the config):"]
    vocab = mc.vocab_size
    if vocab is None:
        path = (Path(tc.path) if tc.path else
                default_tokenizer_path(cfg.data.data_dir, cfg.data.dataset, tc.kind, tc.vocab_size, tc.special_tokens))
        if path.is_file():
            try:
                vocab = load_tokenizer(path).vocab_size
                lines.append(f"  model.vocab_size      {vocab} (from {path})")
            except MinigptError as exc:
                lines.append(f"  model.vocab_size      unknown: {exc}")
        else:
            lines.append(f"  model.vocab_size      from the tokenizer, trained into {path} at the first run")
    lines.append(f"  model.d_ff            {mc.ffn_hidden}" + (" (set)" if mc.d_ff is not None else ""))
    lines.append(f"  model.n_kv_head       {mc.kv_heads}" + (" (set)" if mc.n_kv_head is not None else ""))
    lines.append(f"  head size             {mc.head_dim}")
    lines.append(f"  sample.window_stride  {cfg.sample.window_stride or max(1, mc.block_size // 4)}"
                 + (" (set)" if cfg.sample.window_stride is not None else ""))
    lines.append(f"  train.lr_decay_iters  {cfg.train.lr_decay_iters or cfg.train.max_iters}"
                 + (" (set)" if cfg.train.lr_decay_iters is not None else ""))
    if vocab is not None:
        mcv = mc.model_copy(update={"vocab_size": vocab})
        dtype = "float32" if cfg.dtype == "auto" else cfg.dtype
        need, _ = bytes_to_train(mcv, dtype, cfg.train.batch_size)
        lines.append(f"  parameters            {P.count(mcv).total:,}")
        lines.append(f"  memory to train       about {P.human_bytes(need)} ({dtype}, batch {cfg.train.batch_size})")
    return lines


def describe_schedule(cfg: Config, points: int = 8) -> str:
    """The resolved config, the values it leaves to be derived, and the learning rate at a few steps (for ``--dry-run``)."""
    tc = cfg.train
    steps = sorted({0, max(tc.warmup_iters - 1, 0), tc.warmup_iters, tc.max_iters // 4, tc.max_iters // 2,
                    3 * tc.max_iters // 4, max(tc.max_iters - 1, 0)})
    steps = [s for s in steps if 0 <= s < max(tc.max_iters, 1)][:points]
    lines = [cfg.to_yaml().rstrip(), "", *describe_derived(cfg), "",
             f"learning rate ({tc.lr_schedule}, warmup {tc.warmup_iters}):"]
    lines += [f"  step {s:>7,}: {lr_at(s, tc, cfg.model.n_embd):.3e}" for s in steps]
    return "\n".join(lines)
