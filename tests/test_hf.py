"""Our GPT against Hugging Face ``transformers``: GPT-2, Llama and GPT-NeoX, built locally with
random weights.

Nothing is downloaded: each reference model is made from a small config,
given random weights (wider than the 0.02 init, with norm gains and biases
away from 1 and 0, so that a wrong pairing, a missing norm or an untied head
shows up far above the tolerance), saved with ``save_pretrained`` to a
temporary folder and read back through our importer.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from minigpt_cli.errors import MinigptError
from minigpt_cli.hf.load import (
    gpt2_config_from_hf,
    llama_config_from_hf,
    load_gpt2_state_dict,
    load_hf_folder,
    load_llama_state_dict,
)
from minigpt_cli.model.gpt import apply_rope, rope_cos_sin  # noqa: E402

transformers.logging.set_verbosity_error()
V = 97


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights N(0, 0.15); norm gains 1 + N(0, 0.2); biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name or ".ln_" in name:
                p.copy_(1 + 0.2 * noise if name.endswith("weight") else 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.15 * noise)
    return model.eval()


def gpt2_reference(tmp_path, tie: bool = True, **kw):
    cfg = GPT2Config(
        n_layer=3,
        n_head=4,
        n_embd=32,
        n_positions=24,
        vocab_size=V,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
        **kw,
    )
    torch.manual_seed(0)
    ref = randomize(GPT2LMHeadModel(cfg))
    ref.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    return ref


def llama_reference(tmp_path, **kw):
    base = dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=56,
        vocab_size=V,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    base.update(kw)
    torch.manual_seed(0)
    ref = randomize(LlamaForCausalLM(LlamaConfig(**base)))
    ref.save_pretrained(tmp_path)
    return ref


def neox_reference(tmp_path, **kw):
    """A sequential-residual GPT-NeoX rotating whole heads: the block minigpt's rope + layernorm
    model is."""
    base = dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        hidden_size=32,
        intermediate_size=56,
        vocab_size=V,
        max_position_embeddings=64,
        rotary_pct=1.0,
        rotary_emb_base=10000.0,
        use_parallel_residual=False,
        hidden_act="relu",
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    ref = randomize(GPTNeoXForCausalLM(GPTNeoXConfig(**{**base, **kw})))
    ref.save_pretrained(tmp_path)
    return ref


@pytest.mark.parametrize(
    "kw,ffn",
    [
        ({}, "relu"),
        (
            {"tie_word_embeddings": True, "hidden_act": "gelu_new", "rotary_emb_base": 500.0},
            "gelu_tanh",
        ),
    ],
    ids=["untied", "tied"],
)
def test_gpt_neox_logits_equal_transformers(tmp_path, kw, ffn):
    """Biases everywhere (attention_bias, transformers' default), the fused query_key_value per
    head, rotate-half RoPE over the whole head, LayerNorm before each sub-layer and a sequential
    residual."""
    ref = neox_reference(tmp_path, **kw)
    ours = load_hf_folder(tmp_path)
    cfg = ours.config
    assert (cfg.pos_encoding, cfg.norm, cfg.ffn, cfg.bias, cfg.rope_base, cfg.block_size) == (
        "rope",
        "layernorm",
        ffn,
        True,
        kw.get("rotary_emb_base", 10000.0),
        64,
    )
    assert (ours.lm_head.weight is ours.wte.weight) is cfg.tie_weights is bool(kw)
    x = torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(x).logits
        logits, _ = ours(x)
    assert expected.abs().max() > 2
    diff = (logits - expected).abs().max().item()
    assert diff < 1e-5, diff


def test_gpt_neox_without_attention_biases_needs_zero_mlp_and_norm_biases(tmp_path):
    """``attention_bias: false`` is our ``bias: false``, whose MLP and LayerNorm have none:
    GPT-NeoX's are zeros then (as an export writes them), or the file is refused, naming the
    tensor."""
    ref = neox_reference(tmp_path, attention_bias=False)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    ref.save_pretrained(tmp_path)
    ours = load_hf_folder(tmp_path)
    assert not ours.config.bias
    x = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(x)[0] - ref(x).logits).abs().max().item() < 1e-5
    with torch.no_grad():
        ref.gpt_neox.layers[1].mlp.dense_h_to_4h.bias[3] = 0.5
    ref.save_pretrained(tmp_path)
    with pytest.raises(MinigptError, match="layers.1.mlp.dense_h_to_4h.bias is not zero"):
        load_hf_folder(tmp_path)


@pytest.mark.parametrize(
    "kw,fragment",
    [
        ({"rotary_pct": 0.25}, "rotates 0.25 of each head"),
        ({"use_parallel_residual": True}, "use_parallel_residual True is not supported"),
    ],
)
def test_gpt_neox_options_we_do_not_compute_are_refused(tmp_path, kw, fragment):
    """Partial rotary (Pythia's 0.25) and the parallel residual (both transformers' defaults) are
    other models."""
    neox_reference(tmp_path, **kw)
    with pytest.raises(MinigptError) as e:
        load_hf_folder(tmp_path)
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_gpt2_logits_and_loss_equal_transformers(tmp_path, tie):
    ref = gpt2_reference(tmp_path, tie=tie)
    ours = load_hf_folder(tmp_path)
    cfg = ours.config
    assert (cfg.pos_encoding, cfg.norm, cfg.norm_position, cfg.ffn, cfg.bias) == (
        "learned",
        "layernorm",
        "pre",
        "gelu_tanh",
        True,
    )  # gelu_new is the tanh GELU
    assert cfg.tie_weights is tie and (ours.lm_head.weight is ours.wte.weight) is tie
    x = torch.randint(0, V, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(x, labels=x)
        logits, _ = ours(x)
        _, loss = ours(x[:, :-1], x[:, 1:])  # HF shifts the labels inside
    assert expected.logits.abs().max() > 2  # far from uniform: differences would show
    diff = (logits - expected.logits).abs().max().item()
    assert diff < 1e-5, diff
    assert loss.item() == pytest.approx(expected.loss.item(), abs=1e-5)


def test_llama_logits_equal_transformers(tmp_path):
    """RMSNorm, SwiGLU, RoPE (rotate-half), no bias, untied, 4 query heads sharing 2 key/value
    heads."""
    ref = llama_reference(tmp_path)
    ours = load_hf_folder(tmp_path)
    cfg = ours.config
    assert (
        cfg.pos_encoding,
        cfg.norm,
        cfg.ffn,
        cfg.bias,
        cfg.tie_weights,
        cfg.n_kv_head,
        cfg.d_ff,
    ) == ("rope", "rmsnorm", "swiglu", False, False, 2, 56)
    assert ours.lm_head.weight is not ours.wte.weight
    x = torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(x, labels=x)
        logits, _ = ours(x)
        _, loss = ours(x[:, :-1], x[:, 1:])
    assert expected.logits.abs().max() > 2
    diff = (logits - expected.logits).abs().max().item()
    assert diff < 1e-5, diff
    assert loss.item() == pytest.approx(expected.loss.item(), abs=1e-5)


def test_llama_with_other_rope_base_and_tied_head(tmp_path):
    ref = llama_reference(
        tmp_path, rope_theta=500.0, tie_word_embeddings=True, num_key_value_heads=1
    )
    ours = load_hf_folder(tmp_path)
    assert ours.config.rope_base == 500.0 and ours.lm_head.weight is ours.wte.weight
    x = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = (ours(x)[0] - ref(x).logits).abs().max().item()
    assert diff < 1e-5, diff


def test_rope_equals_transformers_apply_rotary_pos_emb():
    """Our rotation of q and k is Hugging Face Llama's (rotate-half pairing), position by
    position."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hs, T = 16, 50
    rot = LlamaRotaryEmbedding(
        LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
    )
    q, k = torch.randn(2, 4, T, hs), torch.randn(2, 4, T, hs)
    pos = torch.arange(T)
    cos_ref, sin_ref = rot(q, pos[None])
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
    cos, sin = rope_cos_sin(pos, hs)
    assert torch.allclose(cos, cos_ref[0], atol=1e-6) and torch.allclose(sin, sin_ref[0], atol=1e-6)
    assert torch.allclose(apply_rope(q, cos, sin), q_ref, atol=1e-5)
    assert torch.allclose(apply_rope(k, cos, sin), k_ref, atol=1e-5)


def test_gpt2_block_size_is_cropped_never_grown(tmp_path):
    ref = gpt2_reference(tmp_path)
    short = load_hf_folder(tmp_path, block_size=16)
    assert short.config.block_size == 16 and short.wpe.weight.shape == (16, 32)
    x = torch.randint(0, V, (1, 16))
    with torch.no_grad():
        assert (short(x)[0] - ref(x).logits).abs().max() < 1e-5
    with pytest.raises(MinigptError, match=r"model\.block_size \(25\).*n_positions=24"):
        load_hf_folder(tmp_path, block_size=25)


def test_state_dict_mappers_take_hub_style_names(tmp_path):
    """Hub GPT-2 files have no ``transformer.`` prefix and carry causal-mask buffers; both are
    handled."""
    ref = gpt2_reference(tmp_path)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    cfg = gpt2_config_from_hf(hf_cfg)
    sd = {k.removeprefix("transformer."): v for k, v in ref.state_dict().items()}
    sd["h.0.attn.bias"] = torch.ones(1, 1, 24, 24)
    sd["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    ours = load_gpt2_state_dict(sd, cfg)
    assert "h.0.attn.bias" not in ours and "lm_head.weight" not in ours
    assert torch.equal(ours["h.1.mlp.c_fc.weight"], ref.transformer.h[1].mlp.c_fc.weight.t())
    llama = LlamaForCausalLM(
        LlamaConfig(
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=32,
            intermediate_size=40,
            vocab_size=V,
        )
    )
    lcfg = llama_config_from_hf(llama.config.to_dict())
    mapped = load_llama_state_dict(llama.state_dict(), lcfg)
    attn = llama.model.layers[0].self_attn
    assert torch.equal(
        mapped["h.0.attn.c_attn.weight"],
        torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
    )
    assert mapped["h.0.mlp.c_fc.weight"].shape == (80, 32)


def test_import_errors_are_one_line(tmp_path):
    def fails(*fragments, **kw):
        with pytest.raises(MinigptError) as e:
            load_hf_folder(tmp_path / "m", **kw)
        msg = str(e.value)
        assert "\n" not in msg
        for f in fragments:
            assert f in msg, (f, msg)

    fails("is not a folder")
    folder = tmp_path / "m"
    folder.mkdir()
    fails("config.json not found")
    (folder / "config.json").write_text("{not json")
    fails("not valid JSON")
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}))
    fails("model_type 't5'", "'gpt2', 'llama', 'gpt_neox' or 'qwen3'")
    gpt2_reference(folder)
    hf_cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf_cfg, "activation_function": "swish"}))
    fails("activation_function 'swish'")
    (folder / "config.json").write_text(json.dumps({**hf_cfg, "n_layer": 4}))
    fails("lack h.3.")  # config and weights disagree
    (folder / "config.json").write_text(json.dumps({**hf_cfg, "n_layer": 2}))
    fails("no place for", "h.2.")
    (folder / "config.json").write_text(json.dumps({**hf_cfg, "n_embd": 33}))
    fails("model.n_embd (33)", "model.n_head (4)")
    (folder / "config.json").write_text(
        json.dumps({**hf_cfg, "n_positions": "many", "n_ctx": None})
    )
    fails("config.json n_positions 'many' is not supported")
    (folder / "config.json").write_text(json.dumps({**hf_cfg, "n_positions": 0}))
    fails("model.block_size")  # 0 is refused by the schema, not replaced by a default
    (folder / "config.json").write_text(json.dumps(hf_cfg))
    from safetensors.torch import load_file, save_file

    good = load_file(str(folder / "model.safetensors"))
    save_file(
        {**good, "transformer.wte.weight": good["transformer.wte.weight"].to(torch.int32)},
        str(folder / "model.safetensors"),
    )
    fails("int32 tensors", "not this model's")
    (folder / "model.safetensors").write_bytes(b"\x00" * 10)
    fails("model.safetensors", "corrupt")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    fails("no model.safetensors", "pytorch_model.bin")


def test_llama_options_we_do_not_implement_are_refused():
    base = LlamaConfig(
        num_hidden_layers=1, num_attention_heads=4, hidden_size=32, intermediate_size=40
    ).to_dict()
    with pytest.raises(MinigptError, match="rope_type 'linear'"):
        llama_config_from_hf(
            {**base, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}
        )
    for bad in ("x", None, [1], -1.0, float("inf")):
        with pytest.raises(MinigptError, match="rope_theta .* is not supported"):
            llama_config_from_hf(
                {**base, "rope_parameters": {"rope_type": "default", "rope_theta": bad}}
            )
    with pytest.raises(MinigptError, match="rope_parameters 'abc' is not supported"):
        llama_config_from_hf({**base, "rope_parameters": "abc"})
    with pytest.raises(MinigptError, match="head_dim"):
        llama_config_from_hf({**base, "head_dim": 16})
    with pytest.raises(MinigptError, match="attention_bias"):
        llama_config_from_hf({**base, "attention_bias": True})
    # transformers 4.x spelling: rope_theta at the top level, rope_scaling null.
    old = {k: v for k, v in base.items() if k != "rope_parameters"}
    assert llama_config_from_hf({**old, "rope_theta": 5e5, "rope_scaling": None}).rope_base == 5e5
