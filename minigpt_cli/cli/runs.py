"""The commands that use a trained run: ``generate`` text, ``evaluate`` it, ``export`` it to Hugging
Face."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Literal, Optional, TextIO

import typer

from ..errors import MinigptError
from ..fileio import read_text_file
from ..run import folder as runs
from .base import (
    CheckpointOption,
    Command,
    DeviceOption,
    JsonOption,
    ProgressOption,
    RawWeightsOption,
    RunOption,
    app,
    echo,
    sample_flags,
    unescape,
)


@app.command(cls=Command)
def generate(
    run: RunOption = None,
    prompt: Optional[str] = typer.Option(
        None,
        "--prompt",
        metavar="TEXT",
        help="Text to continue; '-' reads it from standard input (default: the config's sample.prompt).",
    ),
    prompt_file: Optional[Path] = typer.Option(
        None, "--prompt-file", metavar="FILE", help="Read the prompt from this UTF-8 file."
    ),
    max_new_tokens: Optional[int] = typer.Option(
        None,
        "--max-new-tokens",
        min=0,
        help="Tokens to generate; 0 prints the prompt back unchanged.",
    ),
    temperature: Optional[float] = typer.Option(
        None,
        "--temperature",
        metavar="T",
        help="Divides the logits: a finite number >= 0; 0 means greedy.",
    ),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", min=1, metavar="K", help="Keep only the k most likely tokens."
    ),
    top_p: Optional[float] = typer.Option(
        None,
        "--top-p",
        metavar="P",
        help="Nucleus sampling, 0 < p <= 1: keep the smallest set of tokens reaching mass p.",
    ),
    stop: List[str] = typer.Option(
        [],
        "--stop",
        metavar="TEXT",
        help="End a sample when this text appears in the generated text; it is not printed (repeatable). "
        "Escapes as in printf: '\\n\\n' is a blank line; also \\t \\r \\a \\b \\e \\f \\v \\\" \\' \\\\ (a "
        "backslash), \\uHHHH and \\UHHHHHHHH (a character: \\u00e9 is é), \\xHH and octal \\NNN (bytes, read "
        "as UTF-8: \\xc3\\xa9 is é); any other backslash stays as typed.",
    ),
    ignore_eos: bool = typer.Option(
        False,
        "--ignore-eos",
        help="Go on past the tokenizer's end-of-text token (<|endoftext|>, </s>, ...), printing it; by default a "
        "sample ends there, as transformers' generate ends, and the token is not printed.",
    ),
    num_samples: Optional[int] = typer.Option(
        None,
        "--num-samples",
        min=1,
        help="Independent samples, decoded together as one batch and printed when all have ended, each after a "
        "'----- sample N -----' line (20 dashes each side). Sample N uses seed S+N-1, so it is the text "
        "--num-samples 1 --seed S+N-1 gives (to float rounding).",
    ),
    seed: int = typer.Option(
        1337,
        "--seed",
        min=0,
        max=2**63 - 1,
        metavar="S",
        help="Random seed for sampling, 0 .. 2**63-1.",
    ),
    stream: bool = typer.Option(
        True, "--stream/--no-stream", help="Print tokens as they are produced."
    ),
    kv_cache: bool = typer.Option(
        True, "--kv-cache/--no-kv-cache", help="Reuse past keys and values."
    ),
    compile_: Optional[bool] = typer.Option(
        None,
        "--compile/--no-compile",
        help="Decode through a static KV cache with the one-token step compiled (torch.compile; CUDA graphs on "
        "a GPU); the same tokens. Default: on for CUDA, off on a CPU, where it does not pay.",
    ),
    dtype: Literal["float32", "bfloat16"] = typer.Option(
        "float32",
        "--dtype",
        metavar="float32|bfloat16",
        help="Weights and arithmetic: bfloat16 reads half the bytes per token (faster where memory is the "
        "limit, as on CPUs); its text drifts from float32's after some tokens.",
    ),
    window_stride: Optional[int] = typer.Option(
        None,
        "--window-stride",
        min=1,
        help="Past block_size, drop this many oldest tokens at once (1: slide token by token; "
        "default: the run's sample.window_stride, else block_size // 4).",
    ),
    checkpoint: CheckpointOption = runs.BEST,
    raw_weights: RawWeightsOption = False,
    device: DeviceOption = "auto",
) -> None:
    """Sample text from a trained run.

    Each sample is printed as the prompt, the new text and a newline, token
    by token for a single sample (--no-stream: at the end).

    \b
    Example:
      minigpt generate --prompt "ROMEO:" --max-new-tokens 300 --stop "JULIET:"
      minigpt generate --stop '\\n\\n'        # end at the first blank line
    """
    from ..sample.generate import generate as run_generate

    given = {
        "prompt": _read_prompt(prompt, prompt_file, sys.stdin),
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "num_samples": num_samples,
        "window_stride": window_stride,
    }
    stops = [unescape(s) for s in stop]
    if "" in stops:  # it would end every sample before its first character
        raise MinigptError("--stop '': the stop text must not be empty")
    run_generate(
        run,
        sample_flags({k: v for k, v in given.items() if v is not None}),
        checkpoint=checkpoint,
        device=device,
        seed=seed,
        stream=stream,
        use_cache=kv_cache,
        compile=compile_,
        dtype=dtype,
        stop=stops,
        ignore_eos=ignore_eos,
        out=sys.stdout,
        echo=echo,
        ema=not raw_weights,
    )


def _read_prompt(
    prompt: Optional[str], prompt_file: Optional[Path], stdin: Optional[TextIO]
) -> Optional[str]:
    """The prompt from ``--prompt`` or ``--prompt-file`` (``-``: standard input), as read, newline
    included; None when neither is given. Raises MinigptError: both given, no standard input, an
    unreadable or non-UTF-8 file."""
    if prompt is not None and prompt_file is not None:
        raise MinigptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-" or (prompt_file is not None and str(prompt_file) == "-"):
        if stdin is None:
            raise MinigptError("--prompt -: no standard input to read the prompt from")
        return stdin.read()
    if prompt_file is None:
        return prompt
    return read_text_file(prompt_file, "--prompt-file")


@app.command(cls=Command)
def evaluate(
    run: RunOption = None,
    checkpoint: CheckpointOption = runs.BEST,
    raw_weights: RawWeightsOption = False,
    split: Optional[str] = typer.Option(
        None, "--split", metavar="val|train", help="Which split of the run's corpus (default val)."
    ),
    text_file: Optional[Path] = typer.Option(
        None,
        "--text-file",
        metavar="FILE",
        help="Score this UTF-8 file instead (every token once, as --full).",
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="Score every token of the split exactly once (sliding windows) "
        "instead of the training eval's windows (as --windows full).",
    ),
    windows: Optional[str] = typer.Option(
        None,
        "--windows",
        metavar="eval|full|lm-eval",
        help="How the text is cut into windows: the training eval's (default for a split), "
        "full (as --full; default for --text-file) or lm-eval (lm-evaluation-harness's "
        "loglikelihood_rolling: its bits per byte, to quote beside lm-eval's).",
    ),
    stride: Optional[int] = typer.Option(
        None,
        "--stride",
        min=1,
        metavar="N",
        help="Tokens each --full window advances (default block_size // 2): every "
        "scored token sees at least block_size - N tokens of context.",
    ),
    batch_size: int = typer.Option(
        8, "--batch-size", min=1, help="Windows per forward pass with --full."
    ),
    device: DeviceOption = "auto",
    as_json: JsonOption = False,
    progress: ProgressOption = None,
) -> None:
    """Loss, perplexity and bits per byte of a run's checkpoint.

    By default it reads the windows the run's own eval read at the
    checkpoint's step, so it gives back the logged val_loss (shown beside
    it); a run trained with train.eval_full_val read the whole val split in
    windows of block_size, as --full --stride BLOCK_SIZE. --full scores every
    token of the split once: windows of block_size tokens advancing by
    --stride, each scoring only the tokens the previous window did not
    (transformers' "perplexity of fixed-length models").
    --windows lm-eval scores as lm-evaluation-harness does on an export
    (a begin token, then disjoint windows that each see only the token
    before them): more tokens see little context, so its figure is higher.

    Loss is in nats per token, so it depends on the tokenizer: a char model
    and a BPE model cannot be compared by it. Bits per byte (and per
    character) divide the same total by the text's size instead, which makes
    models with different tokenizers comparable.

    \b
    Examples:
      minigpt evaluate --run runs/shakespeare-char --json
      minigpt evaluate --full --stride 128
      minigpt evaluate --text-file sonnets.txt
      minigpt evaluate --text-file sonnets.txt --windows lm-eval
    """
    from ..eval.evaluate import evaluate as run_evaluate
    from ..eval.evaluate import format_evaluation

    result = run_evaluate(
        run,
        checkpoint=checkpoint,
        split=split,
        text_file=text_file,
        full=full,
        windows=windows,
        stride=stride,
        batch_size=batch_size,
        device=device,
        progress=progress,
        echo=echo,
        ema=not raw_weights,
    )
    print(json.dumps(result, indent=1) if as_json else format_evaluation(result))


@app.command(cls=Command)
def export(
    run: Path = typer.Argument(..., metavar="RUN", help="The run folder to export."),
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        metavar="DIR",
        help="Folder to write (created); with --format gguf, the file.",
    ),
    fmt: str = typer.Option(
        "hf",
        "--format",
        metavar="hf|gguf",
        help="hf: a transformers folder; gguf: one file for llama.cpp and Ollama.",
    ),
    arch: Optional[Literal["gpt2", "llama", "gpt_neox", "qwen3"]] = typer.Option(
        None,
        "--arch",
        metavar="gpt2|llama|gpt_neox|qwen3",
        help="The transformers architecture to write (--format hf); refused when it cannot express the run "
        "(default: the one that does).",
    ),
    dtype: Optional[Literal["f32", "f16", "q8_0"]] = typer.Option(
        None,
        "--dtype",
        metavar="f32|f16|q8_0",
        help="gguf's tensor type (default f32); q8_0 needs widths that are multiples of 32.",
    ),
    checkpoint: CheckpointOption = runs.BEST,
    raw_weights: RawWeightsOption = False,
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace DIR if it exists and is not empty (gguf: FILE, if an earlier export).",
    ),
) -> None:
    """Write a run as a Hugging Face transformers folder, or as a GGUF file (--format gguf).

    DIR gets config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json and generation_config.json:
    AutoModelForCausalLM.from_pretrained(DIR) and
    AutoTokenizer.from_pretrained(DIR) load it offline, and
    pipeline("text-generation", model=DIR) generates within the context
    (max_length: block_size). Learned positions with LayerNorm and a
    GELU/ReLU MLP become GPT-2; RoPE with RMSNorm and SwiGLU, Llama; RoPE
    with LayerNorm and a GELU/ReLU MLP, GPT-NeoX. Other models (sinusoidal
    or no positions, Post-LN, the embedding scale) have no transformers
    equivalent and are refused, naming the key and the settings that export.

    --format gguf writes one GGUF file instead (GPT-2-style runs as gpt2,
    Llama-style as llama, with a byte-level BPE tokenizer), for llama.cpp.

    \b
    Example: minigpt export runs/shakespeare-char --output exported/
             minigpt export runs/llama-bpe --format gguf --output llama.gguf
    """
    from ..hf.export import export_run

    out = export_run(
        run,
        output,
        fmt=fmt,
        arch=arch,
        checkpoint=checkpoint,
        force=force,
        dtype=dtype,
        echo=echo,
        ema=not raw_weights,
    )
    print(out)
