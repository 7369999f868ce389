"""``minigpt export --format gguf``: transformers' GGUF reader and the ``gguf`` package's own reader
are the oracles."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from helpers import assert_user_error, tiny  # noqa: E402

from minigpt_cli.config.schema import ModelConfig  # noqa: E402
from minigpt_cli.errors import MinigptError  # noqa: E402
from minigpt_cli.hf.export import export_run  # noqa: E402
from minigpt_cli.hf.gguf import GGUF_MARK, gguf_arch, tokenizer_fields  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.sample.load import load_run  # noqa: E402
from minigpt_cli.tokenizer.kinds import CharTokenizer  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()

BPE = ["tokenizer.kind=bpe", "tokenizer.vocab_size=300", "tokenizer.special_tokens=[<|endoftext|>]"]
#: A GPT-2-style run (learned positions, LayerNorm, tanh GELU, 4·d MLP, tied, no biases: zeros in the file) and a
#: Llama-style one (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied); d_ff 48 is no whole Q8_0 block.
STYLES = {
    "gpt2": ["model.ffn=gelu_tanh", *BPE],
    "llama": [
        "model.pos_encoding=rope",
        "model.norm=rmsnorm",
        "model.ffn=swiglu",
        "model.n_kv_head=1",
        "model.tie_weights=false",
        "model.d_ff=48",
        *BPE,
    ],
}
#: The largest logit difference from minigpt's each --dtype may give (f32: rounding only).
BOUNDS = {"f32": 1e-4, "f16": 5e-3, "q8_0": 5e-2}


@pytest.fixture(scope="module", params=list(STYLES))
def run(request, tmp_path_factory, data_dir):
    """A 3-step run of each style."""
    root = tmp_path_factory.mktemp(request.param)
    cfg = tiny(data_dir, "train.max_iters=3", f"train.out_dir={root}/runs", *STYLES[request.param])
    return train(cfg, "r", echo=lambda m: None, progress=False).run_dir


def _passage(corpus_file) -> str:
    return corpus_file.read_text()[-2000:]  # from the validation text


@pytest.mark.parametrize("dtype", list(BOUNDS))
def test_transformers_reads_the_gguf_back_to_minigpts_logits(run, dtype, tmp_path, corpus_file):
    from transformers import AutoModelForCausalLM

    if dtype == "q8_0" and run.parent.parent.name.startswith("llama"):
        pytest.skip(
            "d_ff 48 is refused for q8_0 (test_q8_0_names_the_tensor_whose_rows_are_not_whole_blocks)"
        )
    out = export_run(run, tmp_path / "m.gguf", fmt="gguf", dtype=dtype)
    loaded = load_run(run, runs.BEST)
    ids = loaded.tokenizer.encode(_passage(corpus_file))
    # transformers reads gpt2's context_length as n_ctx and leaves n_positions at 1024: its table is
    # ours only so.
    positions = (
        {"n_positions": loaded.config.model.block_size}
        if run.parent.parent.name.startswith("gpt2")
        else {}
    )
    ref = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=out.name, dtype=torch.float32, **positions
    ).eval()
    x = torch.tensor([ids[:32], ids[100:132]])
    with torch.no_grad():
        diff = (ref(x).logits - loaded.model.eval()(x)[0]).abs().max().item()
    print(f"{run.parent.parent.name} {dtype}: max |logit difference| {diff:.2e}")
    assert diff < BOUNDS[dtype], diff
    assert dtype == "f32" or diff > 0  # the narrower types do round


def test_the_embedded_tokenizer_gives_minigpts_ids(run, tmp_path, corpus_file):
    from transformers import AutoTokenizer

    out = export_run(run, tmp_path / "m.gguf", fmt="gguf")
    tok = load_run(run, runs.BEST).tokenizer
    passage = _passage(corpus_file) + "<|endoftext|>ROMEO:"
    hf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    assert hf_tok(passage, add_special_tokens=False)["input_ids"] == tok.encode(passage)
    reader = gguf.GGUFReader(out)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    assert len(tokens.data) == tok.vocab_size and tokens.contents()[eos] == "<|endoftext|>"
    assert reader.fields["tokenizer.ggml.token_type"].contents()[eos] == gguf.TokenType.CONTROL
    assert reader.fields[GGUF_MARK].contents() == 1


def test_q8_0_names_the_tensor_whose_rows_are_not_whole_blocks(run, tmp_path):
    if run.parent.parent.name.startswith("gpt2"):
        pytest.skip("every gpt2 width here is a multiple of 32")
    with pytest.raises(
        MinigptError,
        match=r"blk\.0\.ffn_down\.weight has rows of 48, not whole blocks of 32; pass "
        r"--dtype f16",
    ):
        export_run(run, tmp_path / "m.gguf", fmt="gguf", dtype="q8_0")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"pos_encoding": "sinusoidal"}, "model.pos_encoding='sinusoidal'"),
        ({"ffn": "gelu"}, "model.ffn='gelu'"),  # llama.cpp's GPT-2 computes the tanh GELU
        ({"ffn": "gelu_tanh", "d_ff": 64}, "model.d_ff=64"),
        (
            {"pos_encoding": "rope", "norm": "rmsnorm", "ffn": "swiglu", "bias": True},
            "model.bias=true",
        ),
        ({"pos_encoding": "rope", "norm": "layernorm", "ffn": "relu"}, "model.norm='layernorm'"),
        # issue 29's switches: neither graph computes them (a traceback, or a silently dropped cap,
        # before)
        (
            {
                "pos_encoding": "rope",
                "norm": "rmsnorm",
                "ffn": "swiglu",
                "bias": False,
                "qk_norm": True,
            },
            "model.qk_norm=true: GGUF's llama computes qk_norm false; train with model.qk_norm: false",
        ),
        (
            {
                "pos_encoding": "rope",
                "norm": "rmsnorm",
                "ffn": "swiglu",
                "bias": False,
                "logit_softcap": 15.0,
            },
            "model.logit_softcap=15.0: GGUF's llama computes logit_softcap null",
        ),
        ({"ffn": "gelu_tanh", "value_embeddings": True}, "model.value_embeddings=true"),
    ],
)
def test_a_run_gguf_cannot_hold_is_refused_naming_the_key(changes, key):
    with pytest.raises(MinigptError, match=key.replace(".", r"\.").replace("(", r"\(")):
        gguf_arch(ModelConfig(n_embd=32, n_head=2, **changes))


def test_every_key_gguf_cannot_hold_is_named_in_one_line_with_the_tokenizer():
    """The Quickstart's run (rope, LayerNorm, ReLU, characters): one refusal names every fix, the
    end-of-text token a BPE then needs too, so that one retraining is enough (it named one key per
    try before)."""
    from minigpt_cli.config.schema import TokenizerConfig

    mc = ModelConfig(
        n_embd=32, n_head=2, pos_encoding="rope", norm="layernorm", ffn="relu", bias=False
    )
    with pytest.raises(MinigptError) as err:
        gguf_arch(mc, TokenizerConfig(kind="char"))
    assert str(err.value) == (
        "model.norm='layernorm', model.ffn='relu', tokenizer.kind='char', no end-of-text token: GGUF's llama computes "
        "norm rmsnorm, ffn swiglu and llama.cpp reads only a byte-level BPE and llama.cpp ends a text at an "
        "end-of-text token such as <|endoftext|>, which this tokenizer lacks; train "
        "with model.norm: rmsnorm, model.ffn: swiglu, tokenizer.kind: bpe, "
        "tokenizer.special_tokens: ['<|endoftext|>']"
    )
    fixed = mc.model_copy(update={"norm": "rmsnorm", "ffn": "swiglu"})
    assert (
        gguf_arch(fixed, TokenizerConfig(kind="bpe", special_tokens=["<|endoftext|>"])) == "llama"
    )  # all it said
    # positions GGUF holds neither way hide nothing else: the rest is measured against llama
    with pytest.raises(
        MinigptError,
        match=r"^model.pos_encoding='sinusoidal', model.logit_softcap=30.0: GGUF holds "
        r"learned \(gpt2\) or rope \(llama\) positions and GGUF's llama computes "
        r"logit_softcap null; train with model.pos_encoding: rope, "
        r"model.logit_softcap: null$",
    ):
        gguf_arch(fixed.model_copy(update={"pos_encoding": "sinusoidal", "logit_softcap": 30.0}))


def test_a_char_tokenizer_is_refused_naming_its_kind():
    with pytest.raises(
        MinigptError, match=r"tokenizer.kind='char'.*train with tokenizer.kind: bpe"
    ):
        tokenizer_fields(CharTokenizer("abc", ["<|endoftext|>"]), "char", 4)


def test_the_cli_refuses_an_existing_file_and_replaces_only_its_own(run, tmp_path, cli):
    out = tmp_path / "m.gguf"
    assert (
        cli(
            "export", str(run), "--format", "gguf", "--output", str(out), "--dtype", "f16"
        ).exit_code
        == 0
    )
    first = out.read_bytes()
    assert_user_error(
        cli("export", str(run), "--format", "gguf", "--output", str(out)), "exists", "--force"
    )
    assert out.read_bytes() == first
    left = tmp_path / ".m.gguf.minigpt-gguf-killed.tmp"  # what a killed export leaves
    left.write_bytes(b"GGUF")
    assert (
        cli("export", str(run), "--format", "gguf", "--output", str(out), "--force").exit_code == 0
    )
    assert out.read_bytes() != first and not left.exists()  # f32 replaced f16; the leftover swept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
    other = tmp_path / "notes.gguf"
    other.write_text("mine")
    assert_user_error(
        cli("export", str(run), "--format", "gguf", "--output", str(other), "--force"),
        "not a GGUF minigpt wrote",
    )
    assert other.read_text() == "mine"
    assert_user_error(
        cli("export", str(run), "--output", str(tmp_path / "hf"), "--dtype", "f16"), "--dtype"
    )


def test_the_cli_refuses_a_run_gguf_cannot_hold(tmp_path, data_dir, cli):
    cfg = tiny(
        data_dir, "train.max_iters=1", f"train.out_dir={tmp_path}/runs"
    )  # exact GELU, char tokenizer
    run_dir = train(cfg, "c", echo=lambda m: None, progress=False).run_dir
    assert_user_error(
        cli("export", str(run_dir), "--format", "gguf", "--output", str(tmp_path / "c.gguf")),
        "model.ffn='gelu'",
        "gelu_tanh",
    )
    assert not (tmp_path / "c.gguf").exists()
