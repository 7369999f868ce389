"""The GPT: initial loss, init, tying, the Pre-LN block against torch.nn, the KV cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from minigpt_cli.config import ModelConfig
from minigpt_cli.errors import MinigptError
from minigpt_cli.sampling import filter_logits, generate_tokens
from minigpt_cli.model import GPT, Block


def small(**kw) -> ModelConfig:
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65, dropout=0.0)
    base.update(kw)
    return ModelConfig(**base)


def test_initial_loss_is_close_to_log_vocab():
    torch.manual_seed(0)
    cfg = small(vocab_size=65)
    model = GPT(cfg).eval()
    x = torch.randint(0, 65, (8, 16))
    y = torch.randint(0, 65, (8, 16))
    _, loss = model(x, y)
    # std-0.02 init gives near-uniform predictions: loss ≈ ln V = 4.174.
    assert abs(loss.item() - math.log(65)) < 0.05


def test_tied_head_is_the_embedding():
    model = GPT(small())
    assert model.lm_head.weight is model.wte.weight
    untied = GPT(small(tie_weights=False))
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() - model.num_params() == 65 * 32


def test_residual_projections_get_scaled_init():
    torch.manual_seed(0)
    cfg = small(n_layer=8, n_embd=256, n_head=4)
    model = GPT(cfg)
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in model.h])
    fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.h])
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.05)
    assert fc.std().item() == pytest.approx(0.02, rel=0.05)
    plain = GPT(small(n_layer=8, n_embd=256, n_head=4, scale_residual_init=False))
    assert plain.h[0].attn.c_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_pre_ln_gelu_block_equals_torch_transformer_encoder_layer():
    """Our Pre-LN GELU block computes nn.TransformerEncoderLayer(norm_first=True) with a causal mask."""
    torch.manual_seed(0)
    d, h, T = 32, 4, 10
    cfg = small(n_embd=d, n_head=h, bias=True, ffn="gelu")
    ours = Block(cfg).eval()
    ref = nn.TransformerEncoderLayer(d, h, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                     batch_first=True, norm_first=True, layer_norm_eps=1e-5).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.2)
        ours.attn.c_attn.weight.copy_(ref.self_attn.in_proj_weight)
        ours.attn.c_attn.bias.copy_(ref.self_attn.in_proj_bias)
        ours.attn.c_proj.weight.copy_(ref.self_attn.out_proj.weight)
        ours.attn.c_proj.bias.copy_(ref.self_attn.out_proj.bias)
        ours.mlp.c_fc.weight.copy_(ref.linear1.weight)
        ours.mlp.c_fc.bias.copy_(ref.linear1.bias)
        ours.mlp.c_proj.weight.copy_(ref.linear2.weight)
        ours.mlp.c_proj.bias.copy_(ref.linear2.bias)
        ours.ln_1.weight.copy_(ref.norm1.weight)
        ours.ln_1.bias.copy_(ref.norm1.bias)
        ours.ln_2.weight.copy_(ref.norm2.weight)
        ours.ln_2.bias.copy_(ref.norm2.bias)
    x = torch.randn(3, T, d)
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        expected = ref(x, src_mask=mask, is_causal=True)
        got = ours(x)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_attention_is_causal():
    torch.manual_seed(0)
    model = GPT(small()).eval()
    x = torch.randint(0, 65, (1, 12))
    x2 = x.clone()
    x2[0, 8:] = (x2[0, 8:] + 1) % 65
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(x2)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_longer_than_block_size_is_refused():
    model = GPT(small(block_size=8))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 9, dtype=torch.long))


POSITIONS = ["learned", "sinusoidal", "rope", "none"]


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("stride", [1, None, 5, 12])
def test_kv_cache_gives_the_same_tokens(pos, temperature, stride):
    """Cached and uncached generation agree token for token, also past block_size (the window slides)."""
    torch.manual_seed(0)
    cfg = small(pos_encoding=pos, block_size=12, n_kv_head=2)
    model = GPT(cfg).eval()
    with torch.no_grad():  # sharpen the random model so greedy choices are not near-ties
        model.lm_head.weight.mul_(20)
    prompt = torch.randint(0, 65, (2, 5))
    runs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(7)
        toks = list(generate_tokens(model, prompt, 30, temperature=temperature, top_k=None,
                                    use_cache=use_cache, generator=g, window_stride=stride))
        runs.append(torch.stack(toks, dim=1))
    assert runs[0].shape == (2, 30)  # 5 + 30 tokens: well past block_size 12
    assert torch.equal(runs[0], runs[1])


def _window_lengths(model, prompt_len, n, stride, use_cache):
    """Lengths of the inputs ``generate_tokens`` feeds the model, step by step."""
    lengths = []
    real = model.forward

    def spy(idx, *args, **kwargs):
        lengths.append(idx.size(1))
        return real(idx, *args, **kwargs)

    model.forward = spy
    try:
        list(generate_tokens(model, torch.zeros(1, prompt_len, dtype=torch.long), n, temperature=0.0,
                             use_cache=use_cache, window_stride=stride))
    finally:
        del model.forward
    return lengths


def test_window_slides_by_the_stride():
    """Block 8, stride 3: the window fills to 8, then drops 3 tokens at once (6 left), refills to 8, ..."""
    model = GPT(small(block_size=8)).eval()
    uncached = _window_lengths(model, 2, 14, 3, use_cache=False)
    assert uncached == [2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 6, 7, 8, 6]
    cached = _window_lengths(model, 2, 14, 3, use_cache=True)
    # The cache is filled with the whole window at the start and after each slide, else fed one token.
    assert cached == [2, 1, 1, 1, 1, 1, 1, 6, 1, 1, 6, 1, 1, 6]
    # A prompt longer than the block is cropped to its last 8 tokens; stride 1 is nanoGPT's crop.
    assert _window_lengths(model, 20, 4, 1, use_cache=False) == [8, 8, 8, 8]
    assert _window_lengths(model, 20, 4, 1, use_cache=True) == [8, 8, 8, 8]
    with pytest.raises(MinigptError, match="window_stride 9"):
        _window_lengths(model, 2, 3, 9, use_cache=True)


def test_stride_one_is_nanogpts_crop():
    """Greedy decoding with stride 1 equals a hand-written loop over ``seq[:, -block_size:]`` (nanoGPT)."""
    torch.manual_seed(0)
    model = GPT(small(block_size=10)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    seq = torch.randint(0, 65, (1, 4))
    ours = torch.stack(list(generate_tokens(model, seq, 25, temperature=0.0, window_stride=1)), dim=1)
    with torch.no_grad():
        for _ in range(25):
            logits, _ = model(seq[:, -10:])
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ours, seq[:, 4:])


def test_cached_logits_match_a_full_forward():
    torch.manual_seed(0)
    model = GPT(small(pos_encoding="rope")).eval()
    x = torch.randint(0, 65, (1, 10))
    with torch.no_grad():
        full, _ = model(x)
        cache = model.new_cache(1)
        first, _ = model(x[:, :6], cache=cache)
        rest = [model(x[:, i:i + 1], cache=cache)[0] for i in range(6, 10)]
    stepwise = torch.cat([first] + rest, dim=1)
    assert torch.allclose(full, stepwise, atol=1e-5)


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda f: torch.isfinite(f)[0].tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [True, True, False, False]
    # Nucleus: smallest set whose mass reaches p (Holtzman et al. 2020).
    assert kept(filter_logits(logits, top_p=0.5)) == [True, False, False, False]
    assert kept(filter_logits(logits, top_p=0.8)) == [True, True, False, False]
    assert kept(filter_logits(logits, top_p=0.81)) == [True, True, True, False]
    assert kept(filter_logits(logits, top_p=0.01)) == [True, False, False, False]
    assert kept(filter_logits(logits, top_p=1.0)) == [True, True, True, True]
