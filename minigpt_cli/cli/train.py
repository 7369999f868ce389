"""``train`` a model from a config, or ``prepare`` its data and stop."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from ..run import folder as runs
from .base import (
    Command,
    ProgressOption,
    SetOption,
    app,
    echo,
    fix_when_interrupted,
    other_rank,
    say_when_stopped_late,
)


@app.command(cls=Command)
def train(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/shakespeare-cpu.yaml."),
    set_: SetOption = [],
    run_name: Optional[str] = typer.Option(
        None,
        "--run-name",
        metavar="NAME",
        help="Folder name under runs/ (default: <name>-<date>-<time>).",
    ),
    resume: Optional[str] = typer.Option(
        None,
        "--resume",
        metavar="auto|DIR",
        help="Continue a run: 'auto' (the newest run of this config's name) or runs/NAME, in its "
        "own folder from checkpoints/last; or start a new run folder (--run-name names it) from a "
        "checkpoint folder, runs/NAME/checkpoints/step-N or best, leaving runs/NAME as it is.",
    ),
    init_from: Optional[Path] = typer.Option(
        None,
        "--init-from",
        metavar="DIR",
        help="Fine-tune: start from a local Hugging Face GPT-2, Llama, GPT-NeoX or "
        "Qwen3 folder (config.json, model.safetensors, tokenizer.json); its architecture and tokenizer replace the "
        "config's; the same as --set model.init_from=DIR.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the resolved config and learning rates (with --resume: the run and step it would continue from); train nothing.",
    ),
    progress: ProgressOption = None,
) -> None:
    """Train a GPT as the config says; the run lands in runs/<name>/.

    Downloads the corpus and trains the tokenizer first if they are missing.
    The run folder holds config.yaml, tokenizer.json, metrics.jsonl, train.log,
    loss.png, samples.txt, env.json and checkpoints/{last,best}.

    Ctrl-C (or SIGTERM) saves checkpoints/last, even in the middle of an eval
    (exit status 130, or 143 for SIGTERM); a second Ctrl-C aborts without
    saving. --resume continues from it with the same losses the uninterrupted
    run would have had; a larger train.max_iters trains a run further (the
    learning-rate schedule then follows the new values). Under torchrun
    (torchrun --nproc_per_node=N -m minigpt_cli train CONFIG) it trains with
    DistributedDataParallel. minigpt config-keys lists every key a config or
    --set may give.

    --set train.optimizer=muon trains the 2-D matrices inside the blocks with
    Muon (their updates orthogonalised, so every direction of a hidden layer's
    map learns at one rate) and the embeddings, the output head and every gain
    and bias with AdamW (a table looked up by row, the logits' scale, vectors:
    not hidden-layer maps; the Muon README, arXiv 2502.16982). Each group
    follows the schedule from its own rate (train.muon.learning_rate).
    --set train.lr_schedule=wsd holds the peak rate until the last
    train.decay_fraction of the run; --resume RUN --set train.max_iters=N cools
    a stable-phase checkpoint down exactly. --resume RUN/checkpoints/step-N
    (kept by train.keep_every) cools down from that step in a new run folder
    (its metrics start with RUN's up to step N), and RUN stays as it is.

    \b
    Example: minigpt train configs/shakespeare-cpu.yaml --set train.max_iters=500
    """
    from ..config.schema import load_config, text_override

    set_ = [*set_, text_override("model.init_from", init_from)] if init_from is not None else set_
    cfg = load_config(config, set_, note=echo)
    if not other_rank():  # a tracker's missing package is said before PyTorch loads (2.5 s)
        from ..run import trackers

        trackers.check(cfg.train)
    from ..runtime.device import flush_denormals
    from ..trainer import train as run_training

    if dry_run:  # train's own set-up, stopped before its first write
        from ..trainer.describe import describe_schedule
        from ..trainer.setup import plan

        print(describe_schedule(plan(cfg, run_name, resume, echo, progress)))
        return
    words = ["minigpt", "train", str(config), *[w for item in set_ for w in ("--set", item)]]
    with fix_when_interrupted(
        lambda exc: (
            exc.resume_dir  # how to go on: this command again, with --resume
            and f"continue with: {shlex.join([*words, '--resume', str(exc.resume_dir)])}"
        )
    ):
        # Before PyTorch starts its threads, which copy this one's floating-point modes.
        with flush_denormals():
            result = run_training(cfg, run_name, resume=resume, echo=echo, progress=progress)
    if result.already_done:
        n = cfg.train.max_iters
        where = "reached" if result.step == n else f"is at step {result.step}, past"
        print(
            f"{result.run_dir} already {where} train.max_iters={n}; nothing was trained. To train longer, "
            f"raise it, e.g. --set train.max_iters={max(2 * result.step, result.step + 1)}"
        )
        return
    if other_rank():  # under torchrun, rank 0 reports for all
        return
    val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
    say_when_stopped_late(
        f"the run had finished at step {result.step} and is saved in "
        f"{runs.checkpoint_dir(result.run_dir, runs.LAST)}"
    )
    print(f"trained to step {result.step}; final val loss {val}; run folder {result.run_dir}")
    print(f"sample from it with: minigpt generate --run {shlex.quote(str(result.run_dir))}")


@app.command(cls=Command)
def prepare(
    config: Path = typer.Argument(
        ..., help="YAML config whose data and tokenizer sections to use."
    ),
    set_: SetOption = [],
    progress: ProgressOption = None,
) -> None:
    """Prepare a config's data as train would, and stop: corpus, tokenizer, token files.

    Downloads the named dataset, or reads data.path (a file, a folder of
    .txt/.jsonl/.parquet/.arrow files, a glob; data.text_field names the
    JSON field or Parquet column), trains the tokenizer if its file is missing,
    and writes the train and val token files; a later train reuses them.

    \b
    Example: minigpt prepare configs/shakespeare-bpe.yaml --set data.path=books/
    """
    from ..config.schema import load_config
    from ..data.pipeline import prepare_configured
    from ..data.train_tokenizer import chosen_tokenizer
    from ..hf.finetune import resolve_init_from

    cfg = resolve_init_from(load_config(config, set_, note=echo), note=echo)
    cfg = chosen_tokenizer(cfg, echo)  # own text: the tokenizer train-tokenizer made for it
    corpus, tok, tok_path, data = prepare_configured(
        cfg, echo, progress
    )  # Ctrl-C: base's STOPPED line, status 130
    meta = data.meta
    print(
        f"corpus      {corpus.source}: {corpus.size:,} bytes in {len(corpus.files):,} file(s), "
        f"{meta.get('documents', 1):,} document(s); fingerprint {corpus.fingerprint[:12]}"
    )
    print(f"tokenizer   {tok.kind}, {tok.vocab_size:,} entries ({tok_path})")
    split = "whole documents" if meta.get("split") == "documents" else "the end of the text"
    print(
        f"token files {data.directory}: {len(data.train):,} train / {len(data.val):,} val tokens "
        f"({data.train.dtype}; validation: {split})"
    )
