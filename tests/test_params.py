"""Analytic parameter / FLOP / memory accounting (minigpt_cli.accounting.params).

Known values come from the GPT-2 and Llama releases, nanoGPT and Kaplan et al.
2020; the analytic counts are cross-checked against our own GPT and the Hugging
Face GPT-2 and Llama models, all built on the meta device (no memory, no
weights downloaded).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minigpt_cli import paths
from minigpt_cli.accounting import params
from minigpt_cli.config.schema import ModelConfig, load_config
from minigpt_cli.errors import MinigptError

ROOT = Path(__file__).resolve().parent.parent
PRESETS = [
    "gpt2-small",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "llama2-7b",
    "llama2-13b",
    "llama3-8b",
    "shakespeare-char",
]
#: The example configs and the presets (package data in minigpt_cli/config/presets/).
ALL_YAML = sorted((ROOT / "configs").rglob("*.yaml")) + sorted(
    (ROOT / "minigpt_cli" / "config" / "presets").glob("*.yaml")
)
#: Vocabulary for training configs whose vocab_size comes from the tokenizer.
CHAR_VOCAB = 65


def preset(name: str) -> ModelConfig:
    return load_config(paths.preset_path(name)).model


def variant(base: ModelConfig, **update) -> ModelConfig:
    """A validated copy of ``base`` with some fields changed."""
    return ModelConfig.model_validate({**base.model_dump(), **update})


# ----------------------------------------------------------------------------- known values


@pytest.mark.parametrize(
    "name, total",
    [
        ("gpt2-small", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama3-8b", 8_030_261_248),
        ("shakespeare-char", 10_745_088),
    ],
)
def test_preset_totals(name, total):
    assert params.count(preset(name)).total == total


def test_presets_shipped():
    assert set(PRESETS) <= set(paths.list_presets())


def test_gpt2_small_closed_form():
    # wte + wpe + 12 blocks (4d² + 4d attention, 8d² + 5d MLP, 2·2d LayerNorms) + the final
    # LayerNorm.
    V, P, d, L = 50257, 1024, 768, 12
    assert (
        params.count(preset("gpt2-small")).total
        == V * d + P * d + L * (12 * d * d + 13 * d) + 2 * d
    )


def test_shakespeare_char_without_positions():
    cfg = preset("shakespeare-char")
    for pos in ("rope", "none", "sinusoidal"):
        pc = params.count(variant(cfg, pos_encoding=pos))
        assert pc.total == 10_646_784
        assert pc.position_embedding == 0


def test_gpt2_small_untied_and_padded():
    cfg = preset("gpt2-small")
    untied = params.count(variant(cfg, tie_weights=False))
    assert untied.total == 163_037_184
    assert untied.lm_head == 50257 * 768
    assert params.count(cfg, vocab_size=50304).total == 124_475_904


def test_gpt2_small_breakdown():
    pc = params.count(preset("gpt2-small"))
    layer = pc.layer
    assert layer.attention == 2_362_368  # 4d² + 4d: "2.36M"
    assert layer.ffn == 4_722_432  # 8d² + 5d: "4.72M"
    assert layer.norms == 4 * 768
    assert layer.ffn / layer.total == pytest.approx(2 / 3, abs=1e-3)
    assert params.human(layer.attention) == "2.36M"
    assert params.human(layer.ffn) == "4.72M"
    assert pc.embedding == 38_597_376 + 786_432  # wte + wpe
    assert params.human(pc.embedding) == "39.4M"
    # Exact non-embedding count, and Kaplan's 12·L·d² (no biases, no norms): the "84.9M".
    assert pc.non_embedding == 85_056_000
    assert pc.non_embedding_matrices == pc.kaplan_approximation == 12 * 12 * 768**2 == 84_934_656
    assert params.human(pc.kaplan_approximation) == "84.9M"
    # nanoGPT prints get_num_params(non_embedding=True), the total less wpe only: "123.65M".
    assert pc.without_positions == 123_653_376
    assert pc.final_norm == 2 * 768 and pc.lm_head == 0


def test_llama_breakdown():
    pc = params.count(preset("llama3-8b"))
    d, kv = 4096, 8 * 128
    assert pc.layer.attn_q == pc.layer.attn_o == d * d
    assert pc.layer.attn_k == pc.layer.attn_v == d * kv  # grouped-query
    assert pc.layer.ffn == 3 * d * 14336
    assert pc.layer.norms == 2 * d  # RMSNorm: weight only
    assert pc.layer.attn_bias == pc.layer.ffn_bias == 0
    # The untied head is a vocabulary matrix: not in the non-embedding count.
    assert pc.embedding == 2 * 128256 * d
    assert (
        pc.non_embedding
        == 32 * (4 * d * d - 2 * d * (d - kv) + 3 * d * 14336 + 2 * d) + d
        == 6_979_588_096
    )
    assert preset("llama2-7b").ffn_hidden == 11008
    assert preset("llama3-8b").rope_base == 500000.0


def test_kaplan_approximation_and_exact_matrices_differ_for_swiglu():
    """12·L·d² assumes d_ff = 4d; Llama-2-7B's SwiGLU has three d×11008 matrices, so the exact count
    is larger."""
    pc = params.count(preset("llama2-7b"))
    assert pc.kaplan_approximation == 12 * 32 * 4096**2 == 6_442_450_944
    assert pc.non_embedding_matrices == 32 * (4 * 4096**2 + 3 * 4096 * 11008) == 6_476_005_376
    text = params.format_report(params.report(preset("llama2-7b")), "llama2-7b")
    assert any(
        "Kaplan's approximation 12·L·d²" in line and "6,442,450,944" in line
        for line in text.splitlines()
    )
    assert any(
        "weight matrices only (exact)" in line and "6,476,005,376" in line
        for line in text.splitlines()
    )


def test_non_embedding_independent_of_tying():
    cfg = preset("gpt2-small")
    tied, untied = params.count(cfg), params.count(variant(cfg, tie_weights=False))
    assert tied.non_embedding == untied.non_embedding
    assert untied.total - tied.total == untied.lm_head


def test_post_ln_has_no_final_norm():
    cfg = preset("gpt2-small")
    pc = params.count(variant(cfg, norm_position="post"))
    assert pc.final_norm == 0
    assert pc.total == params.count(cfg).total - 2 * 768


def test_vocab_size_required():
    cfg = variant(preset("shakespeare-char"), vocab_size=None)
    with pytest.raises(MinigptError, match="--vocab-size"):
        params.count(cfg)
    with pytest.raises(MinigptError, match="--vocab-size"):
        params.report(cfg)
    assert params.count(cfg, vocab_size=65).total == 10_745_088


# ----------------------------------------------------------------------------- FLOPs


def test_linear_flops():
    assert params.linear_flops(768, 3072) == (4_718_592, 9_437_184)


@pytest.mark.parametrize("T, share", [(1024, 0.10), (4096, 0.31)])
def test_gpt2_small_attention_share(T, share):
    fl = params.flops(preset("gpt2-small"), T)
    assert round(fl["attention_share"], 2) == share
    assert fl["attention_forward"] == 2 * 12 * T * 768
    assert fl["dense_forward"] == 2 * 85_056_000
    assert fl["forward"] == fl["dense_forward"] + fl["attention_forward"]
    assert fl["train"] == 3 * fl["forward"]
    assert fl["lm_head_forward"] == 2 * 50257 * 768


def test_training_flops_is_6ND():
    cfg = preset("llama2-7b")
    rep = params.report(cfg, seq_len=1, tokens=2 * 10**12)
    N = rep["non_embedding"]
    assert rep["training_flops"] == rep["flops_per_token_train"] * 2 * 10**12
    assert rep["training_flops"] == pytest.approx(6 * N * 2 * 10**12, rel=1e-4)


def test_mfu_flops_match_nanogpt():
    # nanoGPT's estimate_mfu: 6N + 12·L·H·Q·T with N = params minus wpe (tied wte = lm_head).
    cfg = preset("gpt2-small")
    pc = params.count(cfg)
    n_nanogpt = pc.total - pc.position_embedding
    assert params.flops(cfg, 1024)["mfu_train"] == 6 * n_nanogpt + 12 * 12 * 12 * 64 * 1024


# ----------------------------------------------------------------------------- memory and report


def test_memory_adamw():
    cfg = preset("gpt2-small")
    N = 124_439_808
    fp32 = params.memory(cfg, "float32", 1, 1024)
    assert (fp32["weights"], fp32["gradients"], fp32["master_weights"], fp32["adam_moments"]) == (
        4 * N,
        4 * N,
        0,
        8 * N,
    )
    assert fp32["model_states"] == 16 * N
    bf16 = params.memory(cfg, "bfloat16", 1, 1024)
    assert (bf16["weights"], bf16["gradients"], bf16["master_weights"]) == (2 * N, 2 * N, 4 * N)
    assert bf16["model_states"] == 16 * N and bf16["mixed_precision"]
    # Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer at 16 bit.
    s, b, h, a = 1024, 1, 768, 12
    assert bf16["activations_estimate"] == 12 * (s * b * h * 34 + 5 * a * s * s * b)
    assert fp32["activations_estimate"] == 2 * bf16["activations_estimate"]
    assert bf16["activations_estimate_fused"] == 12 * s * b * h * 34
    assert (
        params.memory(cfg, "float32", 4, 1024)["activations_estimate"]
        == 4 * fp32["activations_estimate"]
    )
    with pytest.raises(MinigptError, match="dtype"):
        params.memory(cfg, "int8", 1, 1024)


def test_report_keys_and_json():
    cfg = preset("gpt2-small")
    rep = params.report(cfg)
    for key in (
        "total",
        "non_embedding",
        "embedding",
        "per_layer",
        "flops_per_token_forward",
        "flops_per_token_train",
        "seq_len",
    ):
        assert key in rep
    assert rep["seq_len"] == 1024  # block_size by default
    assert rep["total"] == 124_439_808
    assert (rep["non_embedding"], rep["embedding"]) == (85_056_000, 39_383_808)
    assert (
        rep["total_without_positions"] == 123_653_376
    )  # nanoGPT's "number of parameters: 123.65M"
    assert (rep["kaplan_approximation"], rep["non_embedding_matrices"]) == (84_934_656, 84_934_656)
    assert rep["per_layer"]["attention"] == 2_362_368
    assert rep["flops_per_token_train"] == 3 * rep["flops_per_token_forward"]
    assert "training_flops" not in rep
    assert json.loads(json.dumps(rep)) == rep
    rep = params.report(cfg, seq_len=4096, tokens=10**9, dtype="bfloat16", batch_size=8)
    assert rep["seq_len"] == 4096 and round(rep["attention_flops_share"], 2) == 0.31
    assert rep["memory"]["batch_size"] == 8 and rep["memory"]["dtype"] == "bfloat16"
    with pytest.raises(MinigptError):
        params.report(cfg, seq_len=0)
    from minigpt_cli.accounting.count import count_params

    for tokens in (0, 1.5, float("inf"), float("nan")):  # checked once, where the number comes in
        with pytest.raises(MinigptError, match="--tokens .*: give a whole number"):
            count_params(cfg, tokens=tokens)
    with pytest.raises(MinigptError, match="--dtype 'float8'"):
        count_params(cfg, dtype="float8")


@pytest.mark.parametrize("name", PRESETS)
def test_format_report(name):
    rep = params.report(preset(name), tokens=10**10)
    text = params.format_report(rep, name)
    assert f"{rep['total']:,}" in text
    assert params.human(rep["total"]) in text
    assert "FLOPs per token" in text and "estimate" in text


def test_format_report_gpt2_small():
    text = params.format_report(params.report(preset("gpt2-small")), "gpt2-small")
    assert text.startswith("gpt2-small: 124,439,808 parameters (124.4M)")
    assert "10.0% of forward" in text
    assert "4,722,432" in text and "2,362,368" in text
    assert any("(nanoGPT's count)" in line and "123,653,376" in line for line in text.splitlines())


def test_format_report_names_the_overrides():
    """A preset changed by --set is not the preset: the header says so."""
    two = variant(preset("gpt2-small"), n_layer=2)
    text = params.format_report(params.report(two), "gpt2-small", overrides=["model.n_layer=2"])
    total = 50257 * 768 + 1024 * 768 + 2 * (12 * 768**2 + 13 * 768) + 2 * 768
    assert text.startswith(f"gpt2-small (with overrides: model.n_layer=2): {total:,} parameters")


def test_human():
    assert params.human(124_439_808) == "124.4M"
    assert params.human(6_738_415_616) == "6.74B"
    assert params.human(512) == "512"


def test_no_torch_on_the_analytic_path():
    code = (
        "import sys\n"
        "from minigpt_cli import paths\nfrom minigpt_cli.accounting import params\nfrom minigpt_cli.config import schema as config\n"
        "cfg = config.load_config(paths.preset_path('llama2-7b'))\n"
        "params.format_report(params.report(cfg.model), 'llama2-7b')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_count_params_never_imports_torch(tmp_path, corpus_file):
    """The command, for a preset, a config file and a fine-tuning config whose architecture is a
    folder's config.json: arithmetic only, so it answers in a fraction of a second (torch takes
    seconds to import)."""
    from minigpt_cli.tokenizer.training import train_tokenizer

    folder = (
        tmp_path / "gpt2"
    )  # a save_pretrained folder as count-params reads it: no weights are opened
    folder.mkdir()
    hf = {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "n_positions": 48,
        "vocab_size": 300,
    }
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "model.safetensors").write_bytes(b"")
    train_tokenizer("bpe", corpus_file.read_text()[:20_000], 300, []).save(
        folder / "tokenizer.json"
    )
    commands = [
        ["--preset", "llama2-7b"],
        ["--config", "configs/shakespeare-cpu.yaml"],
        [
            "--config",
            "configs/finetune-gpt2.yaml",
            "--set",
            f"model.init_from={folder}",
            "--set",
            "model.block_size=32",
        ],
    ]
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from minigpt_cli.cli import app\n"
        f"for args in {commands!r}:\n"
        "    res = CliRunner().invoke(app, ['count-params', *args, '--json'])\n"
        "    print(json.dumps([res.exit_code, json.loads(res.stdout)['total'], 'torch' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    results = [json.loads(line) for line in out.splitlines()]
    assert [torch for _, _, torch in results] == [False, False, False], results
    assert [code for code, _, _ in results] == [0, 0, 0]
    # The fine-tuning config counts the folder's GPT-2: 300·32 + 48·32 + 2·(12·32² + 13·32) + 2·32.
    assert results[2][1] == 300 * 32 + 32 * 32 + 2 * (12 * 32**2 + 13 * 32) + 2 * 32


# ----------------------------------------------------------------------------- every shipped YAML


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_yaml_counts(path):
    cfg = load_config(path).model
    V = cfg.vocab_size or CHAR_VOCAB
    rep = params.report(cfg, vocab_size=V, tokens=1000)
    assert (
        rep["total"] > 0 and json.loads(json.dumps(rep)) == rep
    )  # the meta-model tests check the numbers
    assert f"{rep['total']:,} parameters" in params.format_report(rep, path.name)


# ----------------------------------------------------------------------------- cross-checks on meta


def meta_model_counts(cfg: ModelConfig) -> dict[str, int]:
    """Our GPT built on the meta device, counted by parameter name (tied weights once).

    ``non_embedding``: all but wte, wpe, lm_head and the value embeddings (Kaplan et al. 2020's N);
    ``total_without_positions``: all but wpe (nanoGPT's ``get_num_params()``).
    """
    import torch

    from minigpt_cli.model.gpt import GPT

    with torch.device("meta"):
        model = GPT(cfg)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    return {
        "total": sum(sizes.values()),
        "non_embedding": sum(
            n
            for name, n in sizes.items()
            if name.split(".")[0] not in ("wte", "wpe", "lm_head", "value_embeds")
        ),
        "total_without_positions": sum(
            n for name, n in sizes.items() if not name.startswith("wpe.")
        ),
    }


def analytic_counts(cfg: ModelConfig) -> dict[str, int]:
    pc = params.count(cfg)
    return {
        "total": pc.total,
        "non_embedding": pc.non_embedding,
        "total_without_positions": pc.without_positions,
    }


def _variants() -> list[tuple[str, ModelConfig]]:
    base = variant(preset("shakespeare-char"), n_layer=2, n_embd=64, n_head=4, block_size=32)
    cases = {
        "base": {},
        "post-ln": {"norm_position": "post"},
        "rmsnorm": {"norm": "rmsnorm"},
        "rmsnorm-bias-post": {"norm": "rmsnorm", "bias": True, "norm_position": "post"},
        "layernorm-bias": {"bias": True},
        "swiglu": {"ffn": "swiglu"},
        "swiglu-bias": {"ffn": "swiglu", "bias": True},
        "swiglu-d_ff": {"ffn": "swiglu", "d_ff": 100, "multiple_of": 32},
        "relu": {"ffn": "relu"},
        "gelu_tanh-d_ff": {"ffn": "gelu_tanh", "d_ff": 96},
        "rope": {"pos_encoding": "rope"},
        "sinusoidal": {"pos_encoding": "sinusoidal"},
        "none": {"pos_encoding": "none"},
        "untied": {"tie_weights": False},
        "gqa": {"n_kv_head": 2, "bias": True},
        "mqa": {"n_kv_head": 1},
        "emb_scale": {"emb_scale": True},
        "llama-like": {
            "norm": "rmsnorm",
            "ffn": "swiglu",
            "pos_encoding": "rope",
            "bias": False,
            "tie_weights": False,
            "n_kv_head": 2,
        },
        "qk_norm": {"qk_norm": True, "pos_encoding": "rope"},
        "qk_norm-post-layernorm-bias": {"qk_norm": True, "norm_position": "post", "bias": True},
        "relu2": {"ffn": "relu2"},
        "logit_softcap": {"logit_softcap": 15.0},
        "zero_init_proj": {"zero_init_proj": True},
        "value_embeddings": {"value_embeddings": True},
        "value_embeddings-3-layers-gqa-untied": {
            "value_embeddings": True,
            "n_layer": 3,
            "n_kv_head": 2,
            "tie_weights": False,
        },
        "value_embeddings-narrow": {"value_embeddings": True, "n_embd": 8, "n_head": 2},
        "all-switches-llama-like": {
            "qk_norm": True,
            "ffn": "relu2",
            "logit_softcap": 30.0,
            "zero_init_proj": True,
            "value_embeddings": True,
            "norm": "rmsnorm",
            "pos_encoding": "rope",
            "bias": False,
            "n_kv_head": 1,
            "n_layer": 5,
        },
    }
    return [(k, variant(base, **v)) for k, v in cases.items()]


@pytest.mark.parametrize("name", PRESETS)
def test_meta_model_matches_presets(name):
    cfg = preset(name)
    assert meta_model_counts(cfg) == analytic_counts(cfg)


def test_meta_model_gpt2_small_in_nanogpt_terms():
    counts = meta_model_counts(preset("gpt2-small"))
    assert (
        counts["total_without_positions"] == 123_653_376 and counts["non_embedding"] == 85_056_000
    )


@pytest.mark.parametrize("name, cfg", _variants(), ids=[k for k, _ in _variants()])
def test_meta_model_matches_variants(name, cfg):
    assert meta_model_counts(cfg) == analytic_counts(cfg)


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(ROOT)))
def test_meta_model_matches_shipped_yaml(path):
    cfg = load_config(path).model
    if cfg.vocab_size is None:
        cfg = variant(cfg, vocab_size=CHAR_VOCAB)
    assert meta_model_counts(cfg) == analytic_counts(cfg)


def hf_gpt2(cfg: ModelConfig):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.d_ff,
        tie_word_embeddings=cfg.tie_weights,
    )
    with torch.device("meta"):
        return GPT2LMHeadModel(hf_cfg)


def hf_llama(cfg: ModelConfig):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.block_size,
        tie_word_embeddings=cfg.tie_weights,
        attention_bias=False,
        mlp_bias=False,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(hf_cfg)


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_transformers_gpt2(name):
    pytest.importorskip("transformers")
    cfg = preset(name)
    # num_parameters() counts the tied head once, as we do; without the embeddings (wte, wpe) it is
    # N.
    model = hf_gpt2(cfg)
    assert model.num_parameters() == params.count(cfg).total
    assert model.num_parameters(exclude_embeddings=True) == params.count(cfg).non_embedding


def test_transformers_gpt2_untied():
    pytest.importorskip("transformers")
    cfg = variant(preset("gpt2-small"), tie_weights=False)
    assert hf_gpt2(cfg).num_parameters() == params.count(cfg).total == 163_037_184


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-13b", "llama3-8b"])
def test_transformers_llama(name):
    pytest.importorskip("transformers")
    cfg = preset(name)
    assert hf_llama(cfg).num_parameters() == params.count(cfg).total


def test_cli_overrides_and_linear_flops(cli):
    """The issue's CLI checks: untied and padded GPT-2 small, and one 768×3072 matrix's FLOPs."""
    import json

    untied = json.loads(
        cli(
            "count-params", "--preset", "gpt2-small", "--set", "model.tie_weights=false", "--json"
        ).stdout
    )
    assert untied["total"] == 163_037_184
    padded = json.loads(
        cli("count-params", "--preset", "gpt2-small", "--vocab-size", "50304", "--json").stdout
    )
    assert padded["total"] == 124_475_904
    up = json.loads(cli("count-params", "--preset", "gpt2-small", "--json").stdout)[
        "linear_flops_per_token"
    ]["ffn_up"]
    assert (up["in"], up["out"], up["forward"], up["backward"]) == (768, 3072, 4_718_592, 9_437_184)


def test_a_seq_len_beyond_block_size_gets_a_note(cli):
    res = cli("count-params", "--preset", "gpt2-small", "--seq-len", "2048", "--json")
    assert res.exit_code == 0, res
    assert json.loads(res.stdout)["seq_len"] == 2048  # still computed: the arithmetic is asked for
    assert "note: --seq-len 2,048 is beyond block_size 1,024" in res.stderr
    within = cli("count-params", "--preset", "gpt2-small", "--seq-len", "1024", "--json")
    assert within.exit_code == 0 and within.stderr == ""


def test_an_assumed_vocabulary_is_said_and_counts_the_special_tokens(cli):
    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    res = cli(
        "count-params",
        "--config",
        tiny,
        "--set",
        "tokenizer.special_tokens=['<|endoftext|>']",
        "--json",
    )
    assert res.exit_code == 0, res
    assert (
        json.loads(res.stdout)["token_embedding"] == 66 * 32
    )  # what train finds: 65 characters and the special token
    assert (
        "counting with 66 entries (Tiny Shakespeare's 65 characters and 1 special token)"
        in res.stderr
    )
    given = cli("count-params", "--config", tiny, "--vocab-size", "100", "--json")
    assert json.loads(given.stdout)["token_embedding"] == 100 * 32 and given.stderr == ""


def test_the_header_names_the_overrides_that_took_effect(cli):
    """A flag beats the --set of its key, a later --set beats an earlier one, and --vocab-size is
    named."""
    head = lambda *args: cli("count-params", "--preset", "gpt2-small", *args).stdout.splitlines()[0]  # noqa: E731
    assert head("--vocab-size", "50304").startswith(
        "gpt2-small (with overrides: --vocab-size 50304): 124,475,904"
    )
    assert head("--set", "model.vocab_size=100", "--vocab-size", "50304").startswith(
        "gpt2-small (with overrides: --vocab-size 50304): 124,475,904"
    )
    assert head(
        "--set", "model.n_layer=3", "--set", "model.tie_weights=false", "--set", "model.n_layer=2"
    ).startswith("gpt2-small (with overrides: model.tie_weights=false, model.n_layer=2): ")
    assert head().startswith("gpt2-small: 124,439,808")
    assert head("--set", "train.batch_size=8", "--batch-size", "4").startswith("gpt2-small: ")


def test_the_memory_section_counts_with_the_configs_train_settings(cli):
    def memory(*args):
        res = cli("count-params", *args, "--json")
        assert res.exit_code == 0, res
        mem = json.loads(res.stdout)["memory"]
        return mem["batch_size"], mem["dtype"]

    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    assert memory("--preset", "gpt2-small") == (1, "float32")  # a preset has no train section
    assert memory("--preset", "gpt2-small", "--set", "train.batch_size=8") == (8, "float32")
    assert memory("--preset", "gpt2-small", "--set", "train.batch_size=8", "--batch-size", "2") == (
        2,
        "float32",
    )
    assert memory("--config", tiny, "--vocab-size", "65") == (
        8,
        "float32",
    )  # tiny.yaml's train.batch_size
    assert memory("--config", tiny, "--vocab-size", "65", "--set", "dtype=bfloat16") == (
        8,
        "bfloat16",
    )
    text = cli("count-params", "--preset", "gpt2-small", "--set", "train.batch_size=8").stdout
    assert "batch 8 × T=1,024" in text


def _memory_figure(text: str, marker: str) -> str:
    (line,) = [line for line in text.splitlines() if marker in line]
    return re.search(r"(\d+\.\d\d [KMGT]?i?B)", line).group(1)


def test_dry_run_and_count_params_give_one_memory_figure_for_every_shipped_config(
    cli, corpus_file, tmp_path, monkeypatch
):
    """train --dry-run's "memory to train" is count-params' "total, estimate" for each shipped
    config, in a folder without the corpus (the vocabulary counted alike before the tokenizer
    exists). The fine-tuning config gets a tiny GPT-2 folder of its own."""
    from minigpt_cli.paths import list_configs
    from minigpt_cli.trainer import estimate

    monkeypatch.chdir(tmp_path)
    # The dry run's time estimate trains a few steps of each config (bfloat16 ones emulated on an
    # AVX2 CPU, seconds a step): this test reads the memory figure only, so the steps are not run.
    monkeypatch.setattr(
        estimate, "step_seconds", lambda cfg, device, dtype: (1.0, 0.0, 0.1, "not run")
    )
    names = list_configs()
    assert "shakespeare-cpu" in names and "finetune-gpt2" in names
    for name in names:
        extra = []
        if name == "finetune-gpt2":
            extra = ["--set", f"model.init_from={_tiny_gpt2(tmp_path, corpus_file)}"]
        dry = cli("train", name, *extra, "--dry-run")
        assert dry.exit_code == 0, (name, dry)
        counted = cli("count-params", "--config", name, *extra)
        assert counted.exit_code == 0, (name, counted)
        assert _memory_figure(dry.stdout, "memory to train") == _memory_figure(
            counted.stdout, "total, estimate"
        ), name


def _tiny_gpt2(tmp_path, corpus_file):
    transformers = pytest.importorskip("transformers")
    from minigpt_cli.tokenizer.training import train_tokenizer

    folder = tmp_path / "gpt2"
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=512, vocab_size=300)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok = train_tokenizer("bpe", corpus_file.read_text()[:50_000], 300, ["<|endoftext|>"])
    tok.save(folder / "tokenizer.json")
    return folder


def test_count_params_rows_line_up_under_the_count_column(cli):
    """Every row of the parameter table (value embeddings and every label on) ends its count where
    the header's "count" ends, the longest label included."""
    res = cli(
        "count-params",
        "--preset",
        "gpt2-small",
        "--set",
        "model.value_embeddings=true",
        "--set",
        "model.tie_weights=false",
    )
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("parameters "))
    end = lines[head].index("count") + len("count")
    rows = lines[head + 1 : lines.index("", head)]
    assert any(line.startswith("embedding (") for line in rows)
    for line in rows:
        assert line[end - 1].isdigit() and line[end : end + 2] == "  ", line
