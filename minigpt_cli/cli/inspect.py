"""``minigpt inspect TOPIC``: the ideas behind the model, computed, checked and drawn (Typer
sub-app).

One short function per topic: parse the options, call the topic's library
function in :mod:`minigpt_cli.inspection`, print its text report or JSON.
Each topic writes its picture to ``--output`` (default ``inspect/``).
torch and matplotlib are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Literal, Optional

import typer
from typer._click.exceptions import UsageError

from ..run import folder as runs
from .base import TYPER_SETTINGS, CheckpointOption, Command, Group, RunOption, echo


class _Topics(Group):
    """The ``inspect`` group: an unknown topic is a usage error (exit 2) that lists the topics."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            names = list(self.list_commands(ctx))
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" did you mean {close[0]}?" if close else ""
            raise UsageError(
                f"unknown topic {name!r};{hint} the topics are: {', '.join(names)}", ctx
            )
        return super().resolve_command(ctx, args)


app = typer.Typer(
    name="inspect",
    cls=_Topics,
    help="Compute, check and draw the ideas behind the model: positions, block, residual, attention, "
    "activations, ffn, tokenize. Each prints its numbers (--json: as JSON) and writes a PNG to --output "
    "(default inspect/ in the current folder).",
    **TYPER_SETTINGS,
)

OUTPUT_HELP = "Folder for the PNG (created if missing; default: inspect/ in the current folder)."
JSON_HELP = "Print the numbers as JSON instead of text (keys: the docstring of minigpt_cli.inspection.<topic>)."


def _report(result: dict, as_json: bool, formatter) -> None:
    from ..inspection.figures import to_json

    print(to_json(result) if as_json else formatter(result))


def _one_thread() -> None:
    """The topics compute on tiny tensors, where a second PyTorch thread only spins and waits;
    unless OMP_NUM_THREADS says otherwise, use one."""
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)


def _numbers(
    text: str,
    option: str,
    expected: str,
    kind=float,
    count: Optional[int] = None,
    least: float = -math.inf,
) -> list:
    """The comma-separated finite numbers of an option: ``count`` of them when given, each at least
    ``least``. Raises MinigptError ``{option} {text!r}: give {expected}`` otherwise."""
    from ..errors import MinigptError

    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    wrong = len(values) != (count or len(values)) or not all(map(math.isfinite, values))
    if not values or wrong or min(values) < least:
        raise MinigptError(f"{option} {text!r}: give {expected}")
    return values


@app.command(cls=Command)
def positions(
    dim: int = typer.Option(
        128,
        "--dim",
        min=2,
        max=8192,
        metavar="D",
        help="Width d, even (128: p0·pk first rises at k = 12; 64: the longest wavelength is ≈ 47,117).",
    ),
    max_len: int = typer.Option(
        4096,
        "--max-len",
        min=2,
        max=65536,
        metavar="N",
        help="Positions 0..N-1 for the curve, its minimum and the rotation check.",
    ),
    base: float = typer.Option(
        10000.0, "--base", metavar="B", help="Frequency base (Vaswani et al.: 10000)."
    ),
    seed: int = typer.Option(
        0, "--seed", metavar="S", help="Seed of the random W_Q, W_K and content vectors."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """Sinusoidal positions: heatmap, p0·pk, the rotation p(t+k) = R_k p(t), and RoPE after
    projections.

    Prints the first rise of p0·pk, its rising steps in 0..1024, its minimum and where, the longest
    wavelength, max |p(t+k) - R_k p(t)|, and q·k at equal offsets for sinusoidal positions (with and
    without random W_Q, W_K) and for RoPE. Writes positions.png.

    \b
    Example: minigpt inspect positions --dim 128 --max-len 4096
    """
    _one_thread()
    from ..inspection.positions import format_positions
    from ..inspection.positions import positions as run

    _report(run(dim, max_len, base, seed, output), as_json, format_positions)


@app.command(cls=Command)
def block(
    trace: bool = typer.Option(
        False,
        "--trace",
        help="Also trace the shapes and dtypes through a small GPT, and "
        "print each parameter's gradient norm after one backward.",
    ),
    n_embd: int = typer.Option(64, "--n-embd", min=1, max=4096, metavar="D", help="Model width."),
    n_head: int = typer.Option(
        4, "--n-head", min=1, metavar="H", help="Attention heads (must divide --n-embd)."
    ),
    d_ff: int = typer.Option(256, "--d-ff", min=1, metavar="N", help="Feed-forward width."),
    seq_len: int = typer.Option(
        8, "--seq-len", min=1, metavar="T", help="Tokens per sequence in the comparison."
    ),
    activation: Literal["relu", "gelu"] = typer.Option(
        "gelu", "--activation", metavar="relu|gelu", help="Feed-forward activation."
    ),
    n_layer: int = typer.Option(2, "--n-layer", min=1, metavar="L", help="Blocks in the trace."),
    batch: int = typer.Option(2, "--batch", min=1, metavar="B", help="Sequences per batch."),
    trace_len: int = typer.Option(
        4, "--trace-len", min=1, metavar="T", help="Tokens per sequence in the trace."
    ),
    dtype: Literal["float32", "float64", "bfloat16"] = typer.Option(
        "float32",
        "--dtype",
        metavar="DTYPE",
        help="The trace's dtype: float32, float64 or bfloat16.",
    ),
    seed: int = typer.Option(0, "--seed", metavar="S", help="Seed of the weights and inputs."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """Our Pre-LN and Post-LN blocks against torch.nn.TransformerEncoderLayer with the same weights.

    Prints the max difference under a causal mask (and without it, to show the check can fail).
    --trace adds the (B, T, C) shape and dtype after every sub-layer (defaults: B = 2, T = 4,
    d = 64, 2 blocks) and each parameter's gradient norm. Writes block.png.

    \b
    Example: minigpt inspect block --trace --dtype bfloat16
    """
    _one_thread()
    from ..inspection.block import block as run
    from ..inspection.block import format_block

    result = run(
        n_embd,
        n_head,
        d_ff,
        seq_len,
        activation,
        seed,
        trace,
        n_layer,
        batch,
        trace_len,
        dtype,
        output,
    )
    _report(result, as_json, format_block)


@app.command(cls=Command)
def residual(
    run: Optional[Path] = typer.Option(
        None,
        "--run",
        metavar="DIR",
        help="Measure a trained run instead, on validation windows, against its init.",
    ),
    depths: str = typer.Option(
        "4,16,64", "--depths", metavar="L,L,...", help="Block counts to build."
    ),
    seeds: int = typer.Option(8, "--seeds", min=1, metavar="N", help="Initialisations per depth."),
    n_embd: int = typer.Option(64, "--n-embd", min=1, max=4096, metavar="D", help="Model width."),
    n_head: int = typer.Option(4, "--n-head", min=1, metavar="H", help="Attention heads."),
    seq_len: int = typer.Option(64, "--seq-len", min=1, metavar="T", help="Tokens per input."),
    init_std: Optional[float] = typer.Option(
        None,
        "--init-std",
        min=1e-6,
        max=10.0,
        metavar="X",
        help="Init std of the weights (default 1/sqrt(d): O(1) branches).",
    ),
    checkpoint: str = typer.Option(
        runs.BEST,
        "--checkpoint",
        metavar=f"{runs.BEST}|{runs.LAST}",
        help="With --run: which checkpoint.",
    ),
    windows: int = typer.Option(
        8, "--windows", metavar="N", help="With --run: validation windows of block_size."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """RMS of the residual stream after each block, with and without GPT-2's 1/sqrt(2L) init.

    At initialisation: depths 4, 16 and 64 over 8 seeds, as a table and residual.png. With --run:
    the trained model on validation text, next to the same architecture at its init.

    \b
    Examples:
      minigpt inspect residual
      minigpt inspect residual --run runs/quick
    """
    _one_thread()
    from ..inspection.residual import format_residual, residual_run
    from ..inspection.residual import residual as study

    if run is not None:
        result = residual_run(run, checkpoint, windows, output=output, echo=echo)
    else:
        result = study(
            _numbers(
                depths,
                "--depths",
                "block counts of at least 1 separated by commas, e.g. --depths 4,16,64",
                int,
                least=1,
            ),
            seeds,
            n_embd,
            n_head,
            seq_len,
            init_std,
            output,
        )
    _report(result, as_json, format_residual)


@app.command(cls=Command)
def attention(
    prompt: str = typer.Option(
        ...,
        "--prompt",
        metavar="TEXT",
        help="Text to attend over: at most the run's block_size tokens (longer is refused).",
    ),
    run: RunOption = None,
    checkpoint: CheckpointOption = runs.BEST,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """Attention maps of a trained run, per layer and head, and each head's mean entropy.

    Handles grouped-query attention (n_kv_head < n_head) and RoPE. A prompt longer than block_size
    is refused (exit 2), not cropped: its maps would show positions the model never saw together.
    Writes attention.png.

    \b
    Example: minigpt inspect attention --run runs/quick --prompt "ROMEO: O, she"
    """
    _one_thread()
    from ..inspection.attention import attention as run_attention
    from ..inspection.attention import format_attention

    if run is None:
        run = runs.latest_run()
        echo(f"using {run}")
    _report(run_attention(run, prompt, checkpoint, output, echo), as_json, format_attention)


@app.command(cls=Command)
def activations(
    range_: str = typer.Option("-4,4", "--range", metavar="LO,HI", help="The plotted range of x."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """ReLU, GELU, GELU-tanh and SiLU, and the largest |GELU - GELU-tanh| with where it is reached.

    \b
    Example: minigpt inspect activations --range=-6,6
    """
    _one_thread()
    from ..inspection.activations import activations as run
    from ..inspection.activations import format_activations

    bounds = _numbers(
        range_, "--range", "two finite numbers separated by a comma, e.g. --range -4,4", count=2
    )
    _report(run(bounds[0], bounds[1], output), as_json, format_activations)


@app.command(cls=Command)
def ffn(
    weights: Optional[Path] = typer.Option(
        None,
        "--weights",
        metavar="FILE",
        help='JSON weights: {"W1": [[..]] (d_model x d_ff), "W2": [[..]] (d_ff x '
        'd_model), optional "b1", "b2", "activation" (relu, gelu, gelu_tanh, '
        'swiglu; swiglu also takes "V", d_model x d_ff)}. Default: the '
        "2 -> 3 -> 2 ReLU example.",
    ),
    x: List[str] = typer.Option(
        [],
        "--x",
        metavar="X1,X2,...",
        help="An input, d_model numbers (repeatable; default 1,2 and 2,-1).",
    ),
    swiglu_d_model: int = typer.Option(
        4096,
        "--swiglu-d-model",
        min=1,
        metavar="D",
        help="Width for the SwiGLU 2/3 rule (Llama-7B: 4096).",
    ),
    multiple_of: int = typer.Option(
        256,
        "--multiple-of",
        min=1,
        metavar="M",
        help="Round the SwiGLU width up to a multiple of this.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """A tiny feed-forward pass step by step (every product written out), and SwiGLU's width rule.

    y = act(x W1 + b1) W2 + b2 and x + y, checked against the model's MLP; then 2/3·4d rounded up
    to a multiple of 256 (11008 for d = 4096). Writes ffn.png.

    \b
    Examples:
      minigpt inspect ffn
      minigpt inspect ffn --weights w.json --x 1,2
    """
    _one_thread()
    from ..inspection.ffn import EXAMPLE_XS, format_ffn, read_weights
    from ..inspection.ffn import ffn as run

    w = read_weights(weights) if weights is not None else None
    xs = (
        [
            _numbers(v, "--x", "the input as finite numbers separated by commas, e.g. --x 1,2")
            for v in x
        ]
        if x
        else list(EXAMPLE_XS)
    )
    _report(run(w, xs, swiglu_d_model, multiple_of, output), as_json, format_ffn)


@app.command(cls=Command)
def tokenize(
    tokenizer: Optional[Path] = typer.Option(
        None,
        "--tokenizer",
        metavar="FILE",
        help="A tokenizer file: one "
        "train-tokenizer writes, or any tokenizers tokenizer.json (a run's, an "
        "export's, a Hugging Face folder's); a folder: the tokenizer.json in "
        "it.",
    ),
    run: Optional[Path] = typer.Option(
        None, "--run", metavar="DIR", help="Use this run's tokenizer."
    ),
    text: Optional[str] = typer.Option(
        None,
        "--text",
        metavar="TEXT",
        help="Text to cut (default: 'hugs bugs' on the toy corpus, else 'ROMEO: hugs').",
    ),
    words: Optional[str] = typer.Option(
        None,
        "--words",
        metavar="W=N,...",
        help="The toy corpus (default hug=10,pug=5,pun=12,bun=4,hugs=5).",
    ),
    all_segmentations: bool = typer.Option(
        False,
        "--all-segmentations",
        help="Unigram: list every segmentation of each word with its log-probability.",
    ),
    corpus: Optional[Path] = typer.Option(
        None,
        "--corpus",
        metavar="FILE",
        help="WordPiece: the training text, to recompute each merge's score.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    output: Path = typer.Option(Path("inspect"), "--output", metavar="DIR", help=OUTPUT_HELP),
) -> None:
    """Pieces and ids; BPE merge order, WordPiece scores, Unigram segmentations and Viterbi.

    Without --tokenizer or --run: the toy corpus hug x10, pug x5, pun x12, bun x4, hugs x5, where
    BPE first merges u+g (the most frequent pair) and WordPiece g+s (the best count(ab)/(count(a)
    count(b))), and Unigram's seed model lists every segmentation of each word. Writes tokenize.png.

    \b
    Examples:
      minigpt inspect tokenize
      minigpt inspect tokenize --run runs/quick --text "ROMEO: thou"
      minigpt inspect tokenize --tokenizer uni.json --all-segmentations
    """
    from ..inspection.tokenize import format_tokenize, parse_words
    from ..inspection.tokenize import tokenize as run_tokenize

    toy_words = parse_words(words) if words is not None else None
    result = run_tokenize(tokenizer, run, text, toy_words, all_segmentations, corpus, output, echo)
    _report(result, as_json, format_tokenize)
