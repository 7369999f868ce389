"""The model switches of issue 29 (QK-norm, ReLU², logit soft-capping, zero-init projections, value
embeddings).

Each against a reference we did not write where one exists (transformers' Qwen3RMSNorm and rotary
code, nanochat's value-embedding recipe written out by hand), the KV caches against the full
forward, and one short real run with every switch on through training, an interrupted resume,
evaluate and inspect.
"""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, assert_user_error, curve, tiny

from minigpt_cli.config.schema import ModelConfig
from minigpt_cli.errors import Interrupted
from minigpt_cli.model.gpt import GPT, MLP, CausalSelfAttention, rope_cos_sin
from minigpt_cli.sample.decoding import KVCache
from minigpt_cli.sample.sampling import generate_tokens

#: Every switch of issue 29 at once, with grouped-query attention and rotary positions.
ALL = dict(qk_norm=True, ffn="relu2", logit_softcap=3.0, zero_init_proj=True, value_embeddings=True)


def small(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=12, vocab_size=65, dropout=0.0)
    return ModelConfig(**{**base, **kw})


def randomized(cfg: ModelConfig, seed: int = 0) -> GPT:
    """GPT(cfg) in eval mode with every parameter redrawn (gains included, zero-init projections
    too), so that no switch is hidden by an init that makes it the identity, and a sharpened head
    (no near-ties when greedy)."""
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if p.dim() == 1 else 0.1 * torch.randn_like(p))
        model.lm_head.weight.mul_(20)
    return model


# ----------------------------------------------------------------------------- each switch as
# defined


def test_qk_norm_is_qwen3s_rmsnorm_on_each_head_before_rope():
    """q and k equal transformers' Qwen3RMSNorm (per head_dim, the gains learned) on the projected
    heads, then Qwen3's apply_rotary_pos_emb: the order of Qwen3Attention, so a Qwen3 export is a
    renaming."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    cfg = small(qk_norm=True, pos_encoding="rope", n_kv_head=2, norm_eps=1e-6)
    attn = randomized(cfg).h[0].attn
    B, T, C, hd, kv = 2, 7, cfg.n_embd, cfg.head_dim, cfg.kv_heads * cfg.head_dim
    x = torch.randn(B, T, C)
    cos, sin = rope_cos_sin(torch.arange(T), hd)
    with torch.no_grad():
        q, k, v = attn.qkv(x, (cos, sin))
        norms = {}
        for name in ("q_norm", "k_norm"):
            norms[name] = qwen3.Qwen3RMSNorm(hd, eps=1e-6)
            norms[name].weight.copy_(getattr(attn, name).weight)
        hq, hk, hv = attn.c_attn(x).split([C, kv, kv], dim=-1)
        rq = norms["q_norm"](hq.view(B, T, cfg.n_head, hd)).transpose(1, 2)
        rk = norms["k_norm"](hk.view(B, T, cfg.kv_heads, hd)).transpose(1, 2)
        rq, rk = qwen3.apply_rotary_pos_emb(rq, rk, cos[None], sin[None])
    assert not torch.allclose(
        attn.q_norm.weight, torch.ones(hd)
    )  # the gains matter in this comparison
    assert (q - rq).abs().max() < 1e-6 and (k - rk).abs().max() < 1e-6
    assert torch.equal(v, hv.view(B, T, cfg.kv_heads, hd).transpose(1, 2))  # values are not normed
    # Each (unrotated, ungained) query head has unit mean square: the norm acts per head, not over
    # n_embd.
    plain = CausalSelfAttention(small(qk_norm=True, n_kv_head=2))  # no RoPE, to see the norm alone
    plain.load_state_dict(attn.state_dict())
    with torch.no_grad():
        plain.q_norm.weight.fill_(1.0)
        q0, _, _ = plain.qkv(x)
    assert torch.allclose(q0.pow(2).mean(-1), torch.ones(B, cfg.n_head, T), atol=1e-4)


def test_relu2_is_the_square_of_relu_through_the_mlp():
    """c_proj(relu(c_fc(x))²), written with F.linear (So et al. 2021, Primer)."""
    torch.manual_seed(0)
    mlp = MLP(small(ffn="relu2", bias=True))
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        h = F.linear(x, mlp.c_fc.weight, mlp.c_fc.bias)
        want = F.linear(
            torch.where(h > 0, h * h, torch.zeros_like(h)), mlp.c_proj.weight, mlp.c_proj.bias
        )
        got = mlp(x)
        relu = MLP(small(ffn="relu", bias=True))
        relu.load_state_dict(mlp.state_dict())
    assert mlp.c_fc.out_features == 4 * 32  # a plain two-layer MLP of 4d, not a gated one
    assert (got - want).abs().max() < 1e-6
    assert (got - relu(x)).abs().max() > 1e-3


def test_logit_softcap_is_c_tanh_of_the_plain_logits():
    """With the same weights: logits = C·tanh(plain / C) (Gemma 2 §2), inside ±C, and the loss is
    theirs."""
    plain = randomized(small())
    capped = GPT(small(logit_softcap=3.0)).eval()
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 65, (2, 12))
    with torch.no_grad():
        z, _ = plain(idx)
        y, loss = capped(idx, idx)
    assert z.abs().max() > 3.0  # some plain logits lie past the cap
    assert y.dtype == torch.float32 and y.abs().max() <= 3.0
    assert (y - 3.0 * torch.tanh(z / 3.0)).abs().max() < 1e-5
    assert math.isclose(
        float(loss), float(F.cross_entropy(y.view(-1, 65), idx.view(-1))), rel_tol=1e-6
    )


def test_zero_init_proj_makes_every_block_the_identity_at_init():
    """Both output projections start at zero (the rest as before), so each Pre-LN block returns its
    input, and the first backward still reaches them."""
    torch.manual_seed(0)
    cfg = small(zero_init_proj=True, pos_encoding="rope", bias=True)
    model = GPT(cfg)
    x = torch.randn(2, 12, 32)
    rope = rope_cos_sin(torch.arange(12), cfg.head_dim)
    for blk in model.h:
        assert not blk.attn.c_proj.weight.any() and not blk.mlp.c_proj.weight.any()
        assert blk.attn.c_attn.weight.std() > 0.01 and blk.mlp.c_fc.weight.std() > 0.01
        assert torch.equal(blk(x, rope), x)
    _, loss = model(torch.randint(0, 65, (2, 12)), torch.randint(0, 65, (2, 12)))
    loss.backward()
    assert all(blk.attn.c_proj.weight.grad.abs().max() > 0 for blk in model.h)
    assert all(blk.mlp.c_proj.weight.grad.abs().max() > 0 for blk in model.h)


@pytest.mark.parametrize("n_layer", [1, 2, 3, 4])
def test_value_embeddings_sit_in_nanochats_layers(n_layer):
    """Every other layer, ending at the last: nanochat's ``has_ve(i, L) = i % 2 == (L - 1) % 2``."""
    cfg = small(n_layer=n_layer, value_embeddings=True, n_kv_head=2)
    want = [i for i in range(n_layer) if i % 2 == (n_layer - 1) % 2]
    model = GPT(cfg)
    assert sorted(int(k) for k in model.value_embeds) == want
    assert [i for i, blk in enumerate(model.h) if blk.attn.ve_gate is not None] == want
    for i in (
        want
    ):  # the table is n_kv_head·head_dim wide (GQA); the gate 12 channels -> one per kv head
        assert model.value_embeds[str(i)].weight.shape == (65, 2 * cfg.head_dim)
        gate = model.h[i].attn.ve_gate.weight
        assert (
            gate.shape == (2, 12) and 0 <= gate.min() and gate.max() <= 0.02
        )  # nanochat's U(0, 0.02)
    assert not GPT(small(n_layer=n_layer)).value_embeds  # off: no tables


def test_value_embeddings_add_a_gated_table_to_v():
    """v = v + 3·sigmoid(W_gate · x[..., :12]) · ve per key/value head, ve the layer's table at the
    tokens (nanochat ``gpt.py``), written out here; and the forward depends on the table."""
    cfg = small(n_layer=3, value_embeddings=True, n_kv_head=2, pos_encoding="rope")
    model = randomized(cfg)
    idx = torch.randint(0, 65, (2, 9))
    seen = {}
    hook = model.h[2].attn.register_forward_hook(
        lambda m, args, out: seen.update(x=args[0], ve=args[5])
    )
    with torch.no_grad():
        logits, _ = model(idx)
    hook.remove()
    attn, x = model.h[2].attn, seen["x"]
    B, T, nkv, hd = 2, 9, 2, cfg.head_dim
    table = model.value_embeds["2"].weight[idx].view(B, T, nkv, hd)
    gate = 3 * torch.sigmoid(x[..., :12] @ attn.ve_gate.weight.T)  # (B, T, nkv)
    v = attn.c_attn(x)[..., cfg.n_embd + nkv * hd :].view(B, T, nkv, hd)
    with torch.no_grad():
        _, _, got = attn.qkv(x, model._rope(0, T, x.device), seen["ve"])
    assert (got - (v + gate[..., None] * table).transpose(1, 2)).abs().max() < 1e-6
    with torch.no_grad():
        model.value_embeds["2"].weight.zero_()
        assert (model(idx)[0] - logits).abs().max() > 1e-3


# ----------------------------------------------------------------------------- KV caches


@pytest.mark.parametrize(
    "switch",
    [
        dict(qk_norm=True),
        dict(qk_norm=True, norm_position="post", pos_encoding="learned"),
        dict(ffn="relu2"),
        dict(logit_softcap=3.0),
        dict(value_embeddings=True, n_layer=3, n_kv_head=2),
        ALL,
    ],
    ids=["qk_norm", "qk_norm-post", "relu2", "softcap", "value_embeddings", "all"],
)
def test_cached_decoding_equals_uncached(switch):
    """Greedy and seeded, 5 + 30 tokens through a block of 12 (the window slides): the growing cache
    gives the tokens of no cache, and for every switch at once the static cache (generate
    --compile's) does too."""
    from minigpt_cli.sample.decoding import StaticDecoder

    model = randomized(small(**{"pos_encoding": "rope", "n_kv_head": 1, **switch}))
    prompt = torch.randint(0, 65, (2, 5))
    for temperature, stride in ((0.0, 1), (1.0, None)):
        paths = {"uncached": {"use_cache": False}, "cached": {}}
        if switch is ALL:
            paths["static"] = {"decoder": StaticDecoder(model, 2)}
        runs = {
            name: torch.stack(
                list(
                    generate_tokens(
                        model,
                        prompt,
                        30,
                        temperature=temperature,
                        top_k=None,
                        generator=torch.Generator().manual_seed(7),
                        window_stride=stride,
                        **kw,
                    )
                ),
                dim=1,
            )
            for name, kw in paths.items()
        }
        assert runs["cached"].shape == (2, 30)
        for name in paths:
            assert torch.equal(runs[name], runs["uncached"]), (name, temperature)


def test_cached_logits_equal_the_full_forward_with_every_switch():
    model = randomized(small(**ALL, n_layer=3, n_kv_head=2, pos_encoding="rope"))
    x = torch.randint(0, 65, (2, 12))
    with torch.no_grad():
        full, _ = model(x)
        cache = KVCache(model, 2)
        steps = [model(x[:, :6], cache=cache)[0]] + [
            model(x[:, i : i + 1], cache=cache)[0] for i in range(6, 12)
        ]
    # float32's tolerance (torch.testing's: 1e-5 + 1.3e-6 of each logit): the cache changes the
    # products' shapes, so their summation order, which differs by CPU (AVX2's, AVX-512's)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


# ----------------------------------------------------------------------------- a real run, bad
# input


def test_a_run_with_every_switch_trains_resumes_evaluates_and_inspects(
    data_dir, tmp_path, monkeypatch
):
    """tiny.yaml with every switch (RoPE, one kv head): 20 steps lower the loss; SIGINT after step
    13 and a resume give the uninterrupted run's losses and weights; evaluate and inspect open the
    run."""
    from safetensors.torch import load_file

    import minigpt_cli.trainer.loop as loop
    from minigpt_cli.eval.evaluate import evaluate
    from minigpt_cli.inspection.attention import attention
    from minigpt_cli.inspection.residual import residual_run
    from minigpt_cli.trainer import train

    monkeypatch.chdir(tmp_path)
    sets = [f"model.{k}={str(v).lower()}" for k, v in ALL.items()] + [
        "model.pos_encoding=rope",
        "model.n_kv_head=1",
        "train.max_iters=20",
        "train.eval_interval=10",
    ]
    cfg = tiny(data_dir, *sets)
    done = train(cfg, run_name="whole", echo=lambda m: None, progress=False)
    evals = [v for (event, _), v in sorted(curve(done.run_dir).items()) if event == "eval"]
    assert evals[-1] < evals[0] - 0.3, evals

    real_step, calls = loop.train_step, {"n": 0}

    def step_then_sigint(*a, **k):
        out = real_step(*a, **k)
        calls["n"] += 1
        if calls["n"] == 13:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(loop, "train_step", step_then_sigint)
    with pytest.raises(Interrupted):
        train(cfg, run_name="cut", echo=lambda m: None, progress=False)
    monkeypatch.setattr(loop, "train_step", real_step)
    resumed = train(cfg, echo=lambda m: None, progress=False, resume=str(tmp_path / "runs" / "cut"))
    assert resumed.step == 20 and curve(resumed.run_dir) == curve(done.run_dir)
    a, b = (
        load_file(r.run_dir / "checkpoints" / "last" / "model.safetensors") for r in (done, resumed)
    )
    assert a.keys() == b.keys() and {"value_embeds.1.weight", "h.0.attn.q_norm.weight"} <= a.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    scored = evaluate(resumed.run_dir, device="cpu", progress=False)
    assert math.isclose(scored["loss"], scored["logged_loss"], rel_tol=1e-4), scored
    maps = attention(resumed.run_dir, "ROMEO: thou")
    assert (
        maps["max_check_error"] < 1e-5
    )  # the recomputed weights·v include QK-norm and the value embedding
    stream = residual_run(resumed.run_dir, windows=2)
    assert len(stream["trained"]) == len(stream["init"]) == 3
    assert stream["init"][1] == pytest.approx(
        stream["init"][0]
    )  # zero-init projections: block 0 is the identity


@pytest.mark.parametrize("value", ["0", "-1.5"])
def test_a_logit_softcap_that_is_not_positive_is_refused(cli, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    assert_user_error(
        cli("train", str(TINY), "--set", f"model.logit_softcap={value}"),
        "model.logit_softcap",
        "greater than 0",
    )
    assert not (tmp_path / "runs").exists()


def test_qk_norm_with_post_ln_is_defined():
    """QK-norm acts inside attention, on q and k alone, wherever the block's own norms sit: Post-LN
    with it validates and trains a step (its cache equality is
    test_cached_decoding_equals_uncached's)."""
    model = GPT(small(qk_norm=True, norm_position="post"))
    _, loss = model(torch.randint(0, 65, (2, 12)), torch.randint(0, 65, (2, 12)))
    loss.backward()
    assert model.h[0].attn.q_norm.weight.grad.abs().max() > 0


def test_count_params_shows_the_switches_and_their_parameters(cli):
    """The table names the switches on and gives the value embeddings a row of their own, outside
    N."""
    res = cli(
        "count-params",
        "--config",
        str(TINY),
        "--set",
        "model.value_embeddings=true",
        "--set",
        "model.qk_norm=true",
        "--set",
        "model.logit_softcap=15",
        "--json",
    )
    rep = json.loads(res.stdout)
    assert res.exit_code == 0 and rep["value_embedding"] == 65 * 32 and rep["value_gate"] == 12 * 2
    assert (
        rep["embedding"]
        == rep["token_embedding"] + rep["position_embedding"] + rep["value_embedding"]
    )
    text = cli(
        "count-params",
        "--config",
        str(TINY),
        "--set",
        "model.value_embeddings=true",
        "--set",
        "model.qk_norm=true",
        "--set",
        "model.logit_softcap=15",
    ).stdout
    assert "qk_norm, value_embeddings, logit_softcap 15" in text
    assert (
        "value embeddings (V·n_kv_head·head_dim per table)" in text
        and "2 norms + q/k norms" in text
    )


def test_q_and_k_normed_in_one_pass_equal_their_two_norms():
    """qk_rms_norm: the values of q_norm and k_norm called apart, bit for bit, on a strided slice
    of the projection as the attention gives it, and the same gradients (the gains' to float32
    rounding: the fused product sums them over the heads in another order)."""
    from minigpt_cli.model.gpt import RMSNorm, qk_rms_norm

    torch.manual_seed(0)
    B, T, nh, nkv, hd = 2, 5, 4, 2, 8
    q_norm, k_norm = RMSNorm(hd), RMSNorm(hd)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5), k_norm.weight.uniform_(0.5, 1.5)
    qkv = torch.randn(B, T, (nh + 2 * nkv) * hd, requires_grad=True)
    g = torch.randn(B, T, nh + nkv, hd)

    def run(fused: bool):
        qk = qkv[..., : (nh + nkv) * hd].view(B, T, nh + nkv, hd)
        if fused:
            out = qk_rms_norm(qk, q_norm, k_norm, nh)
        else:
            out = torch.cat((q_norm(qk[:, :, :nh]), k_norm(qk[:, :, nh:])), dim=2)
        grads = torch.autograd.grad((out * g).sum(), (qkv, q_norm.weight, k_norm.weight))
        return out, grads

    (fused, fused_grads), (apart, apart_grads) = run(True), run(False)
    assert torch.equal(fused, apart)
    assert torch.equal(fused_grads[0], apart_grads[0])
    for a, b in zip(fused_grads[1:], apart_grads[1:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_q_and_k_normed_and_rotated_in_one_pass_equal_the_two_steps():
    """norm_rotate_heads (the attention's path when QK-norm and RoPE are both on): the values of
    qk_rms_norm then rotate_heads, and the exact gradients of qk and of both gains
    (torch.autograd.gradcheck in float64), for one table of positions and for positions per row;
    in bfloat16 it returns float32 when asked, within bfloat16's rounding of the two steps."""
    from minigpt_cli.model.gpt import (
        RMSNorm,
        norm_rotate_heads,
        qk_rms_norm,
        rope_cos_sin,
        rotate_heads,
    )

    torch.manual_seed(0)
    B, T, nh, nkv, hd = 2, 5, 4, 2, 8
    q_norm, k_norm = RMSNorm(hd).double(), RMSNorm(hd).double()
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5), k_norm.weight.uniform_(0.5, 1.5)
    qkv = torch.randn(B, T, (nh + 2 * nkv) * hd, dtype=torch.float64, requires_grad=True)
    for positions in (torch.arange(T), torch.tensor([[4, 5, 6, 7, 8], [0, 2, 4, 6, 8]])):
        cos, sin = (t.double()[positions] for t in rope_cos_sin(torch.arange(10), hd))

        def fused(qkv, gq, gk):
            q_norm.weight, k_norm.weight = gq, gk
            qk = qkv[..., : (nh + nkv) * hd].view(B, T, nh + nkv, hd)
            return norm_rotate_heads(qk, q_norm, k_norm, nh, cos, sin)

        def two_steps(qkv, gq, gk):  # RMSNorm's formula in float64 (qk_rms_norm's is float32)
            qk = qkv[..., : (nh + nkv) * hd].view(B, T, nh + nkv, hd)
            gain = torch.cat((gq.expand(nh, -1), gk.expand(nkv, -1)))
            normed = gain * qk * torch.rsqrt(qk.square().mean(-1, keepdim=True) + q_norm.eps)
            return rotate_heads(normed, cos, sin)

        gains = [torch.nn.Parameter(torch.rand(hd, dtype=torch.float64) + 0.5) for _ in range(2)]
        torch.testing.assert_close(fused(qkv, *gains), two_steps(qkv, *gains), rtol=0, atol=1e-12)
        assert torch.autograd.gradcheck(fused, (qkv, *gains))

    # bfloat16 heads under autocast: float32 out, rounded once; the gradient reaches qk in bfloat16.
    q_norm, k_norm = RMSNorm(hd), RMSNorm(hd)
    qk = torch.randn(B, T, nh + nkv, hd).bfloat16().requires_grad_()
    cos, sin = rope_cos_sin(torch.arange(T), hd)
    out = norm_rotate_heads(qk, q_norm, k_norm, nh, cos, sin, torch.float32)
    expected = rotate_heads(qk_rms_norm(qk.float(), q_norm, k_norm, nh), cos, sin)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert qk.grad.dtype == torch.bfloat16 and qk.grad.abs().sum() > 0
