"""What ``train --dry-run`` prints: the config, the values :func:`~.setup.plan` derived, the
learning rates, the notes and the resumed run. Formatting only: every check was made by the plan
``train`` itself runs."""

from __future__ import annotations

from typing import Optional

from ..accounting import params as P
from ..accounting.steps import ramp_start, tokens_through
from ..runtime.device import bytes_to_train
from .schedule import lr_at, wsd_decay_start
from .setup import Plan


def _set(value: object, given: object) -> str:
    return f"{value}" + (" (set)" if given is not None else "")


def _vocab_line(p: Plan) -> Optional[str]:
    stage, mc = p.stage, p.given.model
    if mc.vocab_size is not None:
        return None  # shown in the config
    if stage.tok is not None and not stage.trained:
        return f"  model.vocab_size      {p.vocab_size} (from {stage.tok_path})"
    if p.vocab_size is None:
        return f"  model.vocab_size      from the tokenizer, trained into {stage.tok_path} at the first run"
    source = "the corpus's characters" if stage.tok is not None else "tokenizer.vocab_size"
    return f"  model.vocab_size      {p.vocab_size} ({source}; trained into {stage.tok_path} at the first run)"


def _split_line(p: Plan) -> str:
    if p.stage.waits is None:
        n_train, n_val = p.stage.data.counts
        return (
            f"  train/val tokens      {n_train:,} / {n_val:,} (data.val_fraction {p.cfg.data.val_fraction:g}; "
            f"each needs model.block_size+1 = {p.cfg.model.block_size + 1:,})"
        )
    return f"  train/val tokens      not known yet: {p.stage.waits}, then checks the split"


def unchecked(p: Plan) -> list[str]:
    """The checks ``train`` makes that this dry run does not (what needs the missing tokenizer or
    corpus, what only training reads), each with the reason: none passes silently."""
    given, stage, why = p.given, p.stage, p.stage.waits
    waiting = [
        (
            f"model.vocab_size {given.model.vocab_size} against the tokenizer's size",
            stage.tok is None and given.model.vocab_size is not None,
        ),
        (
            "sample.prompt against the tokenizer's vocabulary",
            stage.tok is None and given.sample.prompt,
        ),
        (
            "tokenizer.vocab_size against the corpus's characters",
            stage.corpus is None and given.tokenizer.kind in ("unigram", "wordpiece"),
        ),
        ("the corpus against the resumed run's", stage.corpus is None and p.resumed is not None),
        (
            "the corpus against data.fingerprint",
            stage.corpus is None and given.data.fingerprint is not None,
        ),
    ]
    out = [(what, why) for what, unknown in waiting if unknown and why is not None]
    if p.resumed is not None:
        out.append(
            (
                "that no other train holds the run's lock, and that its weights load into the model",
                "a dry run takes no lock and builds no model (their checksum is checked)",
            )
        )
    elif given.model.init_from is not None:
        out.append((f"the weights in {given.model.init_from}", "a dry run loads no weights"))
    return [f"  not checked: {what} ({reason})" for what, reason in out]


def describe_derived(p: Plan) -> list[str]:
    """The values the config leaves to be derived (null keys), as :func:`~.setup.plan` resolved
    them."""
    cfg, mc, tc = p.cfg, p.cfg.model, p.cfg.train
    dtype = str(p.dtype).removeprefix("torch.")
    lines = [
        'derived values ("(set)": given in the config):',
        f"  device, dtype         {p.device}, {dtype}"
        + (" (set)" if (cfg.device, cfg.dtype) != ("auto", "auto") else ""),
        *filter(None, [_vocab_line(p)]),
        _split_line(p),
        f"  model.d_ff            {_set(mc.ffn_hidden, mc.d_ff)}",
        f"  model.n_kv_head       {_set(mc.kv_heads, mc.n_kv_head)}",
        f"  head size             {mc.head_dim}",
        f"  sample.window_stride  {_set(cfg.sample.window_stride or max(1, mc.block_size // 4), cfg.sample.window_stride)}",
        f"  train.lr_decay_iters  {_set(tc.lr_decay_iters or tc.max_iters, tc.lr_decay_iters)}",
    ]
    if tc.batch_size_warmup_iters:
        start = _set(ramp_start(tc), tc.batch_size_warmup_start)
        lines.append(
            f"  batch-size ramp       {start} to {tc.batch_size} sequences, linearly over "
            f"{tc.batch_size_warmup_iters:,} steps"
        )
    if tc.block_size_warmup_iters:
        m = tc.block_size_warmup_multiple
        lines.append(
            f"  sequence warmup       windows of {m} to {mc.block_size} tokens in steps of {m}, "
            f"over {tc.block_size_warmup_iters:,} steps"
        )
    if tc.batch_size_warmup_iters or tc.block_size_warmup_iters:
        full = tc.max_iters * tc.batch_size * mc.block_size * tc.grad_accum_steps
        lines.append(
            f"  tokens to train       {tokens_through(tc.max_iters, cfg):,} per process "
            f"({full:,} without the ramps)"
        )
    need, _ = bytes_to_train(mc, dtype, tc.batch_size, tc.optimizer)
    if p.vocab_size is not None or p.given.model.vocab_size is not None:
        lines.append(f"  parameters            {P.count(mc).total:,}")
        lines.append(
            f"  memory to train       about {P.human_bytes(need)} ({dtype}, batch {tc.batch_size})"
        )
    else:
        lines.append(
            f"  memory to train       about {P.human_bytes(need)} ({dtype}, batch {tc.batch_size}; "
            f"counted with {mc.vocab_size} entries, as count-params counts, until the tokenizer is "
            "trained)"
        )
    if p.estimate:
        lines.append(f"  time to train         {p.estimate[0]}")
    return lines + unchecked(p)


def describe_schedule(p: Plan, points: int = 8) -> str:
    """The config, the derived values, the learning rate at a few steps, the notes and, with
    ``--resume``, what the resume would do."""
    tc = p.cfg.train
    wsd = [wsd_decay_start(tc)] if tc.lr_schedule == "wsd" else []  # where the decay starts
    steps = sorted(
        {
            0,
            max(tc.warmup_iters - 1, 0),
            tc.warmup_iters,
            tc.max_iters // 4,
            tc.max_iters // 2,
            3 * tc.max_iters // 4,
            max(tc.max_iters - 1, 0),
            *wsd,
        }
    )
    steps = [s for s in steps if 0 <= s < max(tc.max_iters, 1)][: points + len(wsd)]
    muon = (
        f"; Muon's: these x {tc.muon.learning_rate / tc.learning_rate:g}"
        if tc.optimizer == "muon"
        else ""
    )
    lines = [
        p.given.to_yaml().rstrip(),
        "",
        *describe_derived(p),
        "",
        f"learning rate ({tc.lr_schedule}, warmup {tc.warmup_iters}{muon}):",
    ]
    lines += [f"  step {s:>7,}: {lr_at(s, tc, p.cfg.model.n_embd):.3e}" for s in steps]
    notes = p.notes + p.estimate[1:]  # the CPU recipe's note with the config's
    lines += [""] + notes if notes else []
    if p.resumed is not None:
        lines += ["", *p.resumed.describe()]
    elif p.resume is not None:
        lines += [
            "",
            f"--resume auto: no run named {p.cfg.name!r} under {tc.out_dir}/ yet; a new run would start",
        ]
    return "\n".join(lines)
