"""Export a run as a Hugging Face ``transformers`` folder (as ``save_pretrained`` writes it): :mod:`.load` inverted.

A model with learned positions, LayerNorm and a ReLU/GELU MLP is a ``GPT2LMHeadModel`` (Conv1D weights
transposed back; ``bias: false`` written as zero biases); one with RoPE, RMSNorm and SwiGLU a
``LlamaForCausalLM``; anything else is refused, naming the key (:func:`hf_family`). Trained tokenizers are
``tokenizers`` files already; the char tokenizer becomes a ``WordLevel`` model over its characters
(:func:`char_tokenizer_json`), giving the same ids.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from ..config.schema import Config, ModelConfig
from ..config.special_tokens import END_OF_TEXT
from ..errors import MinigptError, refuse
from ..fileio import chmod_quietly, dir_mode, os_error_message
from ..run import folder as runs
from ..sample.load import load_run
from ..tokenizer.kinds import CharTokenizer, Tokenizer
from .load import _GPT2_CONV1D, llama_names  # the one name table, both ways

_MESSAGES = {
    "format": "--format {fmt!r}: use hf (a transformers folder) or gguf (one file for llama.cpp)",
    "dtype": "--dtype is for --format gguf; a transformers folder is float32",
    "not_empty": "{out} exists and is not empty; pass --force to replace it, or another --output",
    "not_folder": "{out} exists and is not a folder; pass another --output",
    "holds": "--output {out} is or holds {what}; an export replaces its folder: pass a new or empty one",
    "not_export": "{out} holds files an export does not write ({names}); --force replaces only an earlier "
                  "export: pass a new or empty --output",
    "not_ours": "{out} is not an export minigpt wrote (its config.json carries no minigpt mark); --force "
                "replaces only an earlier export: pass a new or empty --output",
    "unsupported": "model.{key}={value!r} has no equivalent in transformers' GPT-2 or Llama ({why}); this run "
                   "cannot be exported",
    "char_drops": "note: the exported char tokenizer removes characters outside its {n}-character alphabet "
                  "(minigpt refuses them): the model has no row for an unknown token; train with "
                  "model.vocab_size above {size} for an export that maps them to one",
}

#: What an export writes (and all that ``--force`` may replace).
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
#: The config.json key that marks a folder as an export of ours: all that ``--force`` replaces.
EXPORT_MARK = "minigpt_export"
#: The name an export's temporary folder (and the old copy it replaces) starts with, beside the output.
_TEMP = ".{}.minigpt-export-"
#: Our MLP activation -> GPT-2's ``activation_function``.
_GPT2_ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
#: The char tokenizer's unknown token in an export, where the model has a row for one (:func:`char_unk_token`).
_REPLACEMENT = "\ufffd"


def hf_family(mc: ModelConfig) -> str:
    """``gpt2`` or ``llama``: the transformers architecture that computes exactly what ``mc`` does; a
    :class:`MinigptError` names the first key neither expresses."""
    gpt2 = mc.pos_encoding == "learned"
    refused = [  # (when, key, why), in the order a user would fix them
        (mc.pos_encoding not in ("learned", "rope"), "pos_encoding", "GPT-2 learns its positions, Llama rotates them"),
        (mc.norm_position != "pre", "norm_position", "both normalise before each sub-layer"),
        (mc.emb_scale, "emb_scale", "neither scales the token embeddings by sqrt(n_embd)"),
        (gpt2 and mc.norm != "layernorm", "norm", "GPT-2, with learned positions, uses LayerNorm"),
        (gpt2 and mc.ffn not in _GPT2_ACT, "ffn",
         "GPT-2, with learned positions, has a two-layer MLP with GELU or ReLU"),
        (gpt2 and mc.kv_heads != mc.n_head, "n_kv_head",
         "GPT-2, with learned positions, has no grouped-query attention"),
        (not gpt2 and mc.norm != "rmsnorm", "norm", "Llama, with RoPE, uses RMSNorm"),
        (not gpt2 and mc.ffn != "swiglu", "ffn", "Llama, with RoPE, uses SwiGLU"),
    ]
    for key, why in ((key, why) for failed, key, why in refused if failed):
        raise MinigptError(_MESSAGES["unsupported"].format(key=key, value=getattr(mc, key), why=why))
    return "gpt2" if gpt2 else "llama"


def end_of_text(tok: Tokenizer) -> Optional[str]:
    """The tokenizer's end-of-text special token (:data:`~minigpt_cli.config.special_tokens.END_OF_TEXT`), or None."""
    return next((s for s in tok.special_tokens if s in END_OF_TEXT), None)


def hf_config(cfg: Config, tok: Tokenizer) -> dict:
    """The ``config.json`` of ``cfg``'s model (:func:`hf_family`), with the end-of-text id when the
    tokenizer has one."""
    mc = cfg.model
    eos = end_of_text(tok)
    eos = tok.encode(eos)[0] if eos is not None else None
    common = {"vocab_size": mc.vocab_size, "initializer_range": mc.init_std, "tie_word_embeddings": mc.tie_weights,
              "bos_token_id": eos, "eos_token_id": eos, "torch_dtype": "float32"}
    if hf_family(mc) == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": mc.n_layer,
                "n_head": mc.n_head, "n_embd": mc.n_embd, "n_positions": mc.block_size, "n_ctx": mc.block_size,
                "n_inner": mc.ffn_hidden, "activation_function": _GPT2_ACT[mc.ffn], "resid_pdrop": mc.dropout,
                "embd_pdrop": mc.dropout, "attn_pdrop": mc.dropout, "layer_norm_epsilon": mc.norm_eps,
                "scale_attn_weights": True, **common}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": mc.n_layer,
            "num_attention_heads": mc.n_head, "num_key_value_heads": mc.kv_heads, "hidden_size": mc.n_embd,
            "head_dim": mc.head_dim, "intermediate_size": mc.ffn_hidden, "hidden_act": "silu",
            "max_position_embeddings": mc.block_size, "rms_norm_eps": mc.norm_eps, "rope_theta": mc.rope_base,
            "attention_bias": mc.bias, "mlp_bias": mc.bias, "attention_dropout": mc.dropout, **common}


def hf_state_dict(model: torch.nn.Module, mc: ModelConfig) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names and layouts (:mod:`.load`'s mapping inverted): ``c_attn`` rows split
    into q (n_embd), k and v (n_kv_head · head_dim each), ``c_fc`` into gate and up; a tied head left out."""
    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if mc.tie_weights:
        sd.pop("lm_head.weight", None)
    out: dict[str, torch.Tensor] = {}
    if hf_family(mc) == "gpt2":
        if not mc.bias:  # GPT-2 always adds biases (and LayerNorm shifts): ours are zero, one per output
            sd.update({name.removesuffix("weight") + "bias": torch.zeros(t.shape[0]) for name, t in sd.items()
                       if name.startswith(("h.", "ln_f."))})
        for name, t in sd.items():
            if _GPT2_CONV1D.fullmatch(name):
                t = t.t().contiguous()
            out[name if name == "lm_head.weight" else f"transformer.{name}"] = t
        return out
    split = {1: lambda t: (t,), 2: lambda t: torch.chunk(t, 2),  # by the names stacked: [gate; up], [q; k; v]
             3: lambda t: torch.split(t, [mc.n_embd, mc.kv_heads * mc.head_dim, mc.kv_heads * mc.head_dim])}
    names = llama_names(mc)
    assert set(sd) <= set(names), set(sd) - set(names)  # hf_family admitted only these layers
    for ours, t in sd.items():
        for name, piece in zip(names[ours], split[len(names[ours])](t)):
            out[name if name == "lm_head.weight" else f"model.{name}"] = piece.contiguous()
    return out


def char_unk_token(tok: CharTokenizer, vocab_size: int) -> Optional[str]:
    """The char export's unknown token at id ``tok.vocab_size``, when the model has a row there (else None):
    U+FFFD, or the first private-use character the alphabet lacks. One character, never a word such as
    ``<unk>``: transformers matches it in the text, where minigpt would read its five characters."""
    if vocab_size <= tok.vocab_size:
        return None
    taken = set(tok.chars).union(*tok.special_tokens)
    return next(ch for ch in (_REPLACEMENT, *map(chr, range(0xE000, 0xF900))) if ch not in taken)


def char_tokenizer_json(tok: CharTokenizer, vocab_size: int) -> str:
    """A ``tokenizer.json`` giving the char tokenizer's ids: a ``WordLevel`` vocabulary of its characters and
    special tokens, every character split off alone, a ``Fuse`` decoder. Characters outside the alphabet
    (which WordLevel would fail on) map to :func:`char_unk_token`, or are removed when the model has no row."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    vocab = dict(tok.stoi)  # the characters, then the special tokens: the run's ids
    unk = char_unk_token(tok, vocab_size)
    if unk is not None:
        vocab[unk] = tok.vocab_size
    backend = Backend(models.WordLevel(vocab, unk_token=unk))
    if unk is None:  # [^alphabet], each character written \x{hex} so that none reads as a regex operator
        alphabet = "".join(f"\\x{{{ord(ch):x}}}" for ch in tok.chars)
        backend.normalizer = normalizers.Replace(Regex(f"[^{alphabet}]"), "")
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    # Special tokens are matched on the text as it is, before the normalizer (normalized=False).
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in tok.special_tokens])
    return backend.to_str(pretty=True)


def tokenizer_files(tok: Tokenizer, run_dir: Path, cfg: Config) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the run's tokenizer, as text."""
    unk = tok.unk_token
    if isinstance(tok, CharTokenizer):
        tokenizer_json = char_tokenizer_json(tok, cfg.model.vocab_size)
        unk = char_unk_token(tok, cfg.model.vocab_size)
    else:
        tokenizer_json = (run_dir / runs.TOKENIZER).read_text(encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.model.block_size,
              "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False}
    eos = end_of_text(tok)
    if eos is not None:
        config["eos_token"] = eos
    if unk is not None:
        config["unk_token"] = unk
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def generation_config(cfg: Config, eos: Optional[int]) -> dict:
    """``generation_config.json`` from the run's ``sample`` section (Hugging Face's names already)."""
    sc = cfg.sample
    out = {"do_sample": sc.temperature > 0, "max_new_tokens": sc.max_new_tokens}
    if sc.temperature > 0:
        out.update(temperature=sc.temperature, top_k=sc.top_k or 0, top_p=sc.top_p if sc.top_p is not None else 1.0)
    if eos is not None:
        out.update(bos_token_id=eos, eos_token_id=eos)
    return out


def _foreign(folder: Path) -> list[str]:
    """The names in ``folder`` an export does not write: all but regular files of :data:`EXPORT_FILES`."""
    return sorted(p.name for p in folder.iterdir() if p.name not in EXPORT_FILES or not p.is_file() or p.is_symlink())


def _is_export(folder: Path) -> bool:
    """Whether ``folder``'s config.json carries :data:`EXPORT_MARK` (a Hugging Face model's does not)."""
    config = folder / "config.json"
    with contextlib.suppress(OSError, ValueError, TypeError):  # unreadable, not JSON, not an object: not ours
        return config.is_file() and not config.is_symlink() and EXPORT_MARK in json.loads(config.read_text("utf-8"))
    return False


def _sweep_temps(out: Path) -> None:
    """Remove the temporary folders (holding only export files) a killed export to ``out`` left beside it."""
    for left in out.parent.glob(f"{glob.escape(_TEMP.format(out.name))}*"):
        if left.is_dir() and not left.is_symlink() and not _foreign(left):
            shutil.rmtree(left, ignore_errors=True)


def _write_folder(out: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (name -> contents) as the folder ``out``: a temporary folder beside it is renamed into
    place when complete, an old ``out`` moved aside under a name of this export's own first."""
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
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # what a failed write left; after the rename there is nothing


def export_run(run: Optional[str | Path], output: str | Path, *, fmt: str = "hf", checkpoint: str = runs.BEST,
               force: bool = False, dtype: Optional[str] = None,
               echo: Callable[[str], None] = lambda message: None) -> Path:
    """Write a run's checkpoint as a transformers folder at ``output``, atomically (:func:`_write_folder`), or with
    ``fmt="gguf"`` as a GGUF file (:func:`~.gguf.export_gguf`); a :class:`MinigptError` for each refusal of
    :data:`_MESSAGES`, :func:`hf_family`'s, and a failed write."""
    if fmt == "gguf":
        from .gguf import export_gguf

        return export_gguf(run, output, dtype=dtype or "f32", checkpoint=checkpoint, force=force, echo=echo)
    from safetensors.torch import save

    out = Path(output)
    run_dir, ckpt = runs.open_checkpoint(run, checkpoint)
    target = out.resolve()
    around = (("the run", run_dir.resolve()), ("the current folder", Path.cwd().resolve()))
    holds = next((what for what, inside in around if inside == target or target in inside.parents), None)
    foreign = _foreign(out) if out.is_dir() else []
    refuse([(fmt != "hf", "format"),
            (dtype is not None, "dtype"),
            (holds, "holds"),  # before "not empty": no --force replaces these, so none may be suggested
            (out.exists() and not out.is_dir(), "not_folder"),
            (out.is_dir() and any(out.iterdir()) and not force, "not_empty"),
            (force and foreign, "not_export"),
            (force and out.is_dir() and any(out.iterdir()) and not _is_export(out), "not_ours")], _MESSAGES, fmt=fmt, out=out, what=holds, names=", ".join(foreign[:3]))
    loaded = load_run(run_dir, checkpoint)  # generate's checks: checksums, finite weights, the run's own tokenizer
    model, cfg, tok = loaded.model, loaded.config, loaded.tokenizer
    hf_family(cfg.model)  # refused before anything is written
    config = hf_config(cfg, tok)
    texts = {"config.json": json.dumps({**config, EXPORT_MARK: 1}, indent=2) + "\n",
             **tokenizer_files(tok, run_dir, cfg),
             "generation_config.json": json.dumps(generation_config(cfg, config["eos_token_id"]), indent=2) + "\n"}
    files = {"model.safetensors": save(hf_state_dict(model, cfg.model), metadata={"format": "pt"}),
             **{name: text.encode("utf-8") for name, text in texts.items()}}
    try:
        _write_folder(out, files)
    except OSError as exc:  # named as the user gave it, not as the temporary folder beside it
        raise MinigptError(os_error_message(exc, out, "write")) from None
    if isinstance(tok, CharTokenizer) and char_unk_token(tok, cfg.model.vocab_size) is None:
        echo(_MESSAGES["char_drops"].format(n=len(tok.chars), size=tok.vocab_size))
    echo(f"exported {run_dir} ({ckpt.name}) as a transformers {config['architectures'][0]} to {out}")
    return out
