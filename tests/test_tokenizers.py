"""The four tokenizer kinds: the course's toy merges, exact round trips, unknown text,
special tokens, save/load through the `tokenizers` library, and the CLI around them."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import yaml
from helpers import assert_user_error

from minigpt_cli.data.preparation import prepare, split_text, token_dtype
from minigpt_cli.errors import MinigptError
from minigpt_cli.tokenizer.kinds import KINDS, UNK, CharTokenizer, load_tokenizer, lossy_report
from minigpt_cli.tokenizer.training import base_vocab_size, train_tokenizer
from minigpt_cli.tokenizer.wordpiece import wordpiece_merges, wordpiece_scores

REPO = Path(__file__).resolve().parent.parent
BPE_CONFIG = REPO / "configs" / "shakespeare-bpe.yaml"
TOY = {
    "hug": 10,
    "pug": 5,
    "pun": 12,
    "bun": 4,
    "hugs": 5,
}  # Hugging Face LLM course, ch. 6.5-6.6 (BPE, WordPiece)
TOY_TEXT = "".join(f"{w}\n" * n for w, n in TOY.items())
EOT = "<|endoftext|>"
#: Whitespace and scripts a byte-level tokenizer must give back byte for byte.
AWKWARD = [
    "  leading spaces",
    "trailing spaces   ",
    "repeated   spaces  inside",
    "\ttabs\tand\t\ttabs\t",
    "blank\n\n\nlines\n\n",
    "\n",
    " ",
    "naïve café, Ærø, straße, Ελληνικά, русский, 日本語",
    "emoji 😀👍🏽 and a family 👨‍👩‍👧 ✨",
    " \t \n \r\n mixed \u00a0 nbsp",
    "",
]
#: Text made only of characters Tiny Shakespeare has, with awkward whitespace.
KNOWN = [
    "  First  Citizen:\n\n\nBefore we proceed any further, hear me speak.  ",
    " ",
    "\n\n",
    "ROMEO:\n  O, she doth teach!",
]


@pytest.fixture(scope="module")
def corpus_text(corpus_file) -> str:
    return corpus_file.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def small_text(corpus_text) -> str:
    """The first 100,000 characters: enough for every kind at a few hundred entries."""
    return corpus_text[:100_000]


@pytest.fixture(scope="module")
def trained(small_text) -> dict:
    """One tokenizer of each kind on the small slice, with <|endoftext|> as a special token."""
    return {k: train_tokenizer(k, small_text, 400, [EOT]) for k in KINDS}


# ----------------------------------------------------------------------------- the course's toy
# corpus


def test_bpe_first_merge_is_u_g_with_count_20(tmp_path):
    pairs = Counter()
    for w, n in TOY.items():
        for p in zip(w, w[1:]):
            pairs[p] += n
    assert pairs.most_common(1) == [(("u", "g"), 20)]
    tok = train_tokenizer("bpe", TOY_TEXT, 256 + 1)  # the bytes and one merge
    tok.save(tmp_path / "bpe.json")
    merges = json.loads((tmp_path / "bpe.json").read_text())["model"]["merges"]
    assert merges[0] in (["u", "g"], "u g")
    assert len(merges) == 1


def test_wordpiece_first_merge_is_g_s_by_score():
    scores = wordpiece_scores(TOY)
    assert round(scores[("##g", "##s")], 3) == 0.050
    assert round(scores[("##u", "##g")], 3) == 0.028
    assert max(scores, key=scores.get) == ("##g", "##s")
    a, b, score, count = next(wordpiece_merges(TOY))
    assert (a, b, count) == ("##g", "##s", 5) and score == pytest.approx(0.05)


def test_wordpiece_tokenizer_learns_gs_first(tmp_path):
    base = base_vocab_size("wordpiece", TOY_TEXT)
    tok = train_tokenizer("wordpiece", TOY_TEXT, base + 1)
    tok.save(tmp_path / "wp.json")
    back = tokenizers.Tokenizer.from_file(str(tmp_path / "wp.json"))
    assert back.id_to_token(base) == "##gs"  # the one merged entry, after the alphabet
    assert back.encode("hugs").tokens == ["h", "##u", "##gs"]


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("s", AWKWARD, ids=range(len(AWKWARD)))
def test_byte_level_bpe_round_trips_anything(trained, s):
    tok = trained["bpe"]
    ids = tok.encode(s)
    out = tok.decode(ids)
    assert out == s and out.encode("utf-8") == s.encode("utf-8")
    assert "Ġ" not in out and "Ċ" not in out and "ĉ" not in out
    assert UNK not in out


def test_byte_level_bpe_round_trips_through_the_library_file(trained, tmp_path):
    path = tmp_path / "bpe.json"
    trained["bpe"].save(path)
    lib = tokenizers.Tokenizer.from_file(str(path))
    for s in AWKWARD:
        ids = lib.encode(s).ids
        assert ids == trained["bpe"].encode(s)
        assert lib.decode(ids) == s


def test_char_round_trips_within_its_alphabet():
    text = "".join(AWKWARD)
    tok = CharTokenizer.train(text)
    for s in AWKWARD:
        assert tok.decode(tok.encode(s)) == s
    with pytest.raises(MinigptError, match="lacks"):
        tok.encode("☃")


@pytest.mark.parametrize("kind", KINDS)
def test_known_text_round_trips_for_every_kind(trained, kind):
    tok = trained[kind]
    for s in KNOWN:
        assert tok.decode(tok.encode(s)) == s, (kind, s)


def test_whole_corpus_round_trips(corpus_text):
    tok = train_tokenizer("bpe", corpus_text, 512)
    assert tok.decode(tok.encode(corpus_text)) == corpus_text


@pytest.mark.parametrize("kind", ["unigram", "wordpiece"])
def test_unseen_characters_become_unk_and_the_rest_survives(trained, kind, tmp_path):
    tok = trained[kind]
    s = "Before we proceed ☃ any further, 😀 hear me"
    ids = tok.encode(s)  # never raises
    unk = tok.token_to_id(UNK)
    assert unk is not None and unk in ids
    out = tok.decode(ids)
    assert out.startswith("Before we proceed") and out.endswith(" hear me")
    assert " any further," in out and UNK in out
    assert "☃" not in out and "😀" not in out
    path = tmp_path / "t.json"
    tok.save(path)
    assert load_tokenizer(path).encode(s) == ids
    assert tokenizers.Tokenizer.from_file(str(path)).encode(s).ids == ids


# ----------------------------------------------------------------------------- ids outside the
# vocabulary


@pytest.mark.parametrize("kind", KINDS)
def test_decode_refuses_ids_outside_the_vocabulary(trained, kind):
    """Not Python's negative indexing (char) nor an empty string (the library): a one-line error."""
    tok = trained[kind]
    n = tok.vocab_size
    assert tok.decode([0, n - 1]) and tok.decode(np.array([0, n - 1])) == tok.decode([0, n - 1])
    for bad in (-1, n, 10**12):
        for ids in ([bad], [0, bad, 1]):
            with pytest.raises(MinigptError) as e:
                tok.decode(ids)
            msg = str(e.value)
            assert (
                f"token id {bad:,} is not in the tokenizer's vocabulary of {n:,} ids (0 to {n - 1:,})"
                in msg
            )
            assert "\n" not in msg


# ----------------------------------------------------------------------------- text lost to <unk>

PROMPT = "ROMEO: ¿Qué tal? 😀"


@pytest.mark.parametrize("kind", ["unigram", "wordpiece"])
def test_unknown_chars_are_exactly_the_characters_that_become_unk(trained, kind, tmp_path):
    tok = trained[kind]
    unk = tok.token_to_id(UNK)
    assert tok.unknown_chars(PROMPT) == ["¿", "é", "😀"]
    for ch in set(PROMPT):  # each character alone: <unk> exactly when it is listed
        assert (unk in tok.encode(ch)) == (ch in tok.unknown_chars(PROMPT)), ch
    tok.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").unknown_chars(PROMPT + " ☃") == ["¿", "é", "😀", "☃"]
    # special tokens and a literal <unk> are single ids, not lost text; '<' and '|' alone were never
    # seen
    assert tok.unknown_chars(f"a{EOT}b{UNK}c") == []
    assert tok.unknown_chars("<|x|>") == ["<", "|", ">"]
    for s in KNOWN:
        assert tok.unknown_chars(s) == [] and lossy_report(tok, s) is None


def test_lossy_report_names_the_characters_lost(trained):
    assert (
        lossy_report(trained["unigram"], PROMPT)
        == "note: 3 characters of the prompt became <unk>: '¿', 'é', '😀'"
    )
    assert (
        trained["unigram"].decode(trained["unigram"].encode(PROMPT))
        == "ROMEO: <unk>Qu<unk> tal? <unk>"
    )
    assert lossy_report(trained["wordpiece"], "hear me ☃", what="the text") == (
        "note: the words of the text holding 1 character the vocabulary lacks became <unk>: '☃'"
    )
    many = "".join(chr(0x4E00 + i) for i in range(12))
    assert lossy_report(trained["unigram"], many).endswith(", '" + chr(0x4E09) + "', ...")
    assert lossy_report(trained["unigram"], many).startswith(
        "note: 12 characters of the prompt became <unk>: "
    )


def test_bpe_and_char_report_no_loss(trained):
    """Byte-level BPE keeps every byte; char refuses unknown characters in encode instead."""
    assert (
        trained["bpe"].unknown_chars(PROMPT) == [] and lossy_report(trained["bpe"], PROMPT) is None
    )
    assert trained["char"].unknown_chars(PROMPT) == ["¿", "é", "😀"]
    assert lossy_report(trained["char"], PROMPT) is None
    with pytest.raises(MinigptError, match="lacks: '¿', 'é', '😀'"):
        trained["char"].encode(PROMPT)


def test_an_hf_tokenizer_without_an_unknown_token_refuses_what_it_lacks_as_char_does(tmp_path):
    """A WordLevel tokenizer.json with no unknown token (an early char export): the library fails
    with "Missing [UNK] token"; minigpt names the characters, as for char, wherever the text comes
    from."""
    from helpers import wordlevel_tokenizer

    from minigpt_cli.sample.sampling import encode_prompt

    wordlevel_tokenizer("ROME: ").save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path / "tokenizer.json", "hf")
    assert tok.unk_token is None  # the library writes unk_token "<unk>", which its vocabulary lacks
    assert tok.encode("ROME O") == [0, 1, 2, 3, 5, 1] and tok.unknown_chars("ROMEO") == []
    assert tok.unknown_chars(PROMPT) == ["¿", "Q", "u", "é", "t", "a", "l", "?", "😀"]
    lacks = "text has characters the tokenizer's vocabulary lacks: '¿', 'Q', 'u', 'é', 't', 'a', 'l', '?', '😀'; "
    for encode in (tok.encode, lambda text: tok.encode_batch(["ROMEO", text]), tok.pieces):
        with pytest.raises(
            MinigptError, match=lacks.replace("?", r"\?") + "remove or replace them$"
        ):
            encode(PROMPT)
    with pytest.raises(
        MinigptError, match="^the prompt has characters the tokenizer's vocabulary lacks: 'é'; "
    ):
        encode_prompt(tok, "ROMEOé")
    assert lossy_report(tok, PROMPT) is None  # refused, not lost
    assert [a.tolist() for a in tok.encode_batch(["RO", "ME"])] == [[0, 1], [2, 3]]


def test_config_does_not_import_the_tokenizers():
    """Imports point one way (tokenizer -> config); the config still refuses bad special tokens."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom minigpt_cli.config.schema import TokenizerConfig\n"
        "try:\n    TokenizerConfig(special_tokens=['<unk>'])\nexcept ValueError as e:\n    print(e)\n"
        "print(sorted(m for m in sys.modules if m.startswith('minigpt_cli.tok')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "tokenizer.special_tokens: special token '<unk>' is the unknown token" in out
    assert out.rstrip().endswith("[]")


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_gives_the_same_ids(trained, kind, tmp_path):
    tok = trained[kind]
    path = tmp_path / f"{kind}.json"
    tok.save(path)
    again = load_tokenizer(path)
    assert again.kind == kind
    assert again.vocab_size == tok.vocab_size
    assert again.special_tokens == [EOT]
    assert again.fingerprint() == tok.fingerprint()
    sample = KNOWN[0] + EOT + KNOWN[3]
    assert again.encode(sample) == tok.encode(sample)
    if kind != "char":
        lib = tokenizers.Tokenizer.from_file(str(path))  # the library's own format, no extra keys
        assert lib.encode(sample).ids == tok.encode(sample)
        assert lib.decode(tok.encode(KNOWN[0]), skip_special_tokens=False) == KNOWN[0]


def test_vocab_sizes_are_exact(small_text):
    for kind in ("bpe", "wordpiece", "unigram"):
        least = base_vocab_size(kind, small_text)
        for size in (least, least + 7, 600):
            assert train_tokenizer(kind, small_text, size).vocab_size == size, (kind, size)


# ----------------------------------------------------------------------------- special tokens


@pytest.mark.parametrize("kind", KINDS)
def test_special_token_is_one_id_and_round_trips(trained, kind):
    tok = trained[kind]
    ids = tok.encode(EOT)
    assert len(ids) == 1
    eot = ids[0]
    s = f"First Citizen:{EOT}Before{EOT}\n{EOT}"
    ids = tok.encode(s)
    assert ids.count(eot) == 3
    assert tok.decode(ids) == s
    assert tok.decode([eot]) == EOT


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_near_miss_is_ordinary_text(trained, kind):
    tok = trained[kind]
    eot = tok.encode(EOT)[0]
    for near in ("<|endof text|>", "<|endoftext|", "|endoftext|>", "<|ENDOFTEXT|>"):
        ids = tok.encode(near)
        assert eot not in ids and len(ids) > 1
        back = tok.decode(ids)
        if kind == "bpe":
            assert back == near  # bytes: always exact
        elif near == "<|endof text|>":
            assert (
                back == f"{UNK}endof text{UNK}"
            )  # '<|' and '|>' were never seen: <unk> around the words


def test_char_special_tokens_follow_the_alphabet_and_match_first():
    tok = CharTokenizer.train(f"ab<|x|>ba{EOT}", special_tokens=[EOT])
    assert tok.chars == ["<", ">", "a", "b", "x", "|"]  # the special token's text is cut out first
    assert tok.special_tokens == [EOT] and tok.vocab_size == 7
    assert tok.encode(EOT) == [6]
    assert tok.encode(f"a{EOT}b") == [2, 6, 3]
    near = "<|x|>"
    assert 6 not in tok.encode(near) and tok.decode(tok.encode(near)) == near


def test_special_tokens_are_cut_out_of_training_text():
    text = f"the cat{EOT}" * 200
    tok = train_tokenizer("bpe", text, 260, [EOT])
    vocab = tok.backend.get_vocab()
    assert not any("endoftext" in t for t in vocab if t != EOT)
    assert tok.encode(EOT) == [0]  # special tokens take the first ids


def test_bad_special_tokens():
    with pytest.raises(MinigptError, match="twice"):
        train_tokenizer("bpe", "abc", 300, [EOT, EOT])
    with pytest.raises(MinigptError, match="non-empty"):
        train_tokenizer("bpe", "abc", 300, [""])
    with pytest.raises(MinigptError, match="unknown token"):
        train_tokenizer("unigram", "abc", 300, [UNK])


# ----------------------------------------------------------------------------- token storage


def test_dtype_is_uint16_up_to_65536_entries():
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    assert token_dtype(70_000) == np.uint32


class _WideTokenizer:
    """A fake tokenizer of 70,000 entries: ids above uint16 must survive prepare()."""

    kind = "fake"
    special_tokens: list = []
    vocab_size = 70_000

    def encode(self, text):
        return [69_000 + ord(c) % 1000 for c in text]

    def decode(self, ids):
        raise NotImplementedError

    def fingerprint(self):
        return "wide70000"


def test_prepare_stores_ids_above_65535_as_uint32(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("To be, or not to be: that is the question.\n" * 50, encoding="utf-8")
    data = prepare(corpus, _WideTokenizer(), tmp_path / "out", 0.1, log=lambda m: None)
    assert data.train.dtype == np.uint32 and data.meta["dtype"] == "uint32"
    assert int(data.train.max()) > 65_535
    assert list(data.train[:3]) == _WideTokenizer().encode("To ")
    assert (data.directory / "train.bin").stat().st_size == 4 * len(data.train)


# ----------------------------------------------------------------------------- bad input (library)


def test_bad_sizes_and_kinds(small_text):
    with pytest.raises(MinigptError, match="256"):
        train_tokenizer("bpe", small_text, 200)
    with pytest.raises(MinigptError, match="base alphabet"):
        train_tokenizer("wordpiece", small_text, 20)
    with pytest.raises(MinigptError, match="base alphabet"):
        train_tokenizer("unigram", small_text, 20)
    with pytest.raises(MinigptError, match="at most"):
        train_tokenizer("wordpiece", "hug pug pun bun hugs", 200)
    with pytest.raises(
        MinigptError, match="unigram trainer gave 11 vocabulary entries, fewer than the 200"
    ):
        train_tokenizer("unigram", "hug pug pun bun hugs", 200)
    with pytest.raises(MinigptError, match="at most"):
        train_tokenizer("bpe", "hug pug pun bun hugs", 300)
    with pytest.raises(MinigptError, match="vocabulary size"):
        train_tokenizer("bpe", small_text, None)
    with pytest.raises(MinigptError, match="unknown tokenizer kind"):
        train_tokenizer("sentencepiece", small_text, 300)
    with pytest.raises(MinigptError, match="empty"):
        train_tokenizer("bpe", "", 300)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_vocab_size_above_the_cap_is_refused_before_training(small_text, kind):
    """A huge size must not reach the Rust library (which aborts the process on 1e9)."""
    from minigpt_cli.tokenizer.training import MAX_VOCAB_SIZE

    assert MAX_VOCAB_SIZE == 1_048_576
    for size in (MAX_VOCAB_SIZE + 1, 1_000_000_000):
        with pytest.raises(MinigptError, match="above the largest supported, 1,048,576") as e:
            train_tokenizer(kind, small_text, size)
        assert f"{size:,}" in str(e.value)


def test_damaged_library_file_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"model": {"type": "BPE", "vocab": "nonsense"}}))
    with pytest.raises(MinigptError, match="damaged"):
        load_tokenizer(p)


# ----------------------------------------------------------------------------- CLI


@pytest.fixture
def slice_file(tmp_path, small_text) -> Path:
    p = tmp_path / "slice.txt"
    p.write_text(small_text[:50_000], encoding="utf-8")
    return p


def test_train_tokenizer_never_imports_torch(tmp_path, slice_file):
    """The command trains, summarises and saves without torch (whose import took 1.3 s of its 2.5 s
    start-up)."""
    import subprocess
    import sys

    out = tmp_path / "bpe.json"
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom minigpt_cli.cli import app\n"
        f"res = CliRunner().invoke(app, ['train-tokenizer', '--kind', 'bpe', '--vocab-size', '300', "
        f"'--input', {str(slice_file)!r}, '--output', {str(out)!r}])\n"
        "print(res.exit_code, 'torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["0", "False"], res
    assert load_tokenizer(out).vocab_size == 300


def test_cli_train_tokenizer_bpe_summary(cli, tmp_path, slice_file, data_dir):
    out = tmp_path / "bpe.json"
    res = cli(
        "train-tokenizer",
        "--set",
        f"data.data_dir={data_dir}",
        "--kind",
        "bpe",
        "--vocab-size",
        "400",
        "--input",
        slice_file,
        "--output",
        out,
        "--special-tokens",
        EOT,
    )
    assert res.exit_code == 0, res
    assert "vocabulary size     400" in res.stdout
    assert "val split tokens" in res.stdout and "characters / token" in res.stdout
    assert "round trip on corpus exact" in res.stdout
    assert f"{EOT} (id 0)" in res.stdout
    # The examples are the corpus's own: its most frequent word of 4+ letters, and of 8+, with their
    # counts.
    words = Counter(w for w in re.findall(r"[A-Za-z]+", slice_file.read_text()) if len(w) >= 4)
    top = min(words.items(), key=lambda wc: (-wc[1], wc[0]))
    top_long = min(
        ((w, c) for w, c in words.items() if len(w) >= 8),
        key=lambda wc: (wc[0].isupper(), -wc[1], wc[0]),
    )
    shown = [line.split() for line in res.stdout.splitlines() if line.startswith("  ")]
    assert [top[0], top_long[0]] == [shown[0][0], shown[3][0]] and shown[0][
        -1
    ] == f"({top[1]:,}\u00d7)"
    assert "▁" in res.stdout
    lib = tokenizers.Tokenizer.from_file(str(out))
    assert lib.get_vocab_size() == 400 and load_tokenizer(out).kind == "bpe"


def test_cli_default_output_goes_where_train_looks_for_it(cli, tmp_path, slice_file, monkeypatch):
    """--input's tokenizer goes to that corpus's folder, the one train on data.path=<input>
    reads."""
    from minigpt_cli.config.schema import Config
    from minigpt_cli.data.pipeline import configured_corpus, tokenizer_path

    monkeypatch.chdir(tmp_path)
    res = cli("train-tokenizer", "--kind", "unigram", "--vocab-size", "300", "--input", slice_file)
    assert res.exit_code == 0, res
    cfg = Config(data={"path": str(slice_file)}, tokenizer={"kind": "unigram", "vocab_size": 300})
    _, root = configured_corpus(cfg, print)
    assert tokenizer_path(cfg, root).is_file()
    assert not (
        tmp_path / "data" / "tinyshakespeare"
    ).exists()  # not where a Shakespeare run would take it


def test_cli_compare_prints_one_table_and_writes_nothing(cli, tmp_path, slice_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    res = cli("train-tokenizer", "--compare", "--vocab-size", "300", "--input", slice_file)
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("kind"))
    rows = lines[header + 1 : header + 5]
    assert [r.split()[0] for r in rows] == list(KINDS)
    assert all("exact" in r for r in rows)
    assert [r.split()[1] for r in rows[1:]] == ["300"] * 3
    words = [line for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert len(words) == 6
    for word in words:
        block = lines[lines.index(word) + 1 : lines.index(word) + 5]
        assert [b.split()[0] for b in block] == list(KINDS)
    assert sorted(tmp_path.rglob("*")) == before


def test_compare_counts_the_val_split_prepare_makes_and_names_the_kinds_that_lose_text(
    cli, tmp_path, slice_file, monkeypatch
):
    """The val tokens are those of the split prepare encodes, and the round trip is over the whole
    text: a literal ▁ comes back as a space from unigram and wordpiece (they write a space as
    ▁), so theirs is not exact, while char and bpe keep every character."""
    monkeypatch.chdir(tmp_path)
    text = Path(slice_file).read_text(encoding="utf-8") + "\nA ▁ here.\n"
    src = tmp_path / "marked.txt"
    src.write_text(text, encoding="utf-8")
    res = cli("train-tokenizer", "--compare", "--vocab-size", "300", "--input", src)
    assert res.exit_code == 0, res
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[3:7]}
    assert [k for k in KINDS if "NOT exact" in rows[k]] == ["wordpiece", "unigram"], rows
    val_text = split_text(text, 0.1)[1]
    bpe = train_tokenizer("bpe", text, 300, ())
    val_tokens = {k: int(row.split()[2].replace(",", "")) for k, row in rows.items()}
    assert val_tokens["char"] == len(val_text) and val_tokens["bpe"] == len(bpe.encode(val_text))


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--kind", "bpe", "--vocab-size", "300", "--input", "{missing}"], ["does not exist"]),
        (["--kind", "bpe", "--vocab-size", "300", "--input", "{empty}"], ["empty"]),
        (["--kind", "bpe", "--vocab-size", "100", "--input", "{slice}"], ["below", "256"]),
        (["--kind", "wordpiece", "--vocab-size", "50", "--input", "{slice}"], ["below"]),
        (
            ["--kind", "unigram", "--vocab-size", "900000", "--input", "{slice}"],
            ["unigram trainer gave", "fewer than the 900,000", "use a smaller vocabulary size"],
        ),
        (
            ["--kind", "char", "--input", "{slice}", "--output", "{slice}"],
            ["is the text the tokenizer trains on"],
        ),
        (["--kind", "char", "--input", "{latin1}"], ["is not UTF-8 text", "iconv"]),
        (["--kind", "wordpiece", "--vocab-size", "900000", "--input", "{tiny}"], ["at most"]),
        (["--kind", "bpe", "--vocab-size", "900000", "--input", "{tiny}"], ["at most"]),
        (
            ["--kind", "bpe", "--vocab-size", "1000000000", "--input", "{slice}"],
            ["1,000,000,000", "at most 1,048,576"],
        ),
        (
            ["--kind", "sentencepiece", "--vocab-size", "300", "--input", "{slice}"],
            ["unknown tokenizer kind"],
        ),
        (["--kind", "bpe", "--input", "{slice}"], ["--vocab-size"]),
        (["--compare", "--vocab-size", "100", "--input", "{slice}"], ["below"]),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    cli, tmp_path, slice_file, monkeypatch, args, fragments
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("hug pug pun bun hugs\n")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    paths = {
        "missing": tmp_path / "nope.txt",
        "empty": tmp_path / "empty.txt",
        "slice": slice_file,
        "tiny": tmp_path / "tiny.txt",
        "latin1": tmp_path / "latin1.txt",
    }
    before = slice_file.read_bytes()
    out = tmp_path / "out.json"
    args = [a.format(**paths) for a in args]
    if "--compare" not in args and "--output" not in args:
        args += ["--output", str(out)]
    res = cli("train-tokenizer", *args)
    # A shortfall the trainer shows only by training comes after the line saying training started.
    assert_user_error(res, *fragments, notes_ok=True)
    assert all(line.startswith(("training a ", "error: ")) for line in res.stderr.splitlines()), res
    assert not out.exists() and not (tmp_path / "data").exists()
    assert slice_file.read_bytes() == before  # the input is never overwritten


# ----------------------------------------------------------------------------- train and generate
# with BPE


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, data_dir):
    """configs/shakespeare-bpe.yaml, a few steps, through the real CLI; its tokenizer in a private
    file."""
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    work = tmp_path_factory.mktemp("bpe-run")
    tok_path = work / "bpe-1024.json"
    args = [
        "train",
        str(BPE_CONFIG),
        "--run-name",
        "bpe",
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"tokenizer.path={tok_path}",
        "--set",
        f"train.out_dir={work / 'runs'}",
        "--set",
        "train.max_iters=4",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.eval_iters=1",
        "--set",
        "train.log_interval=2",
        "--set",
        "train.sample_tokens=20",
        "--set",
        "model.n_layer=2",
    ]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    return work, tok_path, work / "runs" / "bpe", res


def test_bpe_config_trains_its_tokenizer_first_then_the_model(bpe_run):
    work, tok_path, run, res = bpe_run
    assert res.exit_code == 0, res.stderr
    assert f"tokenizer {tok_path} not found; training a bpe tokenizer" in res.stderr
    assert tok_path.is_file()
    lib = tokenizers.Tokenizer.from_file(str(run / "tokenizer.json"))
    assert lib.get_vocab_size() == 1024 and lib.token_to_id(EOT) == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["vocab_size"] == 1024 and cfg["tokenizer"]["kind"] == "bpe"
    assert (run / "checkpoints" / "last" / "model.safetensors").is_file()


def test_generate_from_a_bpe_run(bpe_run, cli):
    _, _, run, res = bpe_run
    assert res.exit_code == 0, res.stderr
    prompt = f"ROMEO: naïve 😀{EOT}\n"
    gen = cli(
        "generate", "--run", run, "--prompt", prompt, "--max-new-tokens", "20", "--device", "cpu"
    )
    assert gen.exit_code == 0, gen
    assert gen.stdout.startswith(prompt)
    assert "Ġ" not in gen.stdout and "Ċ" not in gen.stdout


def test_streaming_holds_back_partial_utf8(bpe_run, monkeypatch):
    """Byte-level tokens of an emoji decode to '\\ufffd' until the last byte; nothing partial is
    printed."""
    import torch

    from minigpt_cli.sample import generate as gen_mod

    _, _, run, res = bpe_run
    assert res.exit_code == 0, res.stderr
    tok = load_tokenizer(run / "tokenizer.json")
    text = "é😀!👍🏽 ok"
    ids = tok.encode(text)
    assert len(ids) > len(text) - 3  # several bytes per character: partial sequences happen

    def fake_tokens(model, idx, max_new_tokens, *args, **kwargs):
        for i in ids[:max_new_tokens]:
            yield torch.tensor([i])

    monkeypatch.setattr(gen_mod, "generate_tokens", fake_tokens)

    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, s):
            self.writes.append(s)

        def flush(self):
            pass

    out = Recorder()
    texts = gen_mod.generate(
        run,
        {"prompt": "A", "max_new_tokens": len(ids), "temperature": 0.0, "top_k": None},
        seed=0,
        stream=True,
        checkpoint="last",
        device="cpu",
        out=out,
    )
    assert texts == ["A" + text]
    assert "".join(out.writes) == "A" + text + "\n"
    assert not any("\ufffd" in w for w in out.writes)
    assert len(out.writes) > 3  # it did stream


def test_tokenizer_file_must_match_the_checkpoint(bpe_run, cli, tmp_path, small_text):
    _, _, run, res = bpe_run
    assert res.exit_code == 0, res.stderr
    bad_run = tmp_path / "run"
    import shutil

    shutil.copytree(run, bad_run)
    train_tokenizer("bpe", small_text, 2048).save(bad_run / "tokenizer.json")
    before = (bad_run / "tokenizer.json").read_bytes()
    assert_user_error(
        cli("generate", "--run", bad_run, "--prompt", "x", "--max-new-tokens", "2"), "2048", "1024"
    )
    assert (bad_run / "tokenizer.json").read_bytes() == before


def test_a_swapped_tokenizer_of_the_same_kind_and_size_is_refused(
    bpe_run, cli, tmp_path, small_text
):
    _, _, run, res = bpe_run
    assert res.exit_code == 0, res.stderr
    import shutil

    from minigpt_cli.run.folder import META

    bad_run = tmp_path / "run"
    shutil.copytree(run, bad_run)
    own = load_tokenizer(run / "tokenizer.json")
    other = train_tokenizer(
        "bpe", small_text.swapcase(), own.vocab_size
    )  # same kind and size, other merges
    assert other.vocab_size == own.vocab_size and other.fingerprint() != own.fingerprint()
    other.save(bad_run / "tokenizer.json")
    assert_user_error(
        cli("generate", "--run", bad_run, "--prompt", "x", "--max-new-tokens", "2"),
        "not the tokenizer this checkpoint was trained with",
        "restore the run's own tokenizer.json",
    )
    # Checkpoints written before the fingerprint was recorded still load (nothing to compare
    # against).
    for which in ("best", "last"):
        meta_path = bad_run / "checkpoints" / which / META
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            assert meta.pop("tokenizer_fingerprint") == own.fingerprint()
            meta.pop("meta_sha256")  # nor the digest of meta.json's fields, recorded later still
            meta_path.write_text(json.dumps(meta))
    shutil.copy(run / "tokenizer.json", bad_run / "tokenizer.json")
    assert (
        cli("generate", "--run", bad_run, "--prompt", "x", "--max-new-tokens", "2").exit_code == 0
    )
    # A damaged meta.json does not turn the check off: it is named, with the way out.
    meta_path = bad_run / "checkpoints" / "last" / META
    for damaged in (
        "[]",
        "",
        '{"tokenizer_fingerprint": 5}',
        '{"tokenizer_fingerprint": null}',
        None,
    ):
        if damaged is None:
            meta_path.unlink()
        else:
            meta_path.write_text(damaged)
        assert_user_error(
            cli("generate", "--run", bad_run, "--checkpoint", "last", "--prompt", "x"),
            str(meta_path),
            "missing or damaged",
            "--checkpoint best",
        )


def test_config_and_tokenizer_file_must_agree(bpe_run, cli, tmp_path, data_dir):
    _, tok_path, _, res = bpe_run
    assert res.exit_code == 0, res.stderr
    base = [
        "train",
        BPE_CONFIG,
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"tokenizer.path={tok_path}",
        "--set",
        f"train.out_dir={tmp_path / 'runs'}",
    ]
    assert_user_error(cli(*base, "--set", "tokenizer.vocab_size=512"), "1,024", "512")
    assert_user_error(cli(*base, "--set", "tokenizer.kind=unigram"), "bpe", "unigram")
    assert_user_error(cli(*base, "--set", "tokenizer.special_tokens=['<|pad|>']"), "<|pad|>")
    assert not (tmp_path / "runs").exists()


def test_config_with_an_impossible_tokenizer_writes_nothing(cli, tmp_path, data_dir):
    tok_path = tmp_path / "t.json"
    res = cli(
        "train",
        BPE_CONFIG,
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        f"tokenizer.path={tok_path}",
        "--set",
        "tokenizer.vocab_size=100",
        "--set",
        f"train.out_dir={tmp_path / 'runs'}",
    )
    assert_user_error(res, "below", "256", notes_ok=True)
    assert not tok_path.exists() and not (tmp_path / "runs").exists()


def test_special_tokens_in_training_text_become_single_ids(tmp_path):
    docs = [
        "First Citizen:\nBefore we proceed any further, hear me speak.\n",
        "All:\nSpeak, speak.\n",
        "First Citizen:\nYou are all resolved rather to die than to famish?\n",
    ]
    corpus = tmp_path / "docs.txt"
    corpus.write_text(EOT.join(docs * 20), encoding="utf-8")
    for kind in KINDS:
        text = corpus.read_text(encoding="utf-8")
        tok = train_tokenizer(kind, text, base_vocab_size(kind, text, [EOT]) + 5, [EOT])
        eot = tok.encode(EOT)[0]
        data = prepare(corpus, tok, tmp_path / kind, 0.1, log=lambda m: None)
        ids = list(data.train) + list(data.val)
        assert ids.count(eot) == 3 * 20 - 1, kind
        assert tok.decode(ids) == corpus.read_text(encoding="utf-8")


def test_ensure_tokenizer_trains_once_then_loads(tmp_path, small_text):
    from minigpt_cli.config.schema import apply_overrides, validate
    from minigpt_cli.data.pipeline import ensure_tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text(small_text, encoding="utf-8")
    cfg = validate(
        apply_overrides(
            {},
            [
                f"data.data_dir={tmp_path / 'data'}",
                "tokenizer.kind=unigram",
                "tokenizer.vocab_size=300",
                f"tokenizer.special_tokens=['{EOT}']",
            ],
        ),
        "--set",
    )
    logs: list[str] = []
    tok, path = ensure_tokenizer(cfg, corpus, logs.append)
    assert path.parent == tmp_path / "data" / "tinyshakespeare"
    assert path.name.startswith(
        "tokenizer-unigram-300-special-"
    )  # special tokens are part of the name
    assert len(logs) == 1 and "training a unigram tokenizer with 300 entries" in logs[0]
    again, _ = ensure_tokenizer(cfg, corpus, logs.append)
    assert (
        len(logs) == 1
        and again.fingerprint() == tok.fingerprint()
        and again.special_tokens == [EOT]
    )


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_default_tokenizer_files_differ_by_special_tokens(tmp_path, small_text, kind):
    """Configs that differ only in their special tokens train and keep separate files."""
    import hashlib

    from minigpt_cli.config.schema import apply_overrides, validate
    from minigpt_cli.data.pipeline import ensure_tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text(small_text, encoding="utf-8")
    base = [
        f"data.data_dir={tmp_path / 'data'}",
        f"tokenizer.kind={kind}",
        "tokenizer.vocab_size=300",
    ]
    toks, paths = {}, {}
    for specials in ([], [EOT], ["<s>"], ["<s>", EOT], [EOT, "<s>"]):
        cfg = validate(
            apply_overrides({}, base + [f"tokenizer.special_tokens={json.dumps(specials)}"]),
            "--set",
        )
        toks[tuple(specials)], paths[tuple(specials)] = ensure_tokenizer(
            cfg, corpus, lambda m: None
        )
    assert len(set(paths.values())) == len(paths)  # five lists, five files
    for specials, tok in toks.items():
        assert tok.special_tokens == list(specials)  # each config got its own, not another's
        again, _ = ensure_tokenizer(
            validate(
                apply_overrides(
                    {}, base + [f"tokenizer.special_tokens={json.dumps(list(specials))}"]
                ),
                "--set",
            ),
            corpus,
            lambda m: None,
        )
        assert again.fingerprint() == tok.fingerprint()
    size = "" if kind == "char" else "-300"
    assert (
        paths[()].name == f"tokenizer-{kind}{size}.json"
    )  # no special tokens: the name is unchanged
    digest = hashlib.sha256(json.dumps([EOT]).encode()).hexdigest()[:8]
    assert paths[(EOT,)].name == f"tokenizer-{kind}{size}-special-{digest}.json"


def test_the_val_split_never_cuts_a_special_token():
    text = (
        "a" * 85 + EOT + "b" * 20
    )  # the split (106 of 118) falls after the token (85..98): unchanged
    assert split_text(text, 0.1, [EOT]) == split_text(text, 0.1)
    text = "a" * 80 + EOT + "b" * 7  # 90% of 100 = 90, inside the token at 80..93
    train, val = split_text(text, 0.1, [EOT])
    assert train == "a" * 80 and val == EOT + "b" * 7
    assert split_text(text, 0.1) == (
        text[:90],
        text[90:],
    )  # without special tokens: nanoGPT's split


def test_cli_takes_kind_size_and_special_tokens_from_the_config(cli, tmp_path, slice_file):
    out = tmp_path / "t.json"
    res = cli("train-tokenizer", BPE_CONFIG, "--input", slice_file, "--output", out)
    assert res.exit_code == 0, res
    assert "kind                bpe" in res.stdout and "vocabulary size     1,024" in res.stdout
    assert f"{EOT} (id 0)" in res.stdout


def test_text_goes_to_the_trainers_in_pieces_cut_where_gpt2s_split_cuts(small_text):
    """The pieces give the library the same pre-tokens (words) as the whole text, in bounded
    sizes."""
    from tokenizers import pre_tokenizers

    from minigpt_cli.tokenizer.training import _pieces, _word_pre_tokenizer

    text = small_text + "\n  indented line\n\nword  two   spaces x\n" + "z" * 300 + " end"
    pieces = list(_pieces([text], size=100))
    assert "".join(pieces) == text and len(pieces) > 3
    assert all(len(p) <= 100 + 400 for p in pieces)  # cut at the first place past the size
    for pre in (
        _word_pre_tokenizer(),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ):
        whole = [w for w, _ in pre.pre_tokenize_str(text)]
        cut = [w for p in pieces for w, _ in pre.pre_tokenize_str(p)]
        assert cut == whole


def test_ctrl_c_stops_the_libraries_tokenizer_training_at_once(tmp_path):
    """The library trains without the GIL in a worker thread; the main thread stays free for
    signals."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    slow = tmp_path / "a.txt"
    slow.write_text("a" * 300_000)  # one word, no place to cut: BPE merges on it take many seconds
    repo = Path(__file__).resolve().parent.parent
    # The two processes (SIGINT, SIGTERM) run side by side: each pays the start-up once, together.
    cases = []
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / f"{sig.name}.json"
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "minigpt_cli",
                "train-tokenizer",
                str(repo / "configs" / "tiny.yaml"),
                "--kind",
                "bpe",
                "--vocab-size",
                "278",
                "--input",
                str(slow),
                "--output",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        cases.append((sig, code, out, p))
    for _, _, _, p in cases:
        # The status line comes just before training starts: then the command's handlers are in
        # place.
        assert p.stderr.readline().startswith("training a bpe tokenizer of 278 entries on ")
    time.sleep(0.5)  # into the training (a signal sooner must stop it as well)
    for sig, _, _, p in cases:
        p.send_signal(sig)
    # "At once" is read off the CPU time each process used, start-up included, not off a clock: a
    # loaded machine stretches the wall time, not the work. A stopped run used about 1.5 s; the
    # training to its end takes over 60 s of CPU. A process that never stops is killed after 600 s
    # (and fails the bound).
    reaper = threading.Timer(600, lambda: [p.kill() for *_, p in cases])
    reaper.start()
    try:
        for sig, code, out, p in cases:
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
            err = p.stderr.read()
            p.stdout.close(), p.stderr.close()
            assert p.returncode == code, (sig, err)
            assert cpu < 20, (sig, cpu)  # not when training would have ended
            assert not out.exists()
    finally:
        reaper.cancel()


def test_decode_refuses_ids_that_are_not_integers():
    """int(1.7) is 1: a float id would decode silently as another token."""
    from minigpt_cli.tokenizer.kinds import CharTokenizer

    tok = CharTokenizer.train("abc")
    assert (
        tok.decode([0, 1]) == tok.decode(np.array([0, 1])) == tok.decode([np.int64(0), 1]) == "ab"
    )
    for bad in (1.7, True, 2.0):
        with pytest.raises(MinigptError, match="is not an integer"):
            tok.decode([0, bad])
