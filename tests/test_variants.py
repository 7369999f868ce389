"""Every architecture switch of ModelConfig against a reference we did not write.

References: the formulas of the papers (sinusoidal
table, RoPE, GELU), ``torch.nn`` modules (RMSNorm, TransformerEncoderLayer
with Pre- and Post-LN), and a short real training run per switch. The
Hugging Face comparisons (GPT-2, Llama) live in test_hf.py.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_user_error

from minigpt_cli.config.schema import ModelConfig, load_config
from minigpt_cli.inspection.block import copy_into_reference
from minigpt_cli.model.gpt import (
    GPT,
    MLP,
    Block,
    RMSNorm,
    apply_rope,
    rope_cos_sin,
    rotate_heads,
    sinusoidal_table,
)
from minigpt_cli.sample.generate import generate_tokens

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


def small(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


# ----------------------------------------------------------------------------- sinusoidal positions


def test_sinusoidal_table_is_the_definition():
    """p[t,2i] = sin(t·ω_i), p[t,2i+1] = cos(t·ω_i), ω_i = 10000^(-2i/d) (Vaswani et al. 2017
    §3.5)."""
    d, n = 64, 300
    t = np.arange(n)[:, None]
    omega = 10000.0 ** (-2 * np.arange(d // 2) / d)
    p = sinusoidal_table(n, d).numpy()
    assert p.dtype == np.float32 and p.shape == (n, d)
    np.testing.assert_allclose(p[:, 0::2], np.sin(t * omega), atol=1e-6)
    np.testing.assert_allclose(p[:, 1::2], np.cos(t * omega), atol=1e-6)
    # The model keeps it as a buffer that is not saved (nothing to learn, nothing to store).
    model = GPT(small(pos_encoding="sinusoidal"))
    assert "pos_table" not in model.state_dict() and torch.equal(
        model.pos_table, sinusoidal_table(16, 32)
    )


@pytest.mark.parametrize("k", [1, 7, 100])
def test_sinusoidal_shift_is_one_rotation_for_every_t(k):
    """p[t+k] = R_k p[t] for every t, R_k block-diagonal: a rotation by k·ω_i of each (sin, cos)
    pair.

    R_k is built from k and ω_i = 10000^(-2i/d) alone (the angle-sum identities),
    never from t, and then holds for all t in 0..1000.
    """
    d = 64
    omega = 10000.0 ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    R = torch.block_diag(*[torch.tensor([[c[i], s[i]], [-s[i], c[i]]]) for i in range(d // 2)])
    p = sinusoidal_table(1001 + k, d).double()
    t = torch.arange(1001)
    assert (p[t] @ R.T - p[t + k]).abs().max() < 1e-5
    assert torch.allclose(R @ R.T, torch.eye(d, dtype=R.dtype))  # orthogonal: a rotation


def test_sinusoidal_dot_products_match_the_notes():
    """d=128: p_0·p_k first rises at k=12, rises on 492 steps in 0..1024, minimum −8.36 up to
    k=4096."""
    p = sinusoidal_table(4097, 128).double()
    dots = (p @ p[0]).numpy()
    rises = np.diff(dots[:1025]) > 0
    assert int(np.argmax(rises)) + 1 == 12
    assert int(rises.sum()) == 492
    assert round(float(dots.min()), 2) == -8.36


def test_sinusoidal_slowest_wavelength():
    """d=64: the slowest pair has ω = 10000^(-62/64), wavelength 2π/ω ≈ 47117 positions."""
    p = sinusoidal_table(1001, 64).double()
    omega = math.asin(p[1000, 62].item()) / 1000
    assert 2 * math.pi / omega == pytest.approx(47117, abs=2)


# ----------------------------------------------------------------------------- RoPE


def rotate(x: torch.Tensor, pos: int, hs: int) -> torch.Tensor:
    cos, sin = rope_cos_sin(torch.tensor([pos]), hs)
    return apply_rope(x.view(1, 1, 1, hs), cos, sin).view(hs)


def test_rope_score_depends_only_on_the_offset():
    """(R_p q)·(R_m k) = (R_{p+s} q)·(R_{m+s} k) (Su et al. 2021 §3.4.2)."""
    torch.manual_seed(0)
    hs = 32
    q, k = torch.randn(hs), torch.randn(hs)
    for p, m in [(0, 0), (3, 10), (17, 5), (40, 200)]:
        base = rotate(q, p, hs) @ rotate(k, m, hs)
        for s in (1, 13, 500, 3000):
            shifted = rotate(q, p + s, hs) @ rotate(k, m + s, hs)
            # float32 angles at positions in the thousands: ~1e-4 of |q||k| ≈ 30
            assert shifted.item() == pytest.approx(base.item(), abs=2e-3), (p, m, s)
    scores = {round((rotate(q, 0, hs) @ rotate(k, m, hs)).item(), 4) for m in range(8)}
    assert len(scores) == 8  # it does depend on the offset
    # A rotation: norms are kept.
    assert rotate(q, 123, hs).norm().item() == pytest.approx(q.norm().item(), rel=1e-5)


def test_the_models_rotation_is_apply_rope_with_its_gradient():
    """rotate_heads (the model's path: heads as the projection lays them out, one fused pass each
    way) gives apply_rope's values (the reference form, checked against transformers in
    test_hf.py) and the exact gradient (torch.autograd.gradcheck in float64), for one table of
    positions and for positions per row."""
    torch.manual_seed(0)
    B, T, H, hs = 2, 5, 3, 8
    x = torch.randn(B, T, H, hs, dtype=torch.float64, requires_grad=True)
    for positions in (torch.arange(T), torch.tensor([[4, 5, 6, 7, 8], [0, 2, 4, 6, 8]])):
        cos, sin = (t.double() for t in rope_cos_sin(torch.arange(10), hs))
        cos, sin = cos[positions], sin[positions]  # (T, hs) or (B, T, hs)
        heads_first = (cos, sin) if positions.dim() == 1 else (cos[:, None], sin[:, None])
        expected = apply_rope(x.transpose(1, 2), *heads_first).transpose(1, 2)
        assert torch.allclose(rotate_heads(x, cos, sin), expected, atol=1e-12)
        assert torch.autograd.gradcheck(lambda x: rotate_heads(x, cos, sin), (x,))


def test_the_rotation_of_bfloat16_heads_is_float32_when_asked():
    """Under a CPU's autocast the projection is bfloat16 and the attention float32: the rotation
    returns float32 rounded once (not bfloat16 cast back), and the gradient reaches the projection
    in bfloat16."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4, 16).bfloat16().requires_grad_()
    cos, sin = rope_cos_sin(torch.arange(6), 16)
    out = rotate_heads(x, cos, sin, torch.float32)
    assert out.dtype == torch.float32
    expected = apply_rope(x.float().transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-6)
    out.sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.abs().sum() > 0


def test_rope_has_no_parameters():
    assert (
        GPT(small(pos_encoding="rope")).num_params() == GPT(small(pos_encoding="none")).num_params()
    )


# ----------------------------------------------------------------------------- activations and
# norms


def test_gelu_exact_vs_tanh_and_our_mlp_uses_them():
    """Hendrycks & Gimpel 2016: GELU(x) = x·Φ(x); the tanh form differs by at most 4.73e-4."""
    x = torch.linspace(-8, 8, 160001, dtype=torch.float64)
    exact = x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    tanh = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert round((exact - tanh).abs().max().item(), 6) == pytest.approx(4.73e-4, abs=1e-6)
    assert round(F.gelu(torch.tensor(-1.0)).item(), 4) == -0.1587
    torch.manual_seed(0)
    h = torch.randn(4, 32)
    for kind, act in [
        ("gelu", lambda z: z * 0.5 * (1 + torch.erf(z / math.sqrt(2)))),
        (
            "gelu_tanh",
            lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
        ),
        ("relu", lambda z: z.clamp(min=0)),
    ]:
        mlp = MLP(small(ffn=kind, bias=True)).eval()
        with torch.no_grad():
            expected = mlp.c_proj(act(mlp.c_fc(h)))
            assert torch.allclose(mlp(h), expected, atol=1e-6), kind


def test_swiglu_is_shazeer_and_sized_like_llama():
    """SwiGLU(x) = (Swish(x W) ⊙ x V) W_2 (Shazeer 2020 eq. 6); hidden 8d/3 rounded up to
    multiple_of."""
    torch.manual_seed(0)
    cfg = small(ffn="swiglu", n_embd=48, multiple_of=16, bias=False)
    assert cfg.ffn_hidden == 128  # 8·48/3 = 128
    assert small(ffn="swiglu", n_embd=32, multiple_of=16).ffn_hidden == 96  # 85.3 -> 96
    mlp = MLP(cfg).eval()
    W, V = mlp.c_fc.weight[:128], mlp.c_fc.weight[128:]
    h = torch.randn(3, 48)
    with torch.no_grad():
        a = h @ W.T
        expected = mlp.c_proj(a * torch.sigmoid(a) * (h @ V.T))
        assert torch.allclose(mlp(h), expected, atol=1e-6)


def test_rmsnorm_equals_torch_rmsnorm():
    torch.manual_seed(0)
    ours = RMSNorm(48, eps=1e-5)
    ref = nn.RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_(1, 0.3)
        ref.weight.copy_(ours.weight)
    x = torch.randn(4, 7, 48) * 3
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    model = GPT(small(norm="rmsnorm"))
    assert all(isinstance(m, RMSNorm) for m in (model.h[0].ln_1, model.h[1].ln_2, model.ln_f))


# ----------------------------------------------------------------------------- Pre-LN / Post-LN
# against torch.nn


def torch_layer_from(block: Block, cfg: ModelConfig) -> nn.TransformerEncoderLayer:
    """An nn.TransformerEncoderLayer holding our block's weights (same norm placement and
    activation)."""
    ref = nn.TransformerEncoderLayer(
        cfg.n_embd,
        cfg.n_head,
        dim_feedforward=cfg.ffn_hidden,
        dropout=0.0,
        activation=cfg.ffn,
        batch_first=True,
        norm_first=cfg.norm_position == "pre",
        layer_norm_eps=cfg.norm_eps,
    ).eval()
    copy_into_reference(block, ref)  # the weight copy inspect block uses too
    return ref


def randomized(cfg: ModelConfig) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("ln_f"):
                p.copy_(
                    1 + 0.3 * torch.randn_like(p)
                    if name.endswith("weight")
                    else 0.2 * torch.randn_like(p)
                )
            else:
                p.normal_(0, 0.2)
    return model


def test_post_ln_block_equals_torch_transformer_encoder_layer():
    """x = LN(x + attn(x)); x = LN(x + ffn(x)) — nn.TransformerEncoderLayer(norm_first=False),
    causal."""
    cfg = small(norm_position="post", bias=True, ffn="relu")
    block = randomized(cfg).h[0]
    ref = torch_layer_from(block, cfg)
    x = torch.randn(3, 10, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(10)
    with torch.no_grad():
        diff = (block(x) - ref(x, src_mask=mask, is_causal=True)).abs().max().item()
    assert diff < 1e-5, diff


@pytest.mark.parametrize(
    "kw",
    [
        dict(norm_position="pre", pos_encoding="learned", ffn="gelu"),
        dict(norm_position="post", pos_encoding="learned", ffn="gelu"),
        dict(norm_position="pre", pos_encoding="sinusoidal", emb_scale=True, ffn="relu"),
        dict(norm_position="post", pos_encoding="none", tie_weights=False, ffn="relu"),
    ],
    ids=["pre-learned", "post-learned", "pre-sinusoidal-emb_scale", "post-none-untied"],
)
def test_whole_model_equals_a_torch_nn_stack(kw):
    """Embeddings (+ positions, × sqrt(d)) -> nn.TransformerEncoderLayers -> final LN only for
    Pre-LN -> head."""
    cfg = small(bias=True, n_layer=3, **kw)
    model = randomized(cfg)
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    x = F.embedding(idx, model.wte.weight)
    if cfg.emb_scale:
        x = x * math.sqrt(cfg.n_embd)
    if cfg.pos_encoding == "learned":
        x = x + model.wpe.weight[:16]
    elif cfg.pos_encoding == "sinusoidal":
        x = x + sinusoidal_table(16, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(16)
    with torch.no_grad():
        for block in model.h:
            x = torch_layer_from(block, cfg)(x, src_mask=mask, is_causal=True)
        if cfg.norm_position == "pre":
            final = nn.LayerNorm(32, eps=cfg.norm_eps)
            final.load_state_dict(model.ln_f.state_dict())
            x = final(x)
        else:
            assert model.ln_f is None  # Post-LN already ends in a norm; no final one
        head = model.wte.weight if cfg.tie_weights else model.lm_head.weight
        assert (head is model.wte.weight) == cfg.tie_weights
        expected = x @ head.T
        got, _ = model(idx)
    assert expected.abs().max() > 1
    diff = (got - expected).abs().max().item()
    assert diff < 1e-5, diff


def test_tied_head_stays_tied_through_training_steps():
    model = GPT(small(tie_weights=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        _, loss = model(torch.randint(0, 65, (2, 8)), torch.randint(0, 65, (2, 8)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert model.lm_head.weight is model.wte.weight
    assert sum(p.numel() for p in model.parameters()) == model.num_params()


def test_dropout_only_in_training_mode():
    torch.manual_seed(0)
    model = GPT(small(dropout=0.3))
    x = torch.randint(0, 65, (2, 16))
    model.train()
    a, b = model(x)[0], model(x)[0]
    assert not torch.allclose(a, b)
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])


# ----------------------------------------------------------------------------- KV cache for every
# switch

SWITCHES = [
    dict(norm_position="post"),
    dict(norm="rmsnorm"),
    dict(ffn="swiglu", multiple_of=16),
    dict(ffn="relu"),
    dict(ffn="gelu_tanh"),
    dict(n_kv_head=1),
    dict(n_kv_head=2),
    dict(emb_scale=True),
    dict(tie_weights=False, bias=True),
    dict(norm="rmsnorm", ffn="swiglu", multiple_of=16, bias=False, tie_weights=False, n_kv_head=2),
]


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
@pytest.mark.parametrize(
    "switch", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_kv_cache_agrees_for_every_switch(pos, switch, monkeypatch):
    """Greedy and seeded sampling, with and without the cache, 5 + 30 tokens through a block of 12.

    Beyond equal tokens, the logits each step samples from agree: equal
    tokens alone can hide a cache that drifts once the window slides.
    """
    import minigpt_cli.sample.sampling as gen

    seen: list[torch.Tensor] = []
    real = gen.sample_next

    def spy(logits, *args):
        seen.append(logits.clone())
        return real(logits, *args)

    monkeypatch.setattr(gen, "sample_next", spy)
    torch.manual_seed(0)
    model = GPT(small(pos_encoding=pos, block_size=12, **switch)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # sharpen so that greedy choices are not near-ties
    prompt = torch.randint(0, 65, (2, 5))
    # Each mode with another window stride (1: nanoGPT's slide; None: block_size // 4 = 3).
    for temperature, top_p, stride in ((0.0, None, 1), (1.0, None, None), (1.0, 0.9, 5)):
        runs, logits = [], []
        for use_cache in (True, False):
            seen.clear()
            g = torch.Generator().manual_seed(7)
            toks = generate_tokens(
                model,
                prompt,
                30,
                temperature=temperature,
                top_p=top_p,
                use_cache=use_cache,
                generator=g,
                window_stride=stride,
            )
            runs.append(torch.stack(list(toks), dim=1))
            logits.append(torch.stack(seen))
        assert runs[0].shape == (2, 30)
        assert torch.equal(runs[0], runs[1]), (temperature, top_p)
        diff = (logits[0] - logits[1]).abs().max().item()
        assert diff < 1e-5, (temperature, top_p, diff)


# ----------------------------------------------------------------------------- every variant trains

VARIANTS = (
    [("pos_encoding", v) for v in ("learned", "sinusoidal", "rope", "none")]
    + [("norm", v) for v in ("layernorm", "rmsnorm")]
    + [("norm_position", v) for v in ("pre", "post")]
    + [("ffn", v) for v in ("relu", "gelu", "gelu_tanh", "swiglu")]
    + [("tie_weights", v) for v in (True, False)]
    + [("bias", v) for v in (True, False)]
    + [("dropout", v) for v in (0.0, 0.1)]
    + [("scale_residual_init", v) for v in (True, False)]
    + [("emb_scale", v) for v in (True, False)]
    + [("n_kv_head", v) for v in (None, 1)]
)


@pytest.mark.parametrize("key,value", VARIANTS, ids=[f"{k}={v}" for k, v in VARIANTS])
def test_every_variant_trains(key, value, data_dir, tmp_path, monkeypatch):
    """30 steps of configs/tiny.yaml with the switch set lower the validation and training loss;
    the run's checkpoint loads and samples past block_size.

    That the KV cache gives the same tokens and logits as no cache, for every switch, is
    test_kv_cache_agrees_for_every_switch's (on random models); here the uncached text is compared
    only for dropout, where sampling must run the trained model in eval mode."""
    monkeypatch.chdir(tmp_path)
    from minigpt_cli.sample.generate import generate
    from minigpt_cli.trainer import train

    setting = "null" if value is None else json.dumps(value)
    cfg = load_config(
        TINY,
        [
            f"data.data_dir={data_dir}",
            f"model.{key}={setting}",
            "train.eval_iters=4",
            "train.eval_interval=30",
            "train.sample_tokens=0",
        ],
    )
    assert getattr(cfg.model, key) == value
    result = train(cfg, run_name="v", echo=lambda m: None, progress=False)
    evals = [json.loads(l) for l in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["event"] == "eval"]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 30
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.4, evals
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] - 0.4, evals
    texts = {}
    for use_cache in (True, False) if key == "dropout" else (True,):
        out = io.StringIO()
        generate(
            result.run_dir,
            {"prompt": "\n", "max_new_tokens": 70, "temperature": 1.0, "top_k": 20},
            seed=3,
            use_cache=use_cache,
            device="cpu",
            out=out,
        )
        texts[use_cache] = out.getvalue()
    assert len(texts[True]) == 72  # 1 + 70 tokens > block_size 32
    if key == "dropout":
        assert texts[True] == texts[False]


# ----------------------------------------------------------------------------- impossible
# combinations


@pytest.mark.parametrize(
    "sets,fragments",
    [
        (
            ["model.pos_encoding=rope", "model.n_embd=34"],
            ["model.pos_encoding=rope", "even head size", "34/2 = 17"],
        ),
        (
            ["model.pos_encoding=sinusoidal", "model.n_head=1", "model.n_embd=33"],
            ["model.pos_encoding=sinusoidal", "even model.n_embd"],
        ),
        (["model.n_kv_head=3"], ["model.n_kv_head (3)", "model.n_head (2)"]),
        (["model.n_head=4", "model.n_kv_head=3"], ["model.n_head (4)", "model.n_kv_head (3)"]),
        (["model.ffn=geglu"], ["model.ffn"]),
        (["model.norm_position=middle"], ["model.norm_position"]),
    ],
    ids=[
        "rope-odd-head",
        "sinusoidal-odd-width",
        "kv-above-heads",
        "kv-not-divisor",
        "unknown-ffn",
        "bad-norm-position",
    ],
)
def test_impossible_combinations_exit_2_before_anything_exists(
    cli, tmp_path, monkeypatch, sets, fragments
):
    monkeypatch.chdir(tmp_path)
    args = ["train", TINY]
    for s in sets:
        args += ["--set", s]
    assert_user_error(cli(*args), *fragments)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
