"""The GPT: initial loss, init, tying, the Pre-LN block against torch.nn, the KV cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from minigpt_cli.config.schema import ModelConfig
from minigpt_cli.errors import MinigptError
from minigpt_cli.model.gpt import GPT, Block
from minigpt_cli.sample.decoding import KVCache
from minigpt_cli.sample.sampling import FLOAT32_ZERO, filter_logits, generate_tokens, sample_next


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
    """Our Pre-LN GELU block computes nn.TransformerEncoderLayer(norm_first=True) with a causal
    mask."""
    torch.manual_seed(0)
    d, h, T = 32, 4, 10
    cfg = small(n_embd=d, n_head=h, bias=True, ffn="gelu")
    ours = Block(cfg).eval()
    ref = nn.TransformerEncoderLayer(
        d,
        h,
        dim_feedforward=4 * d,
        dropout=0.0,
        activation="gelu",
        batch_first=True,
        norm_first=True,
        layer_norm_eps=1e-5,
    ).eval()
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
    """Cached and uncached generation agree token for token, also past block_size (the window
    slides)."""
    torch.manual_seed(0)
    cfg = small(pos_encoding=pos, block_size=12, n_kv_head=2)
    model = GPT(cfg).eval()
    with torch.no_grad():  # sharpen the random model so greedy choices are not near-ties
        model.lm_head.weight.mul_(20)
    prompt = torch.randint(0, 65, (2, 5))
    runs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(7)
        toks = list(
            generate_tokens(
                model,
                prompt,
                30,
                temperature=temperature,
                top_k=None,
                use_cache=use_cache,
                generator=g,
                window_stride=stride,
            )
        )
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
        list(
            generate_tokens(
                model,
                torch.zeros(1, prompt_len, dtype=torch.long),
                n,
                temperature=0.0,
                use_cache=use_cache,
                window_stride=stride,
            )
        )
    finally:
        del model.forward
    return lengths


def test_window_slides_by_the_stride():
    """Block 8, stride 3: the window fills to 8, then drops 3 tokens at once (6 left), refills to 8,
    ..."""
    model = GPT(small(block_size=8)).eval()
    uncached = _window_lengths(model, 2, 14, 3, use_cache=False)
    assert uncached == [2, 3, 4, 5, 6, 7, 8, 6, 7, 8, 6, 7, 8, 6]
    cached = _window_lengths(model, 2, 14, 3, use_cache=True)
    # The cache is filled with the whole window at the start and after each slide, else fed one
    # token.
    assert cached == [2, 1, 1, 1, 1, 1, 1, 6, 1, 1, 6, 1, 1, 6]
    # A prompt longer than the block is cropped to its last 8 tokens; stride 1 is nanoGPT's crop.
    assert _window_lengths(model, 20, 4, 1, use_cache=False) == [8, 8, 8, 8]
    assert _window_lengths(model, 20, 4, 1, use_cache=True) == [8, 8, 8, 8]
    with pytest.raises(AssertionError, match="9"):  # the schema refuses it first (test_generate)
        _window_lengths(model, 2, 3, 9, use_cache=True)


def test_stride_one_is_nanogpts_crop():
    """Greedy decoding with stride 1 equals a hand-written loop over ``seq[:, -block_size:]``
    (nanoGPT)."""
    torch.manual_seed(0)
    model = GPT(small(block_size=10)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    seq = torch.randint(0, 65, (1, 4))
    ours = torch.stack(
        list(generate_tokens(model, seq, 25, temperature=0.0, window_stride=1)), dim=1
    )
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
        cache = KVCache(model, 1)
        first, _ = model(x[:, :6], cache=cache)
        rest = [model(x[:, i : i + 1], cache=cache)[0] for i in range(6, 10)]
    stepwise = torch.cat([first] + rest, dim=1)
    assert torch.allclose(full, stepwise, atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_positions_are_one_tensor_per_token_or_per_row(pos):
    """GPT.forward's one positions path: (T,) positions 0..T-1, and the same for each row (B, T),
    give the default positions' logits exactly. Shifted by 3, RoPE's logits stay (its scores depend
    on the offset m - n of query and key only: Su et al. 2021 §3.2) and none's too, while a learned
    or sinusoidal table's change."""
    torch.manual_seed(0)
    model = GPT(small(pos_encoding=pos, block_size=12)).eval()
    x = torch.randint(0, 65, (2, 8))
    at = torch.arange(8)
    with torch.no_grad():
        full, _ = model(x)
        assert torch.equal(model(x, positions=at)[0], full)
        assert torch.equal(model(x, positions=at.expand(2, 8))[0], full)
        rows = torch.stack([at, at + 3])  # the second row 3 positions further on
        shifted = model(x, positions=rows)[0]
    assert torch.equal(shifted[0], full[0])
    moved = (shifted[1] - full[1]).abs().max().item()
    if pos in ("rope", "none"):
        assert moved < 1e-5, moved
    else:
        assert moved > 1e-3, moved


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


# ----------------------------------------------------------------------------- sampling numerics

INF = float("inf")
#: Rows of logits of every sign and scale: the sampler's distribution must be softmax(logits / T)
#: for each.
LOGIT_ROWS = {
    "positive": [1.0, 2.0, 3.0, 0.5],
    "negative": [-3.0, -1.0, -2.0, -5.0],  # / 1e-40 once gave a row of -inf: NaN probabilities
    "mixed": [-1.0, 0.5, 2.0, -4.0],
    "large": [1e30, -1e30, 0.0, 5e29],
    "masked": [-INF, 1.0, -INF, 0.0],
    "ties": [2.0, 2.0, -1.0, 2.0],
    "masked negative ties": [-INF, -7.0, -7.0, -INF, -9.0],
}
#: From the underflow of float32 (1e-46 and below round to 0) to temperatures that flatten
#: everything.
TEMPERATURES = [5e-324, 1e-300, 1e-46, 1e-45, 1e-30, 1e-8, 1e-3, 1.0, 1e3, 1e30]
DRAWS = 4000


def reference_probs(row: list[float], temperature: float) -> torch.Tensor:
    """softmax(row / T) in float64 (torch.softmax); where row / T overflows even float64, its limit
    T -> 0: the maxima, equally likely."""
    logits = torch.tensor(row, dtype=torch.float64)
    z = logits / temperature
    if not torch.isinf(z.max()):
        return torch.softmax(z, dim=-1)
    top = logits == logits.max()
    return top.double() / top.sum()


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("name", LOGIT_ROWS)
def test_sampling_is_softmax_of_logits_over_temperature(name, temperature):
    """4,000 draws at once: every id valid (in range, never a -inf one), the maxima alone at tiny T,
    and the empirical distribution within total variation 0.04 of softmax(logits / T) (the sampling
    noise of 4,000 draws over <= 5 ids is about 0.01)."""
    row = LOGIT_ROWS[name]
    logits = torch.tensor([row]).expand(DRAWS, -1)
    ids = sample_next(logits, temperature, None, None, torch.Generator().manual_seed(0))
    assert ids.shape == (DRAWS,) and ids.dtype == torch.long
    assert 0 <= int(ids.min()) and int(ids.max()) < len(row)
    assert all(row[i] != -INF for i in ids.unique().tolist()), ids.unique()
    if temperature <= 1e-8:  # greedy: one of the (tied) maxima
        assert set(ids.unique().tolist()) <= {i for i, v in enumerate(row) if v == max(row)}
    freq = torch.bincount(ids, minlength=len(row)).double() / DRAWS
    expected = reference_probs(row, temperature)
    tv = 0.5 * (freq - expected).abs().sum().item()
    assert tv < 0.04, (freq.tolist(), expected.tolist())


def test_the_grid_holds_distributions_that_are_neither_greedy_nor_uniform():
    """The test above can fail: its rows and temperatures give distributions far from both ends."""
    assert (
        reference_probs(LOGIT_ROWS["large"], 1e30).max() < 0.5
    )  # [e^1, e^-1, 1, e^0.5] normalised
    # e^3 / (e^1 + e^2 + e^3 + e^0.5) = 20.0855 / 31.8421
    assert reference_probs(LOGIT_ROWS["positive"], 1.0)[2] == pytest.approx(0.6308, abs=1e-4)
    assert reference_probs(LOGIT_ROWS["ties"], 1e-3).tolist() == pytest.approx(
        [1 / 3, 1 / 3, 0, 1 / 3]
    )
    assert 1e-46 <= FLOAT32_ZERO < 1e-45  # both sides of the float32 underflow are in the grid


def test_filtering_after_the_temperature():
    """Top-k and top-p act on softmax(logits / T) (Hugging Face's order): at T = 2, [4, 2, 0, -2]
    becomes softmax([2, 1, 0, -1]) = [.644, .237, .087, .032]; top-p 0.85 keeps the first two, top-k
    3 three."""
    row = torch.tensor([[4.0, 2.0, 0.0, -2.0]]).expand(DRAWS, -1)
    for top_k, top_p, kept in ((None, 0.85, 2), (3, None, 3)):
        ids = sample_next(row, 2.0, top_k, top_p, torch.Generator().manual_seed(1))
        freq = torch.bincount(ids, minlength=4).double() / DRAWS
        expected = torch.softmax(
            torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64)[:kept], dim=-1
        )
        assert freq[kept:].sum() == 0
        assert 0.5 * (freq[:kept] - expected).abs().sum() < 0.04, freq


@pytest.mark.parametrize("temperature", [INF, -INF, float("nan"), -1.0, -1e-30])
def test_a_temperature_that_is_not_finite_and_nonnegative_is_refused(temperature):
    """Once, by the schema (every route reaches it: test_generate); the sampler trusts what it
    passed."""
    from pydantic import ValidationError

    from minigpt_cli.config.schema import SampleConfig

    with pytest.raises(ValidationError, match="temperature"):
        SampleConfig(temperature=temperature)


@pytest.mark.parametrize(
    "row,what",
    [([0.0, INF, 1.0], "infinite"), ([-INF, -INF], "infinite"), ([1.0, float("nan")], "NaN")],
)
def test_logits_with_nothing_to_sample_are_refused(row, what):
    """+inf, NaN or a row of -inf: the forward pass overflowed; no temperature makes a distribution
    of it."""
    for temperature in (0.0, 1e-45, 1.0):
        with pytest.raises(MinigptError, match=f"the model's output is {what}"):
            sample_next(torch.tensor([row]), temperature, None, None, None)


@pytest.mark.parametrize("bad", [-(2**63), -1, 65, 127])
def test_a_sampled_id_outside_the_vocabulary_is_refused(monkeypatch, bad):
    """Some devices' torch.multinomial returned int64-min. The vocabulary is the tokenizer's
    (vocab_limit 65) even when the model's is padded to 128."""
    model = GPT(small(vocab_size=128)).eval()
    monkeypatch.setattr(
        torch, "multinomial", lambda probs, n, generator=None: torch.full((probs.size(0), n), bad)
    )
    with pytest.raises(MinigptError) as info:
        list(
            generate_tokens(
                model, torch.zeros(1, 1, dtype=torch.long), 3, temperature=1.0, vocab_limit=65
            )
        )
    assert str(info.value).startswith(
        f"the sampler on cpu returned token id {bad}, outside the vocabulary (0 to 64); "
    )
    monkeypatch.undo()
    ids = torch.cat(
        list(
            generate_tokens(
                model,
                torch.zeros(1, 1, dtype=torch.long),
                200,
                temperature=1e30,
                vocab_limit=65,
                generator=torch.Generator().manual_seed(0),
            )
        )
    )
    assert int(ids.max()) < 65 and len(ids.unique()) > 40  # near-uniform over the 65 real ids only


@pytest.mark.parametrize("top_k, top_p", [(None, None), (5, None), (None, 0.5)])
def test_per_row_generators_draw_what_torch_multinomial_draws_row_by_row(top_k, top_p):
    """sample_next with a generator per row does the batch's draw in one division and argmax; each
    row's ids must be those of torch.multinomial on that row with that generator (the oracle),
    filtered tokens never drawn."""
    logits = torch.randn(6, 65, generator=torch.Generator().manual_seed(3)) * 3
    ours = [torch.Generator().manual_seed(100 + i) for i in range(6)]
    theirs = [torch.Generator().manual_seed(100 + i) for i in range(6)]
    probs = torch.softmax(
        filter_logits((logits - logits.amax(-1, keepdim=True)).double().float(), top_k, top_p), -1
    )
    drawn = torch.stack(
        [sample_next(logits, 1.0, top_k, top_p, ours) for _ in range(200)]
    )  # (200, 6)
    expected = torch.stack(
        [
            torch.cat(
                [
                    torch.multinomial(probs[i : i + 1], 1, generator=g)[0]
                    for i, g in enumerate(theirs)
                ]
            )
            for _ in range(200)
        ]
    )
    assert torch.equal(drawn, expected)
    assert bool((probs.gather(1, drawn.T) > 0).all()) and len(drawn.unique()) > (
        3 if top_k or top_p else 30
    )
