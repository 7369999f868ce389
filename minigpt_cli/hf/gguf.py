"""Export a run as one GGUF file for llama.cpp (and Ollama, and transformers' GGUF reader), with the
``gguf`` package.

A Llama-style run (RoPE, RMSNorm, SwiGLU, pre-norm) becomes GGUF's ``llama`` architecture, a
GPT-2-style one (learned positions, LayerNorm, tanh GELU, 4·n_embd MLP) ``gpt2``; anything llama.cpp
would compute differently is refused, naming the key (:func:`gguf_arch`). Tensor names are
``gguf``'s own map from transformers' names (what llama.cpp's ``convert_hf_to_gguf.py`` uses);
Llama's q and k rows are permuted into llama.cpp's pairwise RoPE layout (``LlamaModel.permute``
there). The tokenizer goes in as GGUF's ``gpt2`` tokenizer: a byte-level BPE's tokens, merges and
end-of-text id (:func:`tokenizer_fields`). ``--dtype f16`` and ``q8_0`` store 1-D tensors and the
position table in f32, as the converter does; q8_0 needs rows that are whole 32-value blocks.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ..config.keys import run_value, yaml_value
from ..config.schema import ModelConfig, TokenizerConfig
from ..config.special_tokens import END_OF_TEXT
from ..errors import MinigptError
from ..fileio import chmod_quietly, new_file_mode, os_errors
from ..run import folder as runs
from ..sample.load import load_run
from ..tokenizer.kinds import Tokenizer
from .load import (
    llama_names,
)  # our stacked tensors -> transformers' names, the table the HF export uses

if TYPE_CHECKING:
    import torch

#: The general.* key that marks a GGUF as an export of ours: all that ``--force`` replaces.
GGUF_MARK = "general.minigpt_export"
#: The name of an export's temporary file beside the output (a killed export's is swept by the
#: next).
_TEMP = ".{}.minigpt-gguf-"
#: The GGUF architecture's transformers prefix for our names (the head has none).
_PREFIX = {"gpt2": "transformer.", "llama": "model."}
#: The tensor types of ``--dtype`` and the file type llama.cpp reports for them.
_DTYPES = {"f32": ("F32", "ALL_F32"), "f16": ("F16", "MOSTLY_F16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0")}


#: The tokenizer kinds that are no byte-level BPE, refused from the config alone (a bpe or hf one is
#: read whole).
_NOT_BPE = ("char", "wordpiece", "unigram")

#: The model keys both GGUF architectures take at any value: sizes, and what only training reads.
#: Any other key must be at its schema default unless :func:`_fixed` says otherwise, so a switch
#: added later is refused, not written into a file that computes something else.
_FREE = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "vocab_size",
    "dropout",
    "norm_eps",
    "multiple_of",
    "d_ff",
    "n_kv_head",
    "bias",
    "pos_encoding",
    "rope_base",
    "tie_weights",
    "init_std",
    "scale_residual_init",
    "zero_init_proj",
    "init_from",
)


def _fixed(mc: ModelConfig) -> dict[str, dict]:
    """The model keys each GGUF architecture fixes beyond the defaults: llama.cpp's graphs
    (``src/models/gpt2.cpp``, ``llama.cpp``; gpt2's GELU is ggml's tanh one), and transformers' GGUF
    reader (gpt2's MLP 4·n_embd wide, no grouped-query attention; no llama biases)."""
    return {
        "gpt2": {
            "norm": "layernorm",
            "ffn": "gelu_tanh",
            "d_ff": 4 * mc.n_embd,
            "n_kv_head": mc.n_head,
        },
        "llama": {"norm": "rmsnorm", "ffn": "swiglu", "bias": False},
    }


def gguf_arch(mc: ModelConfig, tokenizer: Optional[TokenizerConfig] = None) -> str:
    """``gpt2`` (learned positions) or ``llama`` (RoPE): the GGUF architecture that computes what
    ``mc`` does.

    Raises:
        MinigptError: one line naming every key it would compute otherwise (:func:`_fixed`; with
            positions GGUF holds neither way, measured against ``llama``), and what of ``tokenizer``
            llama.cpp cannot read (a kind that is not BPE, a BPE without an end-of-text token), with
            the values to train with, so that one retraining fixes them all.
    """
    arch = {"learned": "gpt2", "rope": "llama"}.get(mc.pos_encoding)
    have = {**mc.model_dump(), "d_ff": mc.ffn_hidden, "n_kv_head": mc.kv_heads}
    defaults = {
        k: f.get_default(call_default_factory=True)
        for k, f in type(mc).model_fields.items()
        if k not in _FREE
    }
    want = {**defaults, **_fixed(mc)[arch or "llama"]}
    wrong = [k for k, v in want.items() if have[k] != v]
    problems = []  # (what the run has, why GGUF cannot hold it, what to train with)
    if arch is None:
        problems.append(
            (
                f"model.pos_encoding={mc.pos_encoding!r}",
                "GGUF holds learned (gpt2) or rope (llama) positions",
                "model.pos_encoding: rope",
            )
        )
    if wrong:
        problems.append(
            (
                ", ".join(f"model.{k}={run_value(have[k])}" for k in wrong),
                f"GGUF's {arch or 'llama'} computes "
                + ", ".join(f"{k} {yaml_value(want[k])}" for k in wrong),
                ", ".join(f"model.{k}: {yaml_value(want[k])}" for k in wrong),
            )
        )
    kind = tokenizer.kind if tokenizer else None
    if kind in _NOT_BPE:
        problems.append(
            (
                f"tokenizer.kind={kind!r}",
                "llama.cpp reads only a byte-level BPE",
                "tokenizer.kind: bpe",
            )
        )
    specials = list(tokenizer.special_tokens) if tokenizer else []
    if kind in (*_NOT_BPE, "bpe") and not any(t in END_OF_TEXT for t in specials):
        problems.append(
            (
                f"tokenizer.special_tokens={specials!r}",
                "the tokenizer has no end-of-text token, such as <|endoftext|>, for llama.cpp to "
                "stop at",
                f"tokenizer.special_tokens: {[*specials, '<|endoftext|>']!r}",
            )
        )
    if problems:  # every problem in one line: one retraining fixes them all
        raise MinigptError(
            f"{', '.join(p[0] for p in problems)}: {' and '.join(p[1] for p in problems)}; "
            f"train with {', '.join(p[2] for p in problems)}"
        )
    return arch


def _rope_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows from rotate-half RoPE order (ours, transformers') into llama.cpp's consecutive
    pairs, ``heads`` at a time: ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``, which takes k's
    own (key/value) heads, as transformers' GGUF reader does to undo it from 4.43 on (4.41-4.42
    took the query heads: docs/hf.md)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def gguf_tensors(model: torch.nn.Module, mc: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """Our weights under GGUF's names (``blk.N.attn_qkv.weight``, ...), float32 and in PyTorch's
    (out, in) layout, which the file stores as it is: Llama's stacked q/k/v and gate/up cut apart, q
    and k permuted (:func:`_rope_pairs`); GPT-2's missing biases as zeros (llama.cpp requires them);
    a tied head left out."""
    import gguf
    import torch

    sd = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    if mc.tie_weights:
        sd.pop("lm_head.weight")
    theirs: dict[str, torch.Tensor] = {}
    if arch == "gpt2":
        if not mc.bias:
            sd.update(
                {
                    n.removesuffix("weight") + "bias": torch.zeros(t.shape[0])
                    for n, t in sd.items()
                    if n.startswith(("h.", "ln_f."))
                }
            )
        theirs = sd
    else:
        kv = mc.kv_heads * mc.head_dim
        sizes = {
            2: [mc.ffn_hidden] * 2,
            3: [mc.n_embd, kv, kv],
        }  # by the names stacked: [gate; up], [q; k; v]
        for ours, t in sd.items():
            names = llama_names(mc)[ours]
            theirs.update(zip(names, torch.split(t, sizes[len(names)]) if len(names) > 1 else [t]))
        heads = {"q_proj": mc.n_head, "k_proj": mc.kv_heads}
        theirs = {
            n: _rope_pairs(t, heads[n.split(".")[-2]]) if n.split(".")[-2] in heads else t
            for n, t in theirs.items()
        }
    names = gguf.get_tensor_name_map(
        gguf.MODEL_ARCH.GPT2 if arch == "gpt2" else gguf.MODEL_ARCH.LLAMA, mc.n_layer
    )
    out = {}
    for name, t in theirs.items():
        full = name if name == "lm_head.weight" else _PREFIX[arch] + name
        gname = names.get_name(full, try_suffixes=(".weight", ".bias"))
        assert gname is not None, full  # gguf_arch admitted only the layers gguf maps
        out[gname] = t.contiguous()
    return out


def tokenizer_fields(tok: Tokenizer, kind: str, vocab_size: int) -> dict:
    """GGUF's ``gpt2`` tokenizer of a byte-level BPE: ``tokens`` (by id, padded to ``vocab_size``
    with ``[PADn]`` as the converter pads), ``token_type`` (special tokens CONTROL), ``merges``
    (``"a b"``) and ``eos`` (the end-of-text id). A :class:`MinigptError` for any other tokenizer,
    or one without end-of-text or merges."""
    import gguf

    obj = json.loads(tok.backend.to_str()) if hasattr(tok, "backend") else {}
    model, pre = obj.get("model") or {}, obj.get("pre_tokenizer") or {}
    gpt2_bpe = (
        model.get("type") == "BPE"
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space")
        and obj.get("normalizer") is None
        and not any(
            model.get(k)
            for k in (
                "continuing_subword_prefix",
                "end_of_word_suffix",
                "dropout",
                "byte_fallback",
                "ignore_merges",
            )
        )
    )
    eos = next((s for s in tok.special_tokens if s in END_OF_TEXT), None)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if not gpt2_bpe:
        raise MinigptError(
            f"tokenizer.kind={kind!r}: llama.cpp reads only a byte-level BPE; "
            "train with tokenizer.kind: bpe"
        )
    if eos is None:
        raise MinigptError(
            f"tokenizer.special_tokens={list(tok.special_tokens)!r}: the tokenizer has no "
            "end-of-text token, such as <|endoftext|>, for llama.cpp to stop at; train with "
            f"tokenizer.special_tokens: {[*tok.special_tokens, '<|endoftext|>']!r}"
        )
    if not merges:
        raise MinigptError(
            "the tokenizer has no merges (GGUF stores none); "
            f"train with tokenizer.vocab_size above {tok.vocab_size}"
        )
    by_id = {i: t for t, i in tok.backend.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    kinds = {s: gguf.TokenType.CONTROL for s in tok.special_tokens}
    types = [
        kinds.get(t, gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED)
        for i, t in enumerate(tokens)
    ]
    return {
        "tokens": tokens,
        "token_type": types,
        "merges": merges,
        "eos": tok.backend.token_to_id(eos),
    }


def _stored(name: str, t: torch.Tensor, dtype: str):
    """``(array, raw_dtype)`` of tensor ``name`` as the file stores it: 1-D tensors and the position
    table in f32 (``convert_hf_to_gguf.py`` keeps them so), the others as ``dtype``."""
    import gguf

    qtype = gguf.GGMLQuantizationType[_DTYPES[dtype][0]]
    if t.dim() == 1 or name.startswith("position_embd"):
        qtype = gguf.GGMLQuantizationType.F32
    return gguf.quants.quantize(t.numpy(), qtype), qtype


def _q8_0_refusal(tensors: dict[str, torch.Tensor], dtype: str) -> None:
    """Refuse q8_0 for a tensor whose rows are not whole blocks (``gguf.quants`` would raise
    half-way)."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    bad = next(
        (
            n
            for n, t in tensors.items()
            if t.dim() > 1 and not n.startswith("position_embd") and t.shape[-1] % block
        ),
        None,
    )
    if dtype == "q8_0" and bad:
        raise MinigptError(
            f"--dtype q8_0: {bad} has rows of {tensors[bad].shape[-1]}, not whole blocks of "
            f"{block}; pass --dtype f16 or f32"
        )


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is a regular file that ``gguf``'s reader reads and that carries
    :data:`GGUF_MARK`."""
    import gguf

    with contextlib.suppress(OSError, ValueError):  # unreadable, empty, not a GGUF: not ours
        return (
            path.is_file() and not path.is_symlink() and GGUF_MARK in gguf.GGUFReader(path).fields
        )
    return False


def _write(
    out: Path,
    mc: ModelConfig,
    arch: str,
    tensors: dict[str, torch.Tensor],
    vocab: dict,
    dtype: str,
    name: str,
) -> None:
    """Write the GGUF to a temporary file beside ``out`` (those a killed export left swept first),
    then rename it into place; the keys are those ``convert_hf_to_gguf.py`` writes for the
    architecture."""
    import gguf

    for left in out.parent.glob(f"{glob.escape(_TEMP.format(out.name))}*.tmp"):
        if left.is_file() and not left.is_symlink():
            left.unlink(missing_ok=True)
    w = gguf.GGUFWriter(None, arch)
    w.add_name(name)
    w.add_uint32(GGUF_MARK, 1)
    w.add_file_type(gguf.LlamaFileType[_DTYPES[dtype][1]])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(mc.block_size)
    w.add_embedding_length(mc.n_embd)
    w.add_block_count(mc.n_layer)
    w.add_feed_forward_length(mc.ffn_hidden)
    w.add_head_count(mc.n_head)
    if arch == "llama":
        w.add_head_count_kv(mc.kv_heads)
        w.add_layer_norm_rms_eps(mc.norm_eps)
        w.add_rope_freq_base(mc.rope_base)
        w.add_rope_dimension_count(mc.head_dim)
        w.add_vocab_size(mc.vocab_size)
    else:
        w.add_layer_norm_eps(mc.norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(
        "gpt-2"
    )  # llama.cpp's name for GPT-2's split regex, which our byte-level BPE uses
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["token_type"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["eos"])
    w.add_eos_token_id(vocab["eos"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    for tname, t in tensors.items():
        data, qtype = _stored(tname, t, dtype)
        w.add_tensor(tname, data, raw_dtype=qtype)
    fd, tmp = tempfile.mkstemp(prefix=_TEMP.format(out.name), suffix=".tmp", dir=out.parent)
    try:
        chmod_quietly(
            fd, new_file_mode()
        )  # mkstemp makes 0600: an export is as readable as any new file
        os.close(fd)
        w.write_header_to_file(Path(tmp))
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(
            missing_ok=True
        )  # what a failed write left; after the rename there is nothing


def export_gguf(
    run: Optional[str | Path],
    output: str | Path,
    *,
    dtype: str = "f32",
    checkpoint: str = runs.BEST,
    force: bool = False,
    echo: Callable[[str], None] = lambda message: None,
    ema: bool = True,
) -> Path:
    """Write a run's checkpoint as the GGUF file ``output`` (``dtype`` f32, f16 or q8_0),
    atomically, with its EMA weights where it kept them unless ``ema`` is False; a
    :class:`MinigptError` for an output that is a folder, exists (without ``force``) or is no GGUF
    of ours, for each refusal of :func:`gguf_arch`, and for a failed write."""
    out = Path(output)
    run_dir, ckpt = runs.open_checkpoint(run, checkpoint)
    if out.is_dir():
        raise MinigptError(f"{out} exists and is not a file; pass another --output")
    if out.exists() and not force:
        raise MinigptError(f"{out} exists; pass --force to replace it, or another --output")
    if force and out.exists() and not _is_ours(out):
        raise MinigptError(
            f"{out} is not a GGUF minigpt wrote (no {GGUF_MARK}); pass another --output"
        )
    # generate's checks: checksums, finite weights, the run's own tokenizer
    loaded = load_run(run_dir, checkpoint, ema=ema)
    cfg = loaded.config
    arch = gguf_arch(cfg.model, cfg.tokenizer)
    vocab = tokenizer_fields(loaded.tokenizer, cfg.tokenizer.kind, cfg.model.vocab_size)
    tensors = gguf_tensors(loaded.model, cfg.model, arch)
    _q8_0_refusal(tensors, dtype)
    with os_errors(out):  # named as the user gave it, not as the temporary file beside it
        out.parent.mkdir(parents=True, exist_ok=True)
        _write(out, cfg.model, arch, tensors, vocab, dtype, run_dir.name)
    if loaded.weights_note() is not None:
        echo(loaded.weights_note())
    echo(f"exported {run_dir} ({ckpt.name}) as a GGUF {arch} ({dtype}) to {out}")
    return out
