"""What ``train --dry-run`` prints: the resolved config, the derived values, the learning rates and the notes.

A dry run refuses what ``train`` would refuse before step 0, with the same
message, wherever it can know without downloading or training anything: the
device and dtype, the TensorBoard package, the tokenizer file, the train and
val split against ``model.block_size``, ``model.vocab_size`` against the
tokenizer's, ``sample.prompt`` against the tokenizer
(:func:`~minigpt_cli.sample.sampling.encode_prompt`), and the memory estimate
against the free memory; the CLI's dry run first checks the paths ``train``
would write (:func:`~.preflight.check_paths`). What it cannot
know yet (the corpus is not downloaded, a trained tokenizer not trained) it
says in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..accounting import params as P
from ..config.schema import Config
from ..data.corpus import Corpus
from ..data.pipeline import (
    TOKENIZER_TRAIN_CHARS,
    corpus_on_disk,
    load_configured_tokenizer,
    tokenizer_path,
    training_texts,
    with_vocab,
)
from ..data.preparation import check_split_counts, prepared_meta, split_counts
from ..paths import corpus_path, dataset_dir
from ..runtime import distributed as parallel
from ..runtime.device import Dist, bytes_to_train, check_memory, resolve_device, resolve_dtype
from ..sample.sampling import encode_prompt
from ..tokenizer.kinds import Tokenizer
from ..tokenizer.training import MAX_VOCAB_SIZE, check_vocab_size, train_tokenizer
from .resume import check_corpus
from .schedule import lr_at
from .setup import config_notes

#: A corpus larger than this (bytes) is not encoded by a dry run when no prepared files give its split.
PREVIEW_BYTES = 64 << 20


@dataclass
class DataPreview:
    """What ``train``'s data steps would find (:func:`preview`).

    ``tokenizer``: from its file, or (char) built in memory as ``train`` would
    train it (``trained_now``); None when there is no file and it cannot be
    built yet. ``vocab_size``: the tokenizer's, or for a trained kind not
    trained yet ``tokenizer.vocab_size`` (what a training that succeeds gives);
    None: not known yet. ``split``: (train, val) tokens; None until the corpus
    is on disk and the tokenizer exists.
    """

    corpus: Path | str
    corpus_ok: bool
    tokenizer_path: Path
    tokenizer: Optional[Tokenizer] = None
    trained_now: bool = False
    vocab_size: Optional[int] = None
    split: Optional[tuple[int, int]] = None
    root: Optional[Path] = None  # the corpus's folder of tokenizers and token files
    source: Optional[Corpus] = None
    too_big: bool = False  # not prepared yet, and too large to encode for a preview


def preview(cfg: Config) -> DataPreview:
    """Check the corpus, tokenizer and split as ``train`` would before step 0, writing nothing.

    The corpus counts only when it is on disk and passes its checksum
    (``train`` downloads it otherwise). An existing tokenizer file must agree
    with the config; a missing char tokenizer is built in memory (a few
    hundredths of a second); a missing trained one is not trained, only its
    ``tokenizer.vocab_size`` checked. The split sizes come from prepared
    files or from encoding the corpus (:func:`~minigpt_cli.data.pipeline.split_counts`).

    Raises:
        MinigptError: the error ``train`` would raise: a tokenizer file that
            disagrees with the config, an impossible ``tokenizer.vocab_size``,
            text the tokenizer cannot encode, or a split shorter than
            ``model.block_size + 1`` tokens (:func:`~minigpt_cli.data.splits.check_split_counts`).
    """
    tc, dc = cfg.tokenizer, cfg.data
    corpus = corpus_on_disk(cfg)  # what train refuses: nothing at data.path, an empty file
    root = corpus.folder(dc.data_dir) if dc.path is not None else dataset_dir(dc.data_dir, dc.dataset)
    if corpus is not None:
        check_corpus(cfg, None, corpus)
    path = tokenizer_path(cfg, root)
    p = DataPreview(dc.path or corpus_path(dc.data_dir, dc.dataset), corpus is not None, path, root=root,
                    source=corpus)
    if path.is_file():
        p.tokenizer = load_configured_tokenizer(cfg, path)
    if p.tokenizer is None and tc.kind != "char":
        # The refusals that do not depend on the text (no size, one above the largest, bpe's 256 bytes) hold
        # without the corpus; the others need its characters.
        if corpus is not None or tc.kind == "bpe" or tc.vocab_size is None or tc.vocab_size > MAX_VOCAB_SIZE:
            text = "".join(training_texts(corpus, tc.special_tokens, TOKENIZER_TRAIN_CHARS)) \
                if corpus is not None and tc.kind != "bpe" else ""
            check_vocab_size(tc.kind, text, tc.vocab_size, tc.special_tokens)
        p.vocab_size = tc.vocab_size
        return p
    if p.tokenizer is None and corpus is not None:
        p.tokenizer = train_tokenizer("char", training_texts(corpus, tc.special_tokens), None, tc.special_tokens)
        p.trained_now = True
    p.vocab_size = p.tokenizer.vocab_size if p.tokenizer is not None else None
    if p.tokenizer is not None and corpus is not None:
        if corpus.size > PREVIEW_BYTES and prepared_meta(corpus, p.tokenizer, root, dc.val_fraction) is None:
            p.too_big = True
            return p
        p.split = split_counts(corpus, p.tokenizer, root, dc.val_fraction, cfg.model.block_size)
        check_split_counts(dc.val_fraction, *p.split, cfg.model.block_size)
    return p


def _vocab_line(cfg: Config, d: DataPreview) -> Optional[str]:
    if cfg.model.vocab_size is not None:
        return None  # shown in the config
    if d.tokenizer is not None and not d.trained_now:
        return f"  model.vocab_size      {d.vocab_size} (from {d.tokenizer_path})"
    if d.vocab_size is None:
        return f"  model.vocab_size      from the tokenizer, trained into {d.tokenizer_path} at the first run"
    source = "the corpus's characters" if d.trained_now else "tokenizer.vocab_size"
    return f"  model.vocab_size      {d.vocab_size} ({source}; trained into {d.tokenizer_path} at the first run)"


def _split_line(cfg: Config, d: DataPreview) -> str:
    if d.split is not None:
        return (f"  train/val tokens      {d.split[0]:,} / {d.split[1]:,} (data.val_fraction "
                f"{cfg.data.val_fraction:g}; each needs model.block_size+1 = {cfg.model.block_size + 1:,})")
    if d.too_big:
        why = (f"the corpus ({d.source.size / 1e6:,.0f} MB) is not prepared yet and too large to encode for a "
               "preview; train prepares it first")
    elif not d.corpus_ok:
        why = f"{d.corpus} is not downloaded (or fails its checksum); train downloads it first"
    else:
        why = f"the {cfg.tokenizer.kind} tokenizer is not trained yet; train trains it into {d.tokenizer_path} first"
    return f"  train/val tokens      not known yet: {why}, then checks the split"


def describe_derived(cfg: Config) -> list[str]:
    """The values the config leaves to be derived (null keys), as ``--dry-run`` shows them, checked as ``train``
    checks them before step 0.

    ``model.vocab_size`` comes from the tokenizer file when it exists already,
    from the corpus for a char tokenizer not trained yet, or from
    ``tokenizer.vocab_size``; with it, the parameter count and the memory
    estimate of :func:`~minigpt_cli.runtime.device.check_memory` follow. Without it
    (a char tokenizer and no corpus yet), the memory check uses the smallest
    vocabulary the tokenizer can have.

    Raises:
        MinigptError: the error ``train`` would raise before step 0: no such
            device, float16 on a CPU, no tensorboard package, what
            :func:`preview` refuses, a ``sample.prompt`` the tokenizer cannot
            encode, ``model.vocab_size`` below the
            tokenizer's (:func:`~minigpt_cli.data.pipeline.with_vocab`), or a model that
            does not fit in the free memory.
    """
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.train.tensorboard:
        from .setup import tensorboard_writer_class

        tensorboard_writer_class()
    d = preview(cfg)
    # samples.txt and generate sample from it: train refuses it once its tokenizer is ready (None: the text alone)
    encode_prompt(d.tokenizer, cfg.sample.prompt, "sample.prompt")
    mc = cfg.model
    lines = ["derived values (\"(set)\": given in the config):",
             f"  device, dtype         {device}, {str(dtype).removeprefix('torch.')}"
             + (" (set)" if (cfg.device, cfg.dtype) != ("auto", "auto") else ""),
             *filter(None, [_vocab_line(cfg, d)]), _split_line(cfg, d)]
    lines.append(f"  model.d_ff            {mc.ffn_hidden}" + (" (set)" if mc.d_ff is not None else ""))
    lines.append(f"  model.n_kv_head       {mc.kv_heads}" + (" (set)" if mc.n_kv_head is not None else ""))
    lines.append(f"  head size             {mc.head_dim}")
    lines.append(f"  sample.window_stride  {cfg.sample.window_stride or max(1, mc.block_size // 4)}"
                 + (" (set)" if cfg.sample.window_stride is not None else ""))
    lines.append(f"  train.lr_decay_iters  {cfg.train.lr_decay_iters or cfg.train.max_iters}"
                 + (" (set)" if cfg.train.lr_decay_iters is not None else ""))
    known = d.vocab_size is not None or mc.vocab_size is not None
    if d.vocab_size is not None:
        full = with_vocab(cfg, d.vocab_size)
    else:  # no tokenizer yet; unset, the smallest a char tokenizer can have: one character and the special tokens
        full = cfg if known else with_vocab(cfg, 1 + len(cfg.tokenizer.special_tokens))
    dtype_name = str(dtype).removeprefix("torch.")
    need, _ = bytes_to_train(full.model, dtype_name, cfg.train.batch_size)
    if known:
        lines.append(f"  parameters            {P.count(full.model).total:,}")
        lines.append(f"  memory to train       about {P.human_bytes(need)} ({dtype_name}, "
                     f"batch {cfg.train.batch_size})")
    else:
        lines.append(f"  memory to train       at least about {P.human_bytes(need)} ({dtype_name}, batch "
                     f"{cfg.train.batch_size}; the vocabulary is not known yet)")
    check_memory(full, device, dtype, shards=parallel.shards(cfg.train.parallelism, Dist.from_env()))
    return lines



def describe_schedule(cfg: Config, points: int = 8) -> str:
    """The resolved config, the values it leaves to be derived, the learning rate at a few steps, and the
    notes of :func:`~minigpt_cli.config.notes.notes` (for ``--dry-run``).

    Raises:
        MinigptError: as :func:`describe_derived`.
    """
    tc = cfg.train
    steps = sorted({0, max(tc.warmup_iters - 1, 0), tc.warmup_iters, tc.max_iters // 4, tc.max_iters // 2,
                    3 * tc.max_iters // 4, max(tc.max_iters - 1, 0)})
    steps = [s for s in steps if 0 <= s < max(tc.max_iters, 1)][:points]
    lines = [cfg.to_yaml().rstrip(), "", *describe_derived(cfg), "",
             f"learning rate ({tc.lr_schedule}, warmup {tc.warmup_iters}):"]
    lines += [f"  step {s:>7,}: {lr_at(s, tc, cfg.model.n_embd):.3e}" for s in steps]
    found = config_notes(cfg)
    return "\n".join(lines + ([""] + found if found else []))
