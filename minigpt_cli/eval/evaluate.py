"""The ``evaluate`` command as a function: a checkpoint's loss, perplexity and bits per byte.

By default the windows the run's own eval read at the checkpoint's step
(:func:`~.data.pipeline.eval_offsets`), so the result is the logged ``val_loss`` again; ``full``
scores every token of the split once, by windows of ``block_size`` advancing by ``stride``
(transformers' "Perplexity of fixed-length models", sliding window); a text file is scored the same
way. ``lm-eval`` windows are lm-evaluation-harness's ``loglikelihood_rolling``
(:func:`lm_eval_windows`): the export's begin token before the text, every token scored, in disjoint
windows of ``block_size`` that each see only the token before them, so its bits per byte are
lm-eval's, and higher than ``full``'s. Loss is in nats per token; bits per byte, ``loss · tokens /
(ln 2 · UTF-8 bytes)``, compares models across tokenizers."""

from __future__ import annotations

import math
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.pipeline import (
    check_corpus,
    configured_corpus,
    eval_offsets,
    eval_seed,
    full_eval_batches,
    full_windows,
    run_corpus_config,
    span_batch,
    windows,
)
from ..data.preparation import prepare
from ..errors import MinigptError
from ..fileio import read_text_file
from ..run import folder as runs
from ..runtime.device import resolve_device
from ..runtime.distributed import Dist
from ..sample.load import load_run
from ..sample.sampling import encode_prompt
from ..trainer.step import estimate_loss

#: Tokens decoded at a time when counting a split's bytes and characters.
DECODE_CHUNK = 1 << 20


def text_size(tok, ids: np.ndarray) -> tuple[int, int]:
    """UTF-8 bytes and characters of the text ``ids`` decode to, decoded :data:`DECODE_CHUNK` tokens
    at a time."""
    n_bytes = n_chars = 0
    for start in range(0, len(ids), DECODE_CHUNK):
        text = tok.decode(ids[start : start + DECODE_CHUNK].tolist())
        n_bytes, n_chars = n_bytes + len(text.encode("utf-8")), n_chars + len(text)
    return n_bytes, n_chars


def split_tokens(
    cfg,
    tok,
    split: str,
    run_dir: Path,
    echo: Callable[[str], None] = lambda m: None,
    progress: Optional[bool] = False,
) -> np.ndarray:
    """The token ids of ``split`` of the run's corpus under its tokenizer (prepared again if gone).
    Raises MinigptError: the corpus cannot be found or fetched, or changed since the run trained on
    it."""
    corpus, root = configured_corpus(cfg, echo, progress)
    check_corpus(cfg, corpus, run_dir)
    return getattr(
        prepare(corpus, tok, root, cfg.data.val_fraction, log=echo, progress=progress), split
    )


def lm_eval_windows(n_tokens: int, block_size: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, scored) of lm-eval's rolling windows over a begin token and ``n_tokens`` tokens
    after it (indices count the begin token as 0), as :func:`full_windows` gives them: every token
    after the begin token is scored once. lm-evaluation-harness's ``get_rolling_token_windows`` with
    ``context_len=1``, then ``make_disjoint_window`` (``lm_eval/utils.py``): the first window reads
    the begin token and the first ``block_size - 1`` tokens; each next scores the next
    ``block_size`` tokens (the last: those left), reading the ``block_size`` before its last one, so
    a full window's first token sees only the token before it."""
    first = min(block_size, n_tokens)
    yield 0, first + 1, first
    done = first
    while done < n_tokens:
        scored = min(n_tokens - done, block_size)
        end = done + scored + 1  # in the sequence that starts with the begin token
        yield end - block_size - 1, end, scored
        done += scored


def _score_full(
    model,
    tokens: np.ndarray,
    spans: list[tuple[int, int, int]],
    batch_size: int,
    device: torch.device,
    progress: Optional[bool],
) -> float:
    """The summed loss in nats of the tokens ``spans`` score (:func:`full_windows`, ...)."""
    total = torch.zeros((), dtype=torch.float64)
    bar = tqdm(
        total=len(spans),
        desc="evaluate",
        unit="window",
        disable=None if progress is None else not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    with torch.no_grad(), bar:
        for i in range(0, len(spans), batch_size):
            group = spans[i : i + batch_size]
            x, y = span_batch(tokens, group, device)
            logits, _ = model(x)
            total += (
                F.cross_entropy(
                    logits.float().flatten(0, 1),
                    y.flatten(),
                    ignore_index=-1,
                    reduction="sum",
                )
                .double()
                .cpu()
            )
            bar.update(len(group))
    return float(total)


def _training_eval(
    model, cfg, tokens: np.ndarray, split: str, step: int, world: int, device: torch.device
) -> tuple[float, int]:
    """The mean loss of the windows the run's eval read at ``step`` (the whole val split with
    ``train.eval_full_val``), and the number of tokens scored."""
    tc, T = cfg.train, cfg.model.block_size
    if split == "val" and tc.eval_full_val:
        batches = full_eval_batches(tokens, T, tc.batch_size, 0, 1, device)
        return estimate_loss(model, {split: batches}, nullcontext(), Dist())[split], len(tokens) - 1
    n_windows = tc.eval_iters * tc.batch_size * tc.grad_accum_steps * world
    offsets = torch.cat(
        list(eval_offsets(len(tokens), T, n_windows, eval_seed(cfg.seed, split, step)))
    )
    batches = (
        windows(tokens, offsets[i : i + tc.batch_size], T, device)
        for i in range(0, n_windows, tc.batch_size)
    )
    return estimate_loss(model, {split: batches}, nullcontext(), Dist())[split], n_windows * T


def evaluate(
    run: Optional[str | Path] = None,
    *,
    checkpoint: str = runs.BEST,
    split: Optional[str] = None,
    text_file: Optional[str | Path] = None,
    full: bool = False,
    windows: Optional[str] = None,
    stride: Optional[int] = None,
    batch_size: int = 8,
    device: str = "auto",
    progress: Optional[bool] = None,
    echo: Callable[[str], None] = lambda message: None,
    ema: bool = True,
) -> dict:
    """Score a run's checkpoint (``run``: default the newest) on a ``split`` or ``text_file``.

    ``windows``: ``eval`` (the training eval's; the default for a split), ``full`` (as
    ``full=True``; the default for ``text_file``) or ``lm-eval`` (:func:`lm_eval_windows`, with the
    export's begin token, :func:`~minigpt_cli.hf.export.begin_token`). ``stride``: tokens each
    full-scoring window advances (default ``block_size // 2``). Returns ``loss`` (nats per token),
    ``perplexity`` (inf past a float's range), ``bits_per_byte``, ``bits_per_char``, ``tokens``,
    ``bytes``, ``chars``, ``step``, ``checkpoint``, ``mode``, ``source``, ``stride``,
    ``logged_loss`` (the run's own loss of the same measurement, else None), ``block_size``,
    ``run``, ``weights`` (``ema``: a run trained with ``train.ema_decay`` scored with its moving
    average, unless ``ema`` is False; else ``raw``). Raises MinigptError: no run or checkpoint,
    arguments that conflict or are out of range, an unreadable or unencodable file, a corpus gone
    or changed since training, too few tokens."""
    dev = resolve_device(device)
    loaded = load_run(run, checkpoint, dev, ema=ema)
    model, cfg, tok, run_dir, ckpt = (
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        loaded.run_dir,
        loaded.checkpoint,
    )
    meta = runs.read_meta(ckpt)
    T = cfg.model.block_size
    # The arguments, checked once the run's block_size is known and before any corpus is read.
    if split is not None and text_file is not None:
        raise MinigptError("pass either --split or --text-file, not both")
    if windows not in (None, "eval", "full", "lm-eval"):
        raise MinigptError(f"--windows {windows!r}: use eval, full or lm-eval")
    if windows == "eval" and text_file is not None:
        raise MinigptError(
            "--windows eval reads the run's own eval windows of a split, not a --text-file; "
            "use --windows full or lm-eval"
        )
    if windows == "lm-eval" and (full or stride is not None):
        raise MinigptError(
            "--windows lm-eval fixes its windows (lm-eval's, of block_size); "
            "drop --full and --stride"
        )
    full = full or windows == "full"
    if stride is not None and not full and text_file is None:
        raise MinigptError(
            "--stride sets the windows of --full (and --text-file); "
            "the training eval's windows are fixed: add --full"
        )
    if (split or "val") not in ("train", "val"):
        raise MinigptError(f"--split {split!r}: use train or val")
    if stride is not None and not 1 <= stride <= T:
        raise MinigptError(f"--stride {stride} must be between 1 and the run's block_size ({T})")
    split = split or "val"
    stride = (T // 2 or 1) if stride is None else stride
    if text_file is not None:
        text = read_text_file(
            text_file, "--text-file"
        )  # as generate reads --prompt-file; bytes: of the text as read
        # An empty file holds no token: refused below, as a split too short is.
        tokens = np.asarray(
            encode_prompt(tok, text, f"{text_file}") if text else [], dtype=np.int64
        )
        n_bytes, n_chars, source, full = len(text.encode("utf-8")), len(text), str(text_file), True
    else:
        tokens = split_tokens(run_corpus_config(cfg, run_dir), tok, split, run_dir, echo, progress)
        n_bytes, n_chars = text_size(tok, tokens)
        source = split
    if len(tokens) < (1 if windows == "lm-eval" else 2):
        raise MinigptError(
            f"{source} holds {len(tokens)} token(s); scoring needs at least 2 (a token and its next)"
        )
    note = loaded.weights_note()
    if note is not None:  # once the arguments passed: an error stays one line
        echo(note)
    model.eval()
    logged = None
    if windows == "lm-eval":
        from ..hf.export import begin_token

        # lm-eval scores every token, the first after the begin token the export names.
        tokens = np.concatenate([[begin_token(tok)[1]], tokens]).astype(np.int64)
        spans = list(lm_eval_windows(len(tokens) - 1, T))
        n_scored = len(tokens) - 1
        loss = _score_full(model, tokens, spans, batch_size, dev, progress) / n_scored
    elif full:
        n_scored = len(tokens) - 1
        spans = list(full_windows(len(tokens), T, stride))
        loss = _score_full(model, tokens, spans, batch_size, dev, progress) / n_scored
        if text_file is None:  # the scored text is the split's, less its first token
            n_bytes, n_chars = (
                a - b for a, b in zip((n_bytes, n_chars), text_size(tok, tokens[:1]))
            )
    else:
        world = meta.get("world_size", 1)
        loss, n_scored = _training_eval(model, cfg, tokens, split, meta.get("step", 0), world, dev)
        # The run's evals scored its EMA weights when it kept them: the raw ones differ.
        if meta.get("eval_step") == meta.get("step") and loaded.ema == loaded.has_ema:
            logged = meta.get(f"{split}_loss")
    counted = (
        n_scored if full or windows == "lm-eval" else len(tokens)
    )  # the eval's windows: converted at the split's tokens per byte
    nats_per = loss * counted / n_bytes, loss * counted / n_chars
    return {
        "run": str(run_dir),
        "checkpoint": ckpt.name,
        "step": meta.get("step"),
        "source": source,
        "mode": windows if windows == "lm-eval" else "full" if full else "eval",
        "loss": loss,
        "perplexity": math.exp(loss)
        if loss < 709.0
        else math.inf,  # exp overflows a float past 709.78
        "bits_per_byte": nats_per[0] / math.log(2),
        "bits_per_char": nats_per[1] / math.log(2),
        "tokens": n_scored,
        "bytes": n_bytes,
        "chars": n_chars,
        "split_tokens": len(tokens),
        "block_size": T,
        "stride": stride if full and windows != "lm-eval" else None,
        "logged_loss": logged,
        "weights": "ema" if loaded.ema else "raw",
    }


def _per_unit(r: dict) -> list[str]:
    """The bits per byte and per character lines, saying what they were measured on: the scored text
    itself (``full``), or the training eval's tokens converted at the split's own tokens per
    byte."""
    if r["mode"] in ("full", "lm-eval"):
        return [
            f"  bits per byte   {r['bits_per_byte']:.4f} ({r['bytes']:,} bytes)",
            f"  bits per char   {r['bits_per_char']:.4f} ({r['chars']:,} characters)",
        ]
    at = f"the {r['tokens']:,} scored tokens, at the split's {{:.3f}} tokens per {{}}"
    return [
        f"  bits per byte   {r['bits_per_byte']:.4f} ({at.format(r['split_tokens'] / r['bytes'], 'byte')})",
        f"  bits per char   {r['bits_per_char']:.4f} ({at.format(r['split_tokens'] / r['chars'], 'character')})",
    ]


def format_evaluation(r: dict) -> str:
    """The text form of :func:`evaluate`'s result."""
    how = {
        "full": f"every token once, windows of {r['block_size']} advancing by {r['stride']}",
        "lm-eval": f"lm-eval's rolling windows of {r['block_size']} after the begin token",
        "eval": "the training eval's windows",
    }[r["mode"]]
    lines = [
        f"{r['run']} ({r['checkpoint']}, step {r['step']}"
        f"{', EMA weights' if r.get('weights') == 'ema' else ''}) on {r['source']}: {how}",
        f"  loss            {r['loss']:.6f} nats/token over {r['tokens']:,} tokens",
        f"  perplexity      {r['perplexity']:.4f}",
        *_per_unit(r),
    ]
    if r["logged_loss"] is not None:
        lines.append(
            f"  logged          {r['logged_loss']:.6f} (the run's {r['source']}_loss at step {r['step']})"
        )
    return "\n".join(lines)
