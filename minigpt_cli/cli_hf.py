"""The ``evaluate`` and ``export`` commands: measuring a run, and handing it to the Hugging Face world.

Kept out of :mod:`minigpt_cli.cli` to keep that module short; :func:`register` adds them to the app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from . import runs
from .cli_base import Command, echo


def evaluate(
    run: Optional[Path] = typer.Option(None, "--run", metavar="DIR", help="Run folder (default: the most recent under runs/)."),
    checkpoint: str = typer.Option(
        runs.BEST, "--checkpoint", metavar=f"{runs.BEST}|{runs.LAST}",
        help="best: the weights with the lowest val loss; last: the most recent save.",
    ),
    split: Optional[str] = typer.Option(None, "--split", metavar="val|train", help="Which split of the run's corpus (default val)."),
    text_file: Optional[Path] = typer.Option(None, "--text-file", metavar="FILE",
                                             help="Score this UTF-8 file instead (every token once, as --full)."),
    full: bool = typer.Option(False, "--full", help="Score every token of the split exactly once (sliding windows) "
                                                   "instead of the training eval's windows."),
    stride: Optional[int] = typer.Option(None, "--stride", min=1, metavar="N",
                                         help="Tokens each --full window advances (default block_size // 2): every "
                                              "scored token sees at least block_size - N tokens of context."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Windows per forward pass with --full."),
    device: str = typer.Option("auto", "--device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    progress: Optional[bool] = typer.Option(
        None, "--progress/--no-progress", help="Show a progress bar (default: only when stderr is a terminal)."
    ),
) -> None:
    """Loss, perplexity and bits per byte of a run's checkpoint.

    By default it reads the windows the run's own eval read at the
    checkpoint's step, so it gives back the logged val_loss (shown beside
    it). --full scores every token of the split once: windows of block_size
    tokens advancing by --stride, each scoring only the tokens the previous
    window did not (transformers' "perplexity of fixed-length models").

    Loss is in nats per token, so it depends on the tokenizer: a char model
    and a BPE model cannot be compared by it. Bits per byte (and per
    character) divide the same total by the text's size instead, which makes
    models with different tokenizers comparable.

    \b
    Examples:
      minigpt evaluate --run runs/shakespeare-char --json
      minigpt evaluate --full --stride 128
      minigpt evaluate --text-file sonnets.txt
    """
    from .evaluation import evaluate as run_evaluate, format_evaluation

    result = run_evaluate(run, checkpoint=checkpoint, split=split, text_file=text_file, full=full, stride=stride,
                          batch_size=batch_size, device=device, progress=progress, echo=echo)
    print(json.dumps(result, indent=1) if as_json else format_evaluation(result))


def export(
    run: Path = typer.Argument(..., metavar="RUN", help="The run folder to export."),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR", help="Folder to write (created)."),
    fmt: str = typer.Option("hf", "--format", metavar="hf", help="hf: a transformers folder (the only format)."),
    checkpoint: str = typer.Option(runs.BEST, "--checkpoint", metavar=f"{runs.BEST}|{runs.LAST}",
                                   help="Which checkpoint's weights."),
    force: bool = typer.Option(False, "--force", help="Replace DIR if it exists and is not empty."),
) -> None:
    """Write a run as a Hugging Face transformers folder.

    DIR gets config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json and generation_config.json:
    AutoModelForCausalLM.from_pretrained(DIR) and
    AutoTokenizer.from_pretrained(DIR) load it offline. Learned positions
    with LayerNorm and a GELU/ReLU MLP become GPT-2; RoPE with RMSNorm and
    SwiGLU become Llama; other models (sinusoidal or no positions, Post-LN,
    the embedding scale) have no transformers equivalent and are refused.

    \b
    Example: minigpt export runs/shakespeare-char --output exported/
    """
    from .hf_export import export_run

    out = export_run(run, output, fmt=fmt, checkpoint=checkpoint, force=force, echo=echo)
    print(out)


def register(app: typer.Typer) -> None:
    """Add ``evaluate`` and ``export`` to ``app``."""
    app.command("evaluate", cls=Command)(evaluate)
    app.command("export", cls=Command)(export)
