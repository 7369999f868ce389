"""``minigpt export --format gguf``: transformers' GGUF reader, the ``gguf`` package's own reader
and llama.cpp itself are the oracles.

llama.cpp runs through node-llama-cpp's prebuilt binaries (``tests/fixtures/llama_cpp.mjs``); its
tests are skipped where ``node`` or the package is missing. To run them: ``npm install --prefix DIR
node-llama-cpp`` and ``NODE_PATH=DIR/node_modules`` (or a ``node_modules/`` in the repository root).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from helpers import assert_user_error, tiny  # noqa: E402

from minigpt_cli.config.schema import ModelConfig  # noqa: E402
from minigpt_cli.errors import MinigptError  # noqa: E402
from minigpt_cli.hf.export import export_run  # noqa: E402
from minigpt_cli.hf.gguf import GGUF_MARK, gguf_arch, gguf_tensors, tokenizer_fields  # noqa: E402
from minigpt_cli.model.gpt import GPT  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.sample.load import load_run  # noqa: E402
from minigpt_cli.tokenizer.kinds import CharTokenizer  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()

BPE = ["tokenizer.kind=bpe", "tokenizer.vocab_size=300", "tokenizer.special_tokens=[<|endoftext|>]"]
#: A GPT-2-style run (learned positions, LayerNorm, tanh GELU, 4·d MLP, tied, no biases: zeros in
#: the file) and a Llama-style one (RoPE, RMSNorm, SwiGLU, untied, and grouped-query attention: 4
#: query heads in 2 groups, the case transformers before 4.43 read wrongly); d_ff 48 is no whole
#: Q8_0 block. The Llama's weights start at 5x the default spread, so that its attention is far from
#: uniform: k rows out of place then move the logits by 0.8-0.9, not by 5e-4 (below llama.cpp's
#: rounding).
STYLES = {
    "gpt2": ["model.ffn=gelu_tanh", *BPE],
    "llama": [
        "model.pos_encoding=rope",
        "model.norm=rmsnorm",
        "model.ffn=swiglu",
        "model.n_head=4",
        "model.n_kv_head=2",
        "model.tie_weights=false",
        "model.d_ff=48",
        "model.init_std=0.1",
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


@pytest.mark.parametrize("n_head, n_kv_head", [(4, 4), (4, 2), (4, 1), (6, 2)])
def test_q_and_k_rows_are_the_layout_transformers_reverses(n_head, n_kv_head):
    """The file's q and k rows, put back by transformers' own reverse permutation (k's with the
    key/value heads), are minigpt's: grouped-query and multi-query attention included."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    mc = ModelConfig(
        n_layer=1,
        n_embd=48,
        n_head=n_head,
        n_kv_head=n_kv_head,
        vocab_size=16,
        block_size=8,
        pos_encoding="rope",
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
    )
    torch.manual_seed(0)
    model = GPT(mc)
    kv = mc.kv_heads * mc.head_dim
    q, k, _ = torch.split(model.state_dict()["h.0.attn.c_attn.weight"], [mc.n_embd, kv, kv])
    tensors = gguf_tensors(model, mc, gguf_arch(mc))
    reader = LlamaTensorProcessor(
        config={"num_attention_heads": n_head, "num_key_value_heads": n_kv_head}
    )
    for name, ours in (("blk.0.attn_q.weight", q), ("blk.0.attn_k.weight", k)):
        stored = tensors[name]
        assert stored.shape == ours.shape and not torch.equal(stored, ours)  # permuted
        back = reader.process(stored.numpy(), name).weights
        assert torch.equal(torch.from_numpy(back), ours), name


def test_the_file_holds_the_sizes_llama_cpp_reads(run, tmp_path):
    """The keys llama.cpp's loader reads (``LLM_KV_CONTEXT_LENGTH``, the head counts, the rotary
    width): the context length is the run's block_size, the key/value heads its n_kv_head."""
    out = export_run(run, tmp_path / "m.gguf", fmt="gguf")
    mc = load_run(run, runs.BEST).config.model
    reader = gguf.GGUFReader(out)
    arch = reader.fields["general.architecture"].contents()
    field = {k.removeprefix(f"{arch}."): f.contents() for k, f in reader.fields.items()}
    assert field["context_length"] == mc.block_size
    assert field["attention.head_count"] == mc.n_head
    if arch == "llama":
        assert field["attention.head_count_kv"] == mc.kv_heads == 2 < mc.n_head
        assert field["rope.dimension_count"] == mc.head_dim
        k = next(t for t in reader.tensors if t.name == "blk.0.attn_k.weight")
        # GGUF lists a tensor's dimensions innermost first: (n_embd, n_kv_head·head_dim)
        assert list(k.shape) == [mc.n_embd, mc.kv_heads * mc.head_dim]


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


PROBE = Path(__file__).parent / "fixtures" / "llama_cpp.mjs"
#: The largest logit difference llama.cpp may give from minigpt's in f32: its kernels' rounding and
#: its f16 key/value cache (1.2e-3 measured on the Llama-style run).
LLAMA_CPP_BOUND = 1e-2


@pytest.fixture(scope="module")
def llama_cpp(run, tmp_path_factory, corpus_file):
    """What llama.cpp makes of the f32 export of ``run``: its tokens and detokenized text for a
    passage, its logits after 24 of minigpt's ids, and 16 greedy tokens after 8 of them
    (``tests/fixtures/llama_cpp.mjs``). Skipped without node or node-llama-cpp."""
    root = Path(__file__).resolve().parent.parent
    if shutil.which("node") is None:
        pytest.skip("no node on PATH (llama.cpp runs through npm's node-llama-cpp)")
    found = subprocess.run(["node", PROBE, "check"], cwd=root, capture_output=True, text=True)
    if found.returncode == 3:
        pytest.skip(found.stderr.strip().splitlines()[-1])
    assert found.returncode == 0, found.stderr
    tmp = tmp_path_factory.mktemp("llama-cpp")
    out = export_run(run, tmp / "m.gguf", fmt="gguf")
    tok = load_run(run, runs.BEST).tokenizer
    # the validation text, with the end-of-text token, a space before an apostrophe (which the
    # clean-up of llama.cpp's detokenizer drops) and non-ASCII text
    tail = "<|endoftext|>ROMEO: Not 'mong them. Ça, naïve — «Roméo»?"
    text = _passage(corpus_file)[:600] + tail
    ids = tok.encode(_passage(corpus_file))
    job = {"model": str(out), "n_ctx": 32, "text": text, "ids": ids[:24]}
    job.update(prompt=ids[:8], new_tokens=16)
    (tmp / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        ["node", PROBE, tmp / "job.json", tmp / "out.json"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return {**job, **json.loads((tmp / "out.json").read_text())}


def test_llama_cpp_gives_minigpts_logits_and_greedy_tokens(run, llama_cpp):
    model = load_run(run, runs.BEST).model.eval()
    with torch.no_grad():
        ours = model(torch.tensor([llama_cpp["ids"]]))[0][0]
        # minigpt's logits along llama.cpp's greedy continuation
        along = model(torch.tensor([llama_cpp["prompt"] + llama_cpp["greedy"]]))[0][0]
    diff = (torch.tensor(llama_cpp["logits"]) - ours).abs().max().item()
    print(f"{run.parent.parent.name}: llama.cpp's max |logit difference| {diff:.2e}")
    assert diff < LLAMA_CPP_BOUND, diff
    assert llama_cpp["train_context_size"] == model.config.block_size
    steps = along[len(llama_cpp["prompt"]) - 1 : -1]
    assert len(steps) == len(llama_cpp["greedy"]) == 16
    clear = 0
    for logits, token in zip(steps, llama_cpp["greedy"]):
        top2 = logits.topk(2).values
        if top2[0] - top2[1] > 2 * LLAMA_CPP_BOUND:  # no near-tie: llama.cpp's token is minigpt's
            assert token == logits.argmax().item()
            clear += 1
        else:  # a near-tie: either token is greedy within the rounding
            assert logits[token] >= top2[0] - 2 * LLAMA_CPP_BOUND
    assert clear >= 8  # most steps decide the token


def test_llama_cpp_tokenizes_as_minigpt_and_detokenizes_per_token(run, llama_cpp):
    """Its ids are minigpt's, and so is each id's piece, so the pieces give the text back where no
    character is cut between tokens (a piece holding half of a UTF-8 character reads as U+FFFD, as
    minigpt's does). All ids at once give the non-ASCII text back too, but llama.cpp's clean-up
    drops the space before an apostrophe (docs/hf.md)."""
    tok = load_run(run, runs.BEST).tokenizer
    text = llama_cpp["text"]
    ascii_part = text[: text.index("Ç")]
    assert llama_cpp["tokens"] == tok.encode(text)
    assert llama_cpp["pieces"] == [tok.decode([i]) for i in tok.encode(text)]
    assert "".join(llama_cpp["pieces"]).startswith(ascii_part)
    assert "\ufffd" in "".join(llama_cpp["pieces"])  # a character cut between two tokens
    whole = llama_cpp["whole"]
    assert " '" in text and " '" not in whole
    assert whole == text.replace(" '", "'")


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
        "model.norm='layernorm', model.ffn='relu', tokenizer.kind='char', "
        "tokenizer.special_tokens=[]: GGUF's llama computes norm rmsnorm, ffn swiglu and "
        "llama.cpp reads only a byte-level BPE and the tokenizer has no end-of-text token, such "
        "as <|endoftext|>, for llama.cpp to stop at; train with model.norm: rmsnorm, model.ffn: "
        "swiglu, tokenizer.kind: bpe, tokenizer.special_tokens: ['<|endoftext|>']"
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


def test_a_bpe_without_end_of_text_is_refused_naming_the_token(tmp_path, data_dir, cli):
    """The refusal names the key, the token it lacks and the list to train with (its own special
    tokens kept), and writes nothing."""
    cfg = tiny(
        data_dir,
        "train.max_iters=1",
        f"train.out_dir={tmp_path}/runs",
        "model.ffn=gelu_tanh",
        "tokenizer.kind=bpe",
        "tokenizer.vocab_size=300",
        "tokenizer.special_tokens=[<sep>]",
    )
    run_dir = train(cfg, "b", echo=lambda m: None, progress=False).run_dir
    out = tmp_path / "b.gguf"
    assert_user_error(
        cli("export", str(run_dir), "--format", "gguf", "--output", str(out)),
        "tokenizer.special_tokens=['<sep>']: the tokenizer has no end-of-text token, such as "
        "<|endoftext|>, for llama.cpp to stop at; train with tokenizer.special_tokens: "
        "['<sep>', '<|endoftext|>']",
    )
    assert not out.exists()


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
