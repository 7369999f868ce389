"""Export a run as a Hugging Face ``transformers`` folder (as ``save_pretrained`` writes it):
:mod:`.load` inverted.

Which transformers architecture computes exactly what a model does is one table, :data:`TARGETS`:
GPT-2 (learned positions, LayerNorm, a two-layer MLP; Conv1D weights transposed back), Llama (RoPE,
RMSNorm, SwiGLU) and GPT-NeoX (RoPE, LayerNorm, a two-layer MLP, a sequential residual; q, k, v
interleaved per head). Biases a target always has and ``bias: false`` leaves out are written as
zeros. Trained tokenizers are ``tokenizers`` files already; the char tokenizer becomes a
``WordLevel`` model over its characters (:func:`char_tokenizer_json`), giving the same ids.
``generation_config.json`` keeps prompt and output within the context (``max_length``: block_size).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..config.keys import run_value, yaml_value
from ..config.schema import Config, ModelConfig
from ..errors import MinigptError
from ..fileio import chmod_quietly, dangling_link, dir_mode, link_problem, os_error_message
from ..run import folder as runs
from ..sample.generate import end_of_text
from ..sample.load import load_run
from ..tokenizer.kinds import CharTokenizer, Tokenizer
from .load import (
    _GPT2_CONV1D,
    llama_names,
    neox_names,
    neox_qkv,
    read_hf_config,
)  # the one name table, both ways

#: What an export writes (and all that ``--force`` may replace).
EXPORT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)
#: The config.json key that marks a folder as an export of ours: all that ``--force`` replaces.
EXPORT_MARK = "minigpt_export"
#: The name an export's temporary folder (and the old copy it replaces) starts with, beside the
#: output.
_TEMP = ".{}.minigpt-export-"
#: The char tokenizer's unknown token in an export, where the model has a row for one
#: (:func:`char_unk_token`).
_REPLACEMENT = "\ufffd"


class _Any:
    """Every value of a key (``value in ANY`` always holds)."""

    def __contains__(self, value: object) -> bool:
        return True


ANY = _Any()
#: The keys every target takes at any value: sizes, and what only training reads.
SIZES = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "vocab_size",
    "dropout",
    "norm_eps",
    "d_ff",
    "multiple_of",
    "bias",
    "tie_weights",
    "init_std",
    "scale_residual_init",
    "init_from",
    "zero_init_proj",
)
#: Our MLP activation -> transformers' ``ACT2FN`` name (GPT-2's ``activation_function``, GPT-NeoX's
#: ``hidden_act``).
_ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
#: Each export target and the values it takes of each :class:`ModelConfig` key beyond :data:`SIZES` (a tuple, or
#: ANY); a key it does not list must be at its schema default, so a switch added to the schema is refused by every
#: target until one lists it. In the order a tie between nearest targets is broken (:func:`hf_target`).
TARGETS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "pos_encoding": ("learned",),
        "norm": ("layernorm",),
        "ffn": tuple(_ACT),
        "rope_base": ANY,
    },  # unused with learned positions
    "llama": {
        "pos_encoding": ("rope",),
        "norm": ("rmsnorm",),
        "ffn": ("swiglu",),
        "rope_base": ANY,
        "n_kv_head": ANY,
    },
    "gpt_neox": {
        "pos_encoding": ("rope",),
        "norm": ("layernorm",),
        "ffn": tuple(_ACT),
        "rope_base": ANY,
    },
    # Llama with RMSNorm on each head's queries and keys; its MLP has no biases.
    "qwen3": {
        "pos_encoding": ("rope",),
        "norm": ("rmsnorm",),
        "ffn": ("swiglu",),
        "rope_base": ANY,
        "n_kv_head": ANY,
        "qk_norm": (True,),
        "bias": (False,),
    },
}
#: Each target's model class, and its name in messages.
ARCHITECTURES = {
    "gpt2": ("GPT2LMHeadModel", "GPT-2"),
    "llama": ("LlamaForCausalLM", "Llama"),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPT-NeoX"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3"),
}


def _misses(mc: ModelConfig, target: str) -> list[tuple[str, Any]]:
    """(key, the values ``target`` takes) for each key of ``mc`` it cannot express, in the schema's
    order."""
    takes = {**dict.fromkeys(SIZES, ANY), **TARGETS[target]}
    fields = type(mc).model_fields
    allowed = {
        key: takes.get(key, (field.get_default(call_default_factory=True),))
        for key, field in fields.items()
    }
    return [(key, values) for key, values in allowed.items() if getattr(mc, key) not in values]


def _setting(key: str, values: tuple) -> str:
    """``model.KEY=VALUE`` for a value ``values`` takes, as --set reads it."""
    return f"model.{key}={yaml_value(values[0])}"


def hf_target(mc: ModelConfig, arch: Optional[str] = None) -> str:
    """The key of :data:`TARGETS` that computes exactly what ``mc`` does: ``arch`` when given, else
    the first that expresses it. A :class:`MinigptError` names the first key ``arch`` (or, with
    none, the nearest target: the fewest keys to change) cannot express, and the settings that would
    export."""
    misses = {target: _misses(mc, target) for target in TARGETS}
    fits = [target for target, missed in misses.items() if not missed]
    if fits and (arch is None or arch in fits):
        return arch or fits[0]
    nearest = arch or min(misses, key=lambda target: len(misses[target]))
    (key, values), name = misses[nearest][0], ARCHITECTURES[nearest][1]
    changes = ", ".join(_setting(k, v) for k, v in misses[nearest])
    takes = " or ".join(map(yaml_value, values))
    value = run_value(getattr(mc, key))
    if arch:
        fix = (
            f"drop --arch: the run exports as {ARCHITECTURES[fits[0]][1]}"
            if fits
            else f"a run trained with {changes} exports as {name}"
        )
        raise MinigptError(
            f"--arch {arch}: {name} cannot express model.{key}={value} (it takes {takes}); {fix}",
            key=f"model.{key}",
        )
    raise MinigptError(
        f"model.{key}={value} has no equivalent in transformers' GPT-2, Llama, GPT-NeoX or Qwen3, "
        f"so this run cannot be exported; the nearest, {name}, takes model.{key} {takes}: a run "
        f"trained with {changes} exports as {name}",
        key=f"model.{key}",
    )


def _gpt2_config(mc: ModelConfig) -> dict:
    return {
        "n_layer": mc.n_layer,
        "n_head": mc.n_head,
        "n_embd": mc.n_embd,
        "n_positions": mc.block_size,
        "n_ctx": mc.block_size,
        "n_inner": mc.ffn_hidden,
        "activation_function": _ACT[mc.ffn],
        "resid_pdrop": mc.dropout,
        "embd_pdrop": mc.dropout,
        "attn_pdrop": mc.dropout,
        "layer_norm_epsilon": mc.norm_eps,
        "scale_attn_weights": True,
    }


def _llama_config(mc: ModelConfig) -> dict:
    return {
        "num_hidden_layers": mc.n_layer,
        "num_attention_heads": mc.n_head,
        "num_key_value_heads": mc.kv_heads,
        "hidden_size": mc.n_embd,
        "head_dim": mc.head_dim,
        "intermediate_size": mc.ffn_hidden,
        "hidden_act": "silu",
        "max_position_embeddings": mc.block_size,
        "rms_norm_eps": mc.norm_eps,
        "rope_theta": mc.rope_base,
        "attention_bias": mc.bias,
        "mlp_bias": mc.bias,
        "attention_dropout": mc.dropout,
    }


def _neox_config(mc: ModelConfig) -> dict:
    # rotary_pct / rotary_emb_base: the keys of transformers 4.x and llama.cpp's converter; 5.x
    # reads them too.
    return {
        "num_hidden_layers": mc.n_layer,
        "num_attention_heads": mc.n_head,
        "hidden_size": mc.n_embd,
        "intermediate_size": mc.ffn_hidden,
        "hidden_act": _ACT[mc.ffn],
        "max_position_embeddings": mc.block_size,
        "layer_norm_eps": mc.norm_eps,
        "rotary_pct": 1.0,
        "rotary_emb_base": mc.rope_base,
        "use_parallel_residual": False,
        "attention_bias": mc.bias,
        "attention_dropout": mc.dropout,
        "hidden_dropout": mc.dropout,
    }


def _qwen3_config(mc: ModelConfig) -> dict:
    llama = {k: v for k, v in _llama_config(mc).items() if k != "mlp_bias"}
    return {**llama, "use_sliding_window": False, "sliding_window": None}


_CONFIGS = {
    "gpt2": _gpt2_config,
    "llama": _llama_config,
    "gpt_neox": _neox_config,
    "qwen3": _qwen3_config,
}


def hf_config(cfg: Config, tok: Tokenizer, target: str) -> dict:
    """The ``config.json`` of ``cfg``'s model as ``target`` (:func:`hf_target`), with the
    end-of-text id when the tokenizer has one, and the begin token's id (:func:`begin_token`)."""
    mc = cfg.model
    eos = end_of_text(tok)
    eos = tok.encode(eos)[0] if eos is not None else None
    return {
        "architectures": [ARCHITECTURES[target][0]],
        "model_type": target,
        **_CONFIGS[target](mc),
        "vocab_size": mc.vocab_size,
        "initializer_range": mc.init_std,
        "tie_word_embeddings": mc.tie_weights,
        "bos_token_id": begin_token(tok)[1],
        "eos_token_id": eos,
        "torch_dtype": "float32",
    }


def _zero_biases(sd: dict[str, torch.Tensor], but: tuple[str, ...] = ()) -> None:
    """Add a zero bias for each weight of the layers and the final norm (``bias: false`` has none),
    but in modules whose name holds one of ``but``: the target always has them (LayerNorm shifts
    included)."""
    sd.update(
        {
            name.removesuffix("weight") + "bias": torch.zeros(t.shape[0])
            for name, t in list(sd.items())
            if name.startswith(("h.", "ln_f.")) and not any(part in name for part in but)
        }
    )


def hf_state_dict(
    model: torch.nn.Module, mc: ModelConfig, target: Optional[str] = None
) -> dict[str, torch.Tensor]:
    """Our weights under ``target``'s names and layouts (default :func:`hf_target`'s; :mod:`.load`'s
    mapping inverted): GPT-2's Conv1D transposed, Llama's ``c_attn`` rows split into q (n_embd), k
    and v (n_kv_head · head_dim each) and ``c_fc`` into gate and up, GPT-NeoX's q, k, v interleaved
    per head; a tied head left out."""
    target = target or hf_target(mc)
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if mc.tie_weights:
        sd.pop("lm_head.weight", None)
    if target == "gpt2":
        if (
            not mc.bias
        ):  # GPT-2 always adds biases (and LayerNorm shifts): ours are zero, one per output
            _zero_biases(sd)
        return {
            name if name == "lm_head.weight" else f"transformer.{name}": t.t().contiguous()
            if _GPT2_CONV1D.fullmatch(name)
            else t
            for name, t in sd.items()
        }
    if target == "gpt_neox":
        if (
            not mc.bias
        ):  # its MLP and LayerNorms always have biases; attention_bias: false drops the attention's
            _zero_biases(sd, but=(".attn.",))
        names = neox_names(mc)
        return {
            names[name]: neox_qkv(t, mc.n_head, to_neox=True) if ".attn.c_attn." in name else t
            for name, t in sd.items()
        }
    split = {
        1: lambda t: (t,),
        2: lambda t: torch.chunk(t, 2),  # by the names stacked: [gate; up], [q; k; v]
        3: lambda t: torch.split(
            t, [mc.n_embd, mc.kv_heads * mc.head_dim, mc.kv_heads * mc.head_dim]
        ),
    }
    names = llama_names(mc)
    assert set(sd) <= set(names), set(sd) - set(names)  # hf_target admitted only these layers
    out: dict[str, torch.Tensor] = {}
    for ours, t in sd.items():
        for name, piece in zip(names[ours], split[len(names[ours])](t)):
            out[name if name == "lm_head.weight" else f"model.{name}"] = piece.contiguous()
    return out


def char_unk_token(tok: CharTokenizer, vocab_size: int) -> Optional[str]:
    """The char export's unknown token at id ``tok.vocab_size``, when the model has a row there
    (else None): U+FFFD, or the first private-use character the alphabet lacks. One character, never
    a word such as ``<unk>``: transformers matches it in the text, where minigpt would read its five
    characters."""
    if vocab_size <= tok.vocab_size:
        return None
    taken = set(tok.chars).union(*tok.special_tokens)
    return next(ch for ch in (_REPLACEMENT, *map(chr, range(0xE000, 0xF900))) if ch not in taken)


def char_tokenizer_json(tok: CharTokenizer, vocab_size: int) -> str:
    """A ``tokenizer.json`` giving the char tokenizer's ids: a ``WordLevel`` vocabulary of its
    characters and special tokens, every character split off alone, a ``Fuse`` decoder. Characters
    outside the alphabet (which WordLevel would fail on) map to :func:`char_unk_token`, or are
    removed when the model has no row."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab = dict(tok.stoi)  # the characters, then the special tokens: the run's ids
    unk = char_unk_token(tok, vocab_size)
    if unk is not None:
        vocab[unk] = tok.vocab_size
    backend = Backend(models.WordLevel(vocab, unk_token=unk))
    if (
        unk is None
    ):  # [^alphabet], each character written \x{hex} so that none reads as a regex operator
        alphabet = "".join(f"\\x{{{ord(ch):x}}}" for ch in tok.chars)
        backend.normalizer = normalizers.Replace(Regex(f"[^{alphabet}]"), "")
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    # Special tokens are matched on the text as it is, before the normalizer (normalized=False).
    backend.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in tok.special_tokens]
    )
    return backend.to_str(pretty=True)


def begin_token(tok: Tokenizer) -> tuple[str, int]:
    """The export's begin-of-text token (``bos_token``), as the vocabulary spells it, and its id.

    lm-evaluation-harness puts it before every text it scores (``prefix_token_id``) and fails
    without one. The run's end-of-text token when it has one; else the last token of the blank line
    the run put between documents (``\n`` for a char run, ``Ċ`` for byte-level BPE, ``##\n`` for
    WordPiece): what the model saw before each document; else (a tokenizer that cannot encode a
    blank line) its unknown token, else id 0."""
    from ..data.preparation import separator_ids

    eot = end_of_text(tok)
    ids = tok.encode(eot) if eot is not None else separator_ids(tok)[0]
    if not ids and tok.unk_token is not None:
        ids = [tok.token_to_id(tok.unk_token)]
    i = ids[-1] if ids else 0
    text = tok.itos[i] if isinstance(tok, CharTokenizer) else tok.backend.id_to_token(i)
    return text, i


def tokenizer_files(tok: Tokenizer, run_dir: Path, cfg: Config) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the run's tokenizer, as text."""
    unk = tok.unk_token
    if isinstance(tok, CharTokenizer):
        tokenizer_json = char_tokenizer_json(tok, cfg.model.vocab_size)
        unk = char_unk_token(tok, cfg.model.vocab_size)
    else:
        tokenizer_json = (run_dir / runs.TOKENIZER).read_text(encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.model.block_size,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    eos = end_of_text(tok)
    if eos is not None:
        config["eos_token"] = eos
    # A begin token for lm-evaluation-harness, which fails without one. transformers counts it as
    # special (decode(skip_special_tokens=True) leaves it out; docs/hf.md); it is not an end:
    # generation goes on.
    config["bos_token"] = begin_token(tok)[0]
    if unk is not None:
        config["unk_token"] = unk
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
    }


def generation_config(cfg: Config, eos: Optional[int]) -> dict:
    """``generation_config.json`` from the run's ``sample`` section (Hugging Face's names already),
    with ``max_length`` block_size in place of ``max_new_tokens``: prompt and new tokens together
    stay within the position table (GPT-2's raises IndexError past it) and the context the model was
    trained on (RoPE's has no end to stop at). transformers' ``GenerationConfig``:
    ``max_new_tokens`` overrides ``max_length``."""
    sc = cfg.sample
    out = {"do_sample": sc.temperature > 0, "max_length": cfg.model.block_size}
    if sc.temperature > 0:
        out.update(
            temperature=sc.temperature,
            top_k=sc.top_k or 0,
            top_p=sc.top_p if sc.top_p is not None else 1.0,
        )
    if eos is not None:
        out.update(bos_token_id=eos, eos_token_id=eos)
    return out


def _foreign(folder: Path) -> list[str]:
    """The names in ``folder`` an export does not write: all but regular files of
    :data:`EXPORT_FILES`."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in EXPORT_FILES or not p.is_file() or p.is_symlink()
    )


def _is_export(folder: Path) -> bool:
    """Whether ``folder``'s config.json carries :data:`EXPORT_MARK` (a Hugging Face model's does
    not)."""
    config = folder / "config.json"
    with contextlib.suppress(
        OSError, ValueError, TypeError
    ):  # unreadable, not JSON, not an object: not ours
        return (
            config.is_file()
            and not config.is_symlink()
            and EXPORT_MARK in json.loads(config.read_text("utf-8"))
        )
    return False


def _sweep_temps(out: Path) -> None:
    """Remove the temporary folders (holding only export files) a killed export to ``out`` left
    beside it, and the links an earlier version moved aside there (a link's removal leaves its
    target as it is)."""
    for left in out.parent.glob(f"{glob.escape(_TEMP.format(out.name))}*"):
        if left.is_symlink() or (left.is_dir() and not _foreign(left)):
            _remove(left)


def _remove(path: Path) -> None:
    """Remove what an export moved aside or left: a link or a file unlinked, a folder whole."""
    with contextlib.suppress(OSError):
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)


def _through_link(out: Path) -> Path:
    """Where an export to ``out`` goes: ``out``, or for a link the folder it points to (whose checks
    are then an export's own: empty, or an earlier export's with --force). Raises MinigptError: a
    dangling link."""
    if not out.is_symlink():
        return out
    target = Path(os.path.realpath(out))
    if dangling_link(out) is not None:  # a link to nothing, or a loop (realpath stops in it)
        problem = link_problem(out)
        raise MinigptError(
            f"--output {out} {problem}",
            "remove the link, or pass another --output"
            if "loop" in problem
            else "make the folder it points to, remove the link, or pass another --output",
            path=out,
        )
    return target


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (name -> contents) as the folder ``out``: a temporary folder beside it is
    renamed into place when complete, an old ``out`` moved aside under a name of this export's own
    first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _sweep_temps(out)
    tmp = Path(tempfile.mkdtemp(prefix=_TEMP.format(out.name), dir=out.parent))
    try:
        chmod_quietly(tmp, dir_mode())  # mkdtemp makes 0700: an export is as readable as any folder
        for name, data in files.items():  # plain writes: the folder is renamed into place whole
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        old = tmp.with_name(tmp.name + ".old")  # unique, as tmp is: never a folder of the user's
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        _remove(old)
    finally:
        shutil.rmtree(
            tmp, ignore_errors=True
        )  # what a failed write left; after the rename there is nothing


def _source_positions(mc: ModelConfig) -> Optional[int | str]:
    """The rows of the position table a fine-tuned run (``model.init_from``) cut to ``block_size``:
    the folder's ``n_positions`` when longer, a phrase when the folder is gone; None when nothing
    was cut."""
    if mc.init_from is None or mc.pos_encoding != "learned":
        return None
    if not (Path(mc.init_from) / "config.json").is_file():
        return "table (of a length unknown now: the folder is gone)"
    n = read_hf_config(mc.init_from)[1].block_size
    return n if n > mc.block_size else None


def export_run(
    run: Optional[str | Path],
    output: str | Path,
    *,
    fmt: str = "hf",
    arch: Optional[str] = None,
    checkpoint: str = runs.BEST,
    force: bool = False,
    dtype: Optional[str] = None,
    echo: Callable[[str], None] = lambda message: None,
    ema: bool = True,
) -> Path:
    """Write a run's checkpoint as a transformers folder at ``output``, atomically
    (:func:`_write_folder`), as ``arch`` (a key of :data:`TARGETS`; None: the one that expresses the
    run), or with ``fmt="gguf"`` as a GGUF file (:func:`~.gguf.export_gguf`); the EMA weights of a
    run trained with ``train.ema_decay`` unless ``ema`` is False; a
    :class:`MinigptError` for a bad option or output, :func:`hf_target`'s, and a failed write."""
    if fmt == "gguf":
        from .gguf import export_gguf

        if arch is not None:
            raise MinigptError(
                "--arch picks a transformers architecture (--format hf); a GGUF's follows the "
                "run: drop --arch"
            )
        return export_gguf(
            run,
            output,
            dtype=dtype or "f32",
            checkpoint=checkpoint,
            force=force,
            echo=echo,
            ema=ema,
        )
    from safetensors.torch import save

    given = Path(output)
    out = _through_link(given)
    run_dir, ckpt = runs.open_checkpoint(run, checkpoint)
    where = out.resolve()
    around = (("the run", run_dir.resolve()), ("the current folder", Path.cwd().resolve()))
    holds = next(
        (what for what, inside in around if inside == where or where in inside.parents), None
    )
    inside_run = (
        run_dir.resolve() in where.parents
    )  # a run folder holds what train and the readers write
    foreign = _foreign(out) if out.is_dir() else []
    if fmt != "hf":
        raise MinigptError(
            f"--format {fmt!r}: use hf (a transformers folder) or gguf (one file for llama.cpp)"
        )
    if dtype is not None:
        raise MinigptError("--dtype is for --format gguf; a transformers folder is float32")
    if holds:  # before "not empty": no --force replaces these, so none may be suggested
        raise MinigptError(
            f"--output {out} is or holds {holds}; an export replaces its folder: pass a new or "
            "empty one"
        )
    if inside_run:
        raise MinigptError(
            f"--output {out} is inside the run folder, which holds what train writes; pass a "
            "folder outside it"
        )
    if out.exists() and not out.is_dir():
        raise MinigptError(f"{out} exists and is not a folder; pass another --output")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise MinigptError(
            f"{out} exists and is not empty; pass --force to replace it, or another --output"
        )
    if force and foreign:
        raise MinigptError(
            f"{out} holds files an export does not write ({', '.join(foreign[:3])}); --force "
            "replaces only an earlier export: pass a new or empty --output"
        )
    if force and out.is_dir() and any(out.iterdir()) and not _is_export(out):
        raise MinigptError(
            f"{out} is not an export minigpt wrote (its config.json carries no minigpt mark); "
            "--force replaces only an earlier export: pass a new or empty --output"
        )
    # generate's checks: checksums, finite weights, the run's own tokenizer
    loaded = load_run(run_dir, checkpoint, ema=ema)
    model, cfg, tok = loaded.model, loaded.config, loaded.tokenizer
    target = hf_target(cfg.model, arch)  # refused before anything is written
    config = hf_config(cfg, tok, target)
    texts = {
        "config.json": json.dumps({**config, EXPORT_MARK: 1}, indent=2) + "\n",
        **tokenizer_files(tok, run_dir, cfg),
        "generation_config.json": json.dumps(
            generation_config(cfg, config["eos_token_id"]), indent=2
        )
        + "\n",
    }
    files = {
        "model.safetensors": save(
            hf_state_dict(model, cfg.model, target), metadata={"format": "pt"}
        ),
        **{name: text.encode("utf-8") for name, text in texts.items()},
    }
    if out != given:  # what an earlier version left beside the link (the link itself, moved aside)
        _sweep_temps(given)
    try:
        _write_folder(out, files)
    except OSError as exc:  # named as the user gave it, not as the temporary folder beside it
        raise MinigptError(os_error_message(exc, out, "write")) from None
    if isinstance(tok, CharTokenizer) and char_unk_token(tok, cfg.model.vocab_size) is None:
        echo(
            f"note: the exported char tokenizer removes characters outside its {len(tok.chars)}-"
            "character alphabet (minigpt refuses them): the model has no row for an unknown "
            f"token; train with model.vocab_size above {tok.vocab_size} for an export that maps "
            "them to one"
        )
    source = _source_positions(cfg.model)
    if source is not None:
        echo(
            f"note: the position table has model.block_size={cfg.model.block_size} rows: "
            f"fine-tuning cut {cfg.model.init_from}'s {source} to that; fine-tune with a larger "
            "model.block_size to keep more"
        )
    if loaded.weights_note() is not None:
        echo(loaded.weights_note())
    echo(
        f"exported {run_dir} ({ckpt.name}) as a transformers {ARCHITECTURES[target][0]} to {out}; "
        f"generation_config.json: max_length {cfg.model.block_size} (prompt and new tokens within "
        f"the model's context) in place of sample.max_new_tokens {cfg.sample.max_new_tokens}"
    )
    return out
