"""``minigpt generate``'s sampling controls through the real CLI: --stop, --prompt-file, --prompt -,
--max-new-tokens 0, --top-p, the KV cache switch; streaming (incremental decoding for every
  tokenizer kind), the temperature's range, notes about untrained checkpoints and prompts lost to
  <unk>; the static KV cache and the compiled step against the eager paths, and --num-samples as one
  batch."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_user_error, record_checksums, working_dir

from minigpt_cli.cli.base import unescape
from minigpt_cli.sample.generate import TextStream, find_stop, generate, stop_holdback, write_sample

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
PROMPT = "ROMEO:"


class Recorder(io.StringIO):
    """A text stream that also keeps each write."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, s):
        self.writes.append(s)
        return super().write(s)


def train_run(tmp_path_factory, data_dir, name, *sets):
    """configs/tiny.yaml trained through the CLI in a folder of its own, with ``--set`` overrides;
    its run folder."""
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    work = tmp_path_factory.mktemp(name)
    args = [
        "train",
        str(TINY),
        "--run-name",
        name,
        "--no-progress",
        "--set",
        f"data.data_dir={data_dir}",
        "--set",
        "train.sample_tokens=0",
    ]
    with working_dir(work):
        res = CliRunner().invoke(app, args + [a for item in sets for a in ("--set", item)])
    assert res.exit_code == 0, res.stderr
    return work / "runs" / name


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir):
    """configs/tiny.yaml trained once through the CLI (30 steps, block_size 32), for this module."""
    return train_run(tmp_path_factory, data_dir, "g")


@pytest.fixture
def gen(cli, run_dir):
    def run(*args, input=None):
        return cli("generate", "--run", run_dir, *args, input=input)

    return run


SAMPLING = (
    "--temperature",
    "1",
    "--top-k",
    "30",
    "--seed",
    "7",
)  # seeded: the same text every time


def sampled(gen, *args, n=80, prompt=PROMPT):
    res = gen("--prompt", prompt, "--max-new-tokens", str(n), *SAMPLING, *args)
    assert res.exit_code == 0, res
    return res.stdout


def greedy(gen, *args, n=80, prompt=PROMPT):
    res = gen("--prompt", prompt, "--temperature", "0", "--max-new-tokens", str(n), *args)
    assert res.exit_code == 0, res
    return res.stdout


def test_a_missing_or_damaged_run_tokenizer_says_where_a_copy_is(cli, run_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "tokenizer.json").write_text("{}")
    res = cli("generate", "--run", run, "--prompt", "x")
    assert_user_error(res, "is not a minigpt tokenizer", "copy it back from", "tokenizer-char.json")
    assert "train it again" not in res.stderr  # a retrained tokenizer is not the run's
    (run / "tokenizer.json").unlink()
    assert_user_error(
        cli("generate", "--run", run, "--prompt", "x"), "not found", "copy it back from"
    )


def test_generate_never_loads_torch_compile(run_dir):
    """``generate`` in a process of its own leaves torch._dynamo unimported (importing it took 1.9 s,
    half of the command's start on a 2-core Zen 3): measured as imports, not time."""
    code = (
        "import sys; from typer.testing import CliRunner; from minigpt_cli.cli import app;"
        f"r = CliRunner().invoke(app, ['generate', '--run', {str(run_dir)!r}, '--max-new-tokens', '5']);"
        "assert r.exit_code == 0, r.output; print('torch' in sys.modules, 'torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"], out


def test_max_new_tokens_zero_prints_the_prompt_back(gen):
    for prompt in (PROMPT, "To be or not to be " * 5):  # the second is longer than block_size 32
        res = gen("--prompt", prompt, "--max-new-tokens", "0")
        assert res.exit_code == 0, res
        assert res.stdout == prompt + "\n"  # the prompt, then the newline every sample ends with
        assert res.stderr == ""  # no note about cropping: the model was not asked to continue it


def test_prompt_from_a_file_and_from_stdin(gen, tmp_path):
    text = "KING RICHARD III:\nNow is the"
    expected = sampled(gen, prompt=text)
    assert expected.startswith(text) and expected != sampled(gen, prompt="KING")
    f = tmp_path / "prompt.txt"
    f.write_text(text, encoding="utf-8")
    res = gen("--prompt-file", f, "--max-new-tokens", "80", *SAMPLING)
    assert res.exit_code == 0 and res.stdout == expected
    res = gen("--prompt", "-", "--max-new-tokens", "80", *SAMPLING, input=text)
    assert res.exit_code == 0 and res.stdout == expected
    # A file's text is used as is, final newline included.
    f.write_text(text + "\n", encoding="utf-8")
    res = gen("--prompt-file", f, "--max-new-tokens", "0")
    assert res.stdout == text + "\n\n"


def test_prompt_option_errors(gen, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hi")
    assert_user_error(gen("--prompt", "x", "--prompt-file", f), "--prompt", "--prompt-file")
    assert_user_error(gen("--prompt-file", tmp_path / "nope.txt"), "nope.txt", "not found")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    assert_user_error(gen("--prompt-file", bad), "latin1.txt", "UTF-8")
    assert_user_error(gen("--prompt", "-", input=""), "prompt is empty")


@pytest.mark.parametrize(
    "command,option", [("generate", "--prompt-file"), ("evaluate", "--text-file")]
)
def test_a_users_text_file_is_read_alike_by_every_command(cli, run_dir, tmp_path, command, option):
    """generate --prompt-file and evaluate --text-file: one reader, the same one-line errors naming
    the option."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    for path, problem in (
        (tmp_path / "nope.txt", "not found"),
        (tmp_path, "is a folder; give the path of a file"),
        (bad, "is not UTF-8 text (byte 0xe9 at offset 3); convert it"),
    ):
        res = cli(command, "--run", run_dir, option, path)
        assert_user_error(res, f"{option} {str(path)!r} {problem}")


def test_crlf_and_a_byte_order_mark_are_read_alike_by_generate_and_evaluate(cli, run_dir, tmp_path):
    """A Windows editor's file (a BOM, CRLF line endings) reads as the same text as a plain one, for
    --prompt-file and --text-file alike: no '\\r' or '\\ufeff' refused, bits per byte of the text as
      read."""
    text = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east.\n"
    plain, windows = tmp_path / "plain.txt", tmp_path / "windows.txt"
    plain.write_bytes(text.encode("utf-8"))
    windows.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    got = {}
    for f in (plain, windows):
        res = cli("evaluate", "--run", run_dir, "--text-file", f, "--json")
        assert res.exit_code == 0, res
        got[f] = {
            k: v for k, v in json.loads(res.stdout).items() if k not in ("source", "text_file")
        }
    assert got[windows] == got[plain] and got[plain]["bytes"] == len(text.encode("utf-8"))
    outs = [
        cli(
            "generate",
            "--run",
            run_dir,
            "--prompt-file",
            f,
            "--temperature",
            "0",
            "--max-new-tokens",
            "5",
        )
        for f in (plain, windows)
    ]
    assert all(r.exit_code == 0 for r in outs), outs
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.startswith(text)


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_stop_ends_the_sample_and_is_not_printed(gen, stream):
    full = sampled(gen, n=120)
    new = full[len(PROMPT) : -1]
    stop = new[40:43]  # three characters the model does produce
    cut = new.find(stop)
    assert cut >= 10, new  # a stop well inside the text
    res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", stop, stream)
    assert res.exit_code == 0, res
    assert res.stdout == PROMPT + new[:cut] + "\n"
    # Several stops: the earliest occurrence wins; one that never occurs changes nothing.
    other = new[70:72]
    res = gen(
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "120",
        *SAMPLING,
        "--stop",
        other,
        "--stop",
        stop,
        "--stop",
        "\u00a7never",
        stream,
    )
    assert res.stdout == PROMPT + new[: min(cut, new.find(other))] + "\n"
    res = gen(
        "--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", "\u00a7never", stream
    )
    assert res.stdout == full


def test_stop_only_looks_at_the_new_text(gen):
    """The prompt holds the stop text; generation still runs (and stops only if the model writes
    it)."""
    full = sampled(gen, n=60)
    new = full[len(PROMPT) : -1]
    res = gen("--prompt", PROMPT, "--max-new-tokens", "60", *SAMPLING, "--stop", "ROMEO")
    cut = new.find("ROMEO")
    assert res.stdout == (full if cut < 0 else PROMPT + new[:cut] + "\n")
    assert len(res.stdout) > len(PROMPT) + 1


def test_streaming_holds_back_what_may_become_a_stop(run_dir):
    """Writes as they happen: the start of a stop string is never printed before it is known."""
    text = sampled_text(run_dir, 120)
    stop = text[50:54]
    cut = text.find(stop)
    assert cut >= 10, text

    out = Recorder()
    generate(
        run_dir,
        {"prompt": PROMPT, "max_new_tokens": 120, "temperature": 1.0, "top_k": 30},
        seed=7,
        stream=True,
        device="cpu",
        out=out,
        stop=[stop],
    )
    assert out.getvalue() == PROMPT + text[:cut] + "\n"
    # Writes only append, so a correct end result means no part of the stop text was ever
    # printed: without the hold-back, its first characters would be out before it completes.
    assert len(out.writes) > 5  # it did stream


def sampled_text(run_dir, n):
    out = io.StringIO()
    generate(
        run_dir,
        {"prompt": PROMPT, "max_new_tokens": n, "temperature": 1.0, "top_k": 30},
        seed=7,
        device="cpu",
        out=out,
    )
    return out.getvalue()[len(PROMPT) : -1]


def test_stop_helpers():
    assert find_stop("abc\n\nxyz", ["\n\n", "xy"]) == 3
    assert find_stop("abc", ["d"]) == -1
    assert stop_holdback("the KIN", ["KING:", "QUEEN:"]) == 3
    assert stop_holdback("the KING", ["KING:"]) == 4
    assert stop_holdback("the K", ["\n\n"]) == 0
    assert stop_holdback("ab\n", ["\n\n", "b\nc"]) == 2  # the longest candidate counts


def test_empty_stop_is_refused(gen):
    assert_user_error(gen("--stop", ""), "--stop")


def test_top_p(gen):
    assert_user_error(gen("--top-p", "0"), "--top-p", "(0, 1]")
    assert_user_error(gen("--top-p", "1.5"), "--top-p")
    # A tiny nucleus holds only the most likely token: sampling becomes greedy.
    tiny = gen(
        "--prompt", PROMPT, "--temperature", "1", "--top-p", "1e-9", "--max-new-tokens", "60"
    )
    assert tiny.exit_code == 0 and tiny.stdout == greedy(gen, n=60)
    full = gen("--prompt", PROMPT, "--top-p", "1", "--max-new-tokens", "60", "--seed", "3")
    assert full.exit_code == 0 and len(full.stdout) == len(PROMPT) + 61


def test_sampled_text_is_the_same_with_and_without_the_cache(gen):
    """Seeded sampling, 100 tokens: well past block_size 32, so the window slides."""
    args = (
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "100",
        "--seed",
        "5",
        "--temperature",
        "1",
        "--top-k",
        "20",
    )
    a, b = gen(*args), gen(*args, "--no-kv-cache")
    assert a.exit_code == b.exit_code == 0
    assert a.stdout == b.stdout


def test_window_stride(gen, monkeypatch):
    """--window-stride sets how the context slides past block_size 32; both cache paths follow
    it."""
    for stride in ("1", "32"):
        args = ("--prompt", PROMPT, "--max-new-tokens", "100", "--window-stride", stride, *SAMPLING)
        a, b = gen(*args), gen(*args, "--no-kv-cache")
        assert a.exit_code == b.exit_code == 0, (a, b)
        assert a.stdout == b.stdout
    # The default (block_size // 4 = 8) is what --window-stride 8 gives.
    # The stride reaches the sampler: the default (block_size // 4 = 8) or the option's value.
    import minigpt_cli.sample.generate as gen_mod

    seen = []
    real = gen_mod.generate_tokens

    def spy(*args, **kwargs):
        seen.append(kwargs["window_stride"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gen_mod, "generate_tokens", spy)
    sampled(gen, n=10)
    sampled(gen, "--window-stride", "3", n=10)
    assert seen == [8, 3]
    assert_user_error(gen("--window-stride", "33"), "window_stride: 33", "block_size (32)")
    # Past the default config's block_size (256) too, the run's own block_size is the one named.
    assert_user_error(gen("--window-stride", "257"), "window_stride: 257", "block_size (32)")
    assert_user_error(gen("--window-stride", "0"), "--window-stride")


def test_window_stride_in_the_config_is_checked_against_block_size(tmp_path):
    from minigpt_cli.config.schema import ConfigError, load_config

    cfg = load_config(TINY, ["sample.window_stride=32"])
    assert cfg.sample.window_stride == 32
    with pytest.raises(
        ConfigError, match="sample.window_stride: 33 is larger than model.block_size"
    ):
        load_config(TINY, ["sample.window_stride=33"])


def test_a_vanishing_temperature_is_greedy(gen):
    """1e-45 overflows logits / T in float32: the limit of T -> 0, greedy, not a crash."""
    for extra in ((), ("--no-kv-cache",)):
        assert sampled(gen, "--temperature", "1e-45", *extra, n=40) == greedy(gen, n=40)


# ----------------------------------------------------------------------------- the temperature's
# range


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "1e400"])
def test_a_temperature_that_is_not_finite_and_nonnegative_is_refused(gen, value):
    res = gen("--temperature", value, "--max-new-tokens", "5")
    assert_user_error(res, "--temperature", "finite number >= 0")
    assert res.stdout == ""  # refused before the prompt is printed


def test_the_schema_refuses_an_infinite_temperature_on_every_route(run_dir, tmp_path):
    """One check (SampleConfig.temperature) for the Python API, --set and a config file."""
    from minigpt_cli.config.schema import ConfigError, SampleConfig, load_config

    for value in (float("inf"), float("nan")):
        with pytest.raises(
            ConfigError, match="sample.temperature: input should be a finite number"
        ):
            generate(run_dir, {"temperature": value, "max_new_tokens": 1}, device="cpu")
        with pytest.raises(ValueError, match="finite"):
            SampleConfig(temperature=value)
    with pytest.raises(ConfigError, match="sample.temperature"):
        load_config(TINY, ["sample.temperature=.inf"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        TINY.read_text().replace("max_new_tokens: 100", "max_new_tokens: 100\n  temperature: .nan")
    )
    with pytest.raises(ConfigError, match="sample.temperature: input should be a finite number"):
        load_config(cfg)
    # A config built without validation is validated by generate, before anything is printed.
    out = io.StringIO()
    with pytest.raises(ConfigError, match="sample.temperature: input should be a finite number"):
        generate(
            run_dir,
            SampleConfig.model_construct(
                **{**SampleConfig().model_dump(), "temperature": float("inf")}
            ),
            device="cpu",
            out=out,
        )
    assert out.getvalue() == ""


# ----------------------------------------------------------------------------- a run saved at step
# 0


@pytest.fixture(scope="module")
def early_run(tmp_path_factory, data_dir):
    """tiny.yaml stopped at step 0 (the random init), its model vocabulary padded to 128 past the 65
    characters."""
    return train_run(
        tmp_path_factory, data_dir, "early", "train.max_iters=0", "model.vocab_size=128"
    )


UNTRAINED = "checkpoint is untrained (saved at step 0, its weights are the random init)"


def test_an_untrained_checkpoint_is_said_plainly(cli, early_run, run_dir, monkeypatch):
    for args in (("--run", early_run), ()):  # named, or picked as the newest run
        monkeypatch.chdir(early_run.parent.parent)
        res = cli("generate", *args, "--prompt", PROMPT, "--max-new-tokens", "20")
        assert res.exit_code == 0, res
        notes = res.stderr.splitlines()
        assert sum(UNTRAINED in line for line in notes) == 1, notes
        assert ("using runs/early (checkpoint best, step 0)" in notes) == (args == ())
    trained = cli("generate", "--run", run_dir, "--prompt", PROMPT, "--max-new-tokens", "5")
    assert trained.exit_code == 0 and "untrained" not in trained.stderr


@pytest.mark.parametrize("temperature", ["1", "1e30", "1e-46"])
def test_a_padded_model_vocabulary_never_yields_a_padding_id(cli, early_run, temperature):
    """Model vocabulary 128, tokenizer 65: a random model at T = 1e30 is uniform over what it may
    sample; ids 65..127 would make decode refuse the text. 300 tokens decode, and many different
    characters appear."""
    res = cli(
        "generate",
        "--run",
        early_run,
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "300",
        "--temperature",
        temperature,
        "--top-k",
        "200",
    )
    assert res.exit_code == 0, res
    new = res.stdout[len(PROMPT) : -1]
    assert len(new) == 300
    if temperature == "1e30":
        assert len(set(new)) > 40
    assert_user_error(
        cli("generate", "--run", early_run, "--temperature", "inf"), "--temperature inf", "finite"
    )


# ----------------------------------------------------------------------------- prompts lost to
# <unk>


@pytest.fixture(scope="module")
def unigram_run(tmp_path_factory, data_dir):
    """tiny.yaml on a 300-entry Unigram tokenizer (a file of its own), stopped at step 0 (the note
    is about the prompt), on the corpus's first 200,000 characters: the notes need a vocabulary
    without '¿', 'é' and '😀', not the 3 s that Unigram trains on the whole corpus."""
    folder = tmp_path_factory.mktemp("unigram-tokenizer")
    text = folder / "plays.txt"
    text.write_text((data_dir / "tinyshakespeare" / "input.txt").read_text()[:200_000])
    return train_run(
        tmp_path_factory,
        data_dir,
        "uni",
        "train.max_iters=0",
        "tokenizer.kind=unigram",
        "tokenizer.vocab_size=300",
        f"tokenizer.path={folder / 'unigram-300.json'}",
        f"data.path={text}",
    )


def test_a_prompt_partly_lost_to_unk_is_noted(cli, unigram_run):
    prompt = "ROMEO: ¿Qué tal? 😀"
    res = cli("generate", "--run", unigram_run, "--prompt", prompt, "--max-new-tokens", "5")
    assert res.exit_code == 0, res
    assert (
        "note: 3 characters of the prompt became <unk>: '¿', 'é', '😀'" in res.stderr.splitlines()
    )
    assert res.stdout.startswith(prompt)  # printed as given
    plain = cli(
        "generate", "--run", unigram_run, "--prompt", "ROMEO: what?", "--max-new-tokens", "5"
    )
    assert plain.exit_code == 0 and "<unk>" not in plain.stderr


# ----------------------------------------------------------------------------- streaming


@pytest.fixture(scope="module")
def tokenizers_by_kind(corpus_file):
    """One tokenizer of each kind, 400 entries, on the corpus's first 60,000 characters, with
    <|endoftext|>."""
    from minigpt_cli.tokenizer.kinds import KINDS
    from minigpt_cli.tokenizer.training import train_tokenizer

    text = corpus_file.read_text(encoding="utf-8")[:60_000]
    return {k: train_tokenizer(k, text, 400, ["<|endoftext|>"]) for k in KINDS}


#: Spaces (▁ in Unigram and WordPiece), WordPiece ## continuations, a special token, newlines; for bpe,
#: characters of 2 to 4 bytes split across byte-level tokens.
STREAM_TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.<|endoftext|>\n\n"
    "All:\nSpeak, speak.  wherefore  art thou"
)
BPE_EXTRA = " naïve café 😀👍🏽 ✨ ok"


def _streamed(tok, ids, stops=(), stream=True):
    out = Recorder()
    text = write_sample(tok, iter(ids), list(stops), out, stream)
    assert out.writes[-1].endswith("\n")
    return text, out.writes


@pytest.mark.parametrize("kind", ["char", "bpe", "wordpiece", "unigram"])
def test_streamed_text_equals_the_text_decoded_at_once(tokenizers_by_kind, kind):
    import random

    tok = tokenizers_by_kind[kind]
    text = STREAM_TEXT + (BPE_EXTRA if kind == "bpe" else "")
    ids = tok.encode(text)
    if kind == "bpe":
        assert "\ufffd" in tok.decode(
            ids[: ids.index(tok.encode("😀")[0]) + 1]
        )  # a character split across tokens
    if kind == "wordpiece":
        assert any(p.startswith("##") for p in tok.pieces(text))
    whole = tok.decode(ids)
    rng = random.Random(0)
    cases = [
        ids,
        [rng.randrange(tok.vocab_size) for _ in range(300)],
    ]  # also ids no text would give
    for case in cases:
        whole = tok.decode(case)
        got, writes = _streamed(tok, case)
        assert got == whole and "".join(writes) == whole + "\n"
        assert len(writes) > len(case) // 3  # it streamed
        stream = TextStream(tok)
        pieces = [stream.push(i) for i in case]
        assert "".join(pieces) == whole[: len("".join(pieces))]  # pieces only append
        if "\ufffd" not in whole:
            assert not any("\ufffd" in w for w in writes) and "".join(pieces) == whole
    # Stop strings: streamed, not streamed and the whole text cut at the earliest stop agree.
    whole = tok.decode(ids)
    for start, length in ((3, 1), (20, 4), (60, 2), (len(whole) - 3, 3)):
        stop = whole[start : start + length]
        other = whole[start // 2 : start // 2 + 2]
        expected = whole[: min(whole.find(stop), whole.find(other))]
        for stream in (True, False):
            got, writes = _streamed(tok, ids, [stop, other], stream)
            assert got == expected and "".join(writes) == expected + "\n", (stop, other, stream)
    assert _streamed(tok, ids, ["\u00a7never"])[0] == whole


def test_streaming_work_grows_linearly(tokenizers_by_kind, monkeypatch):
    """4,000 tokens streamed with a stop string: ids decoded and characters searched stay a few per
    token (decoding everything again at every step would be about n²/2 = 8 million)."""
    import minigpt_cli.sample.generate as gen_mod

    tok = tokenizers_by_kind["bpe"]
    ids = (tok.encode(STREAM_TEXT + BPE_EXTRA) * 200)[:4000]
    decoded, searched = [], []
    real_decode, real_find = tok.decode, gen_mod.find_stop
    monkeypatch.setattr(
        tok, "decode", lambda batch: decoded.append(len(batch)) or real_decode(batch)
    )
    monkeypatch.setattr(
        gen_mod,
        "find_stop",
        lambda text, stops: searched.append(len(text)) or real_find(text, stops),
    )
    text, _ = _streamed(tok, ids, ["\u00a7 never \u00a7"])
    assert text == real_decode(ids)
    assert sum(decoded) - len(ids) < 5 * len(
        ids
    )  # the final decode of all ids, and a few per token
    assert sum(searched) < 15 * len(ids)


def test_stop_escapes(gen):
    assert (
        unescape(r"\n\n") == "\n\n"
        and unescape(r"a\tb\\n") == "a\tb\\n"
        and unescape(r"\x\\") == "\\x\\"
    )
    assert unescape("ROMEO:") == "ROMEO:" and unescape("\\") == "\\"
    full = sampled(gen, n=120)
    new = full[len(PROMPT) : -1]
    cut = new.find("\n")
    assert cut >= 0, new
    for stream in ("--stream", "--no-stream"):
        res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", r"\n", stream)
        assert res.exit_code == 0 and res.stdout == PROMPT + new[:cut] + "\n", res


def test_a_prompt_that_is_not_utf8_is_one_line(gen):
    res = gen("--prompt", "ab\udcffcd", "--max-new-tokens", "3")
    assert_user_error(res, "the prompt is not UTF-8 text (byte 0xff at character 2)", "iconv")


def test_a_temperature_beyond_float32_samples_valid_ids():
    """1e39 is finite but infinite in float32: -inf / inf would be NaN for a masked entry."""
    from minigpt_cli.sample.sampling import sample_next

    logits = torch.tensor([[1.0, 2.0, float("-inf")]] * 4)
    ids = sample_next(logits, 1e39, None, None, torch.Generator().manual_seed(0))
    assert ((ids == 0) | (ids == 1)).all()


# ----------------------------------------------------------------------------- issue 18: notes,
# escapes, prompts


def _notes(res, fragment):
    assert res.exit_code == 0, res
    return [
        line for line in res.stderr.splitlines() if line.startswith("note: ") and fragment in line
    ]


def test_greedy_flags_get_the_note_the_config_route_gives(gen):
    res = gen(
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "5",
        "--temperature",
        "0",
        "--top-k",
        "5",
        "--top-p",
        "0.5",
    )
    assert _notes(res, "greedy") == [
        "note: --top-k has no effect with --temperature 0: greedy decoding always takes the likeliest token",
        "note: --top-p has no effect with --temperature 0: greedy decoding always takes the likeliest token",
    ]
    assert (
        _notes(gen("--prompt", PROMPT, "--max-new-tokens", "5", "--temperature", "0"), "greedy")
        == []
    )
    assert _notes(gen("--prompt", PROMPT, "--max-new-tokens", "5", "--top-k", "5"), "greedy") == []


def test_a_window_stride_the_window_never_reaches_is_noted(gen):
    """block_size 32, a 6-token prompt: the window slides after the 27th new token, so the 28th is
    the first one a stride changes."""
    outputs = {}
    for n in (27, 28):
        for stride in ("1", "3"):
            res = gen(
                "--prompt", PROMPT, "--max-new-tokens", str(n), "--window-stride", stride, *SAMPLING
            )
            notes = _notes(res, "--window-stride")
            assert len(notes) == (n == 27), (n, notes)
            outputs[n, stride] = res.stdout
    assert (
        outputs[27, "1"] == outputs[27, "3"]
    )  # what the note says: the stride changes nothing there
    assert (
        _notes(gen("--prompt", PROMPT, "--max-new-tokens", "27", *SAMPLING), "window") == []
    )  # not asked for
    assert (
        "the prompt (6 token(s)) followed by --max-new-tokens 27"
        in _notes(
            gen("--prompt", PROMPT, "--max-new-tokens", "27", "--window-stride", "3"), "window"
        )[0]
    )


def test_stop_takes_the_escapes_the_help_names(gen):
    new = sampled(gen, n=120)[len(PROMPT) : -1]
    c = next((ch for ch in new if ch != new[0]), new[0])
    cut = new.find(c)
    for spelled in (f"\\u{ord(c):04x}", f"\\U{ord(c):08x}", f"\\x{ord(c):02x}", f"\\{ord(c):o}"):
        res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", spelled)
        assert res.exit_code == 0 and res.stdout == PROMPT + new[:cut] + "\n", (spelled, res)
    assert unescape(r"\u00e9\x41\xc3\xa9\101\q\\") == "éAéA\\q\\"
    assert_user_error(
        gen("--prompt", PROMPT, "--stop", "\\xe9"), "--stop '\\xe9'", "not UTF-8 text", "\\u00e9"
    )


def test_a_stop_the_vocabulary_cannot_spell_is_noted(gen):
    for spelled in ("é", "\\u00e9", "ROMEO é"):
        res = gen("--prompt", PROMPT, "--max-new-tokens", "5", "--stop", spelled)
        assert _notes(res, "--stop") == [
            f"note: --stop {unescape(spelled)!r} can never match: the tokenizer's "
            "vocabulary lacks 'é', so the model never writes it"
        ]
    assert _notes(gen("--prompt", PROMPT, "--max-new-tokens", "5", "--stop", "\\n"), "--stop") == []


def test_the_configs_prompt_gets_the_line_train_gives(run_dir, cli, tmp_path):
    """A run whose sample.prompt the tokenizer lacks (train now refuses it; a config edited later):
    generate without --prompt refuses it with train's line (tests/test_hardening.py)."""
    import shutil

    import yaml

    run = tmp_path / "edited"
    shutil.copytree(run_dir, run)
    for which in ("best", "last"):
        path = run / "checkpoints" / which / "config.yaml"
        cfg = yaml.safe_load(path.read_text())
        cfg["sample"]["prompt"] = "Café"
        path.write_text(yaml.safe_dump(cfg))
        record_checksums(path.parent)  # an edit, not damage: the checksum follows it
    assert_user_error(
        cli("generate", "--run", run),
        "sample.prompt has characters the tokenizer's vocabulary "
        "lacks: 'é'; remove or replace them",
    )
    assert_user_error(cli("generate", "--run", run, "--prompt", "Ça"), "the prompt has characters")


def test_a_prompt_that_will_not_come_back_as_typed_is_noted(cli, unigram_run, tokenizers_by_kind):
    from minigpt_cli.tokenizer.kinds import lossy_report

    res = cli(
        "generate",
        "--run",
        unigram_run,
        "--prompt",
        "ROMEO: a\u2581b <unk>",
        "--max-new-tokens",
        "3",
    )
    assert _notes(res, "the prompt's") == [
        "note: the prompt's '\u2581' (U+2581) becomes a space (unigram writes a space as '\u2581'); the prompt's "
        "'<unk>' is read as the unknown token (one id), not as its 5 characters"
    ]
    assert lossy_report(tokenizers_by_kind["wordpiece"], "word" * 300) == (
        "note: the prompt does not come back as typed: it decodes as '<unk>'"
    )  # past WordPiece's longest word
    for kind in ("bpe", "char", "unigram", "wordpiece"):
        assert lossy_report(tokenizers_by_kind[kind], "ROMEO: what, ho!") is None
    for kind in ("bpe", "char"):  # a byte for byte round trip; char refuses what it lacks instead
        assert lossy_report(tokenizers_by_kind[kind], "a\u2581b <unk>") is None


# ----------------------------------------------------------------------------- issue 19: static
# cache, compiled step, batches


def _model(sharpen=True, **kw):
    from minigpt_cli.config.schema import ModelConfig
    from minigpt_cli.model.gpt import GPT

    torch.manual_seed(0)
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=12, vocab_size=65, dropout=0.0)
    model = GPT(ModelConfig(**{**base, **kw})).eval()
    if sharpen:  # so that greedy choices are not near-ties
        with torch.no_grad():
            model.lm_head.weight.mul_(20)
    return model


def _decode(model, prompt, mode, temperature, top_p, stride, monkeypatch, n=30, per_row=False):
    """The tokens (B, n) and the logits each step sampled from (n, B, V) of one path: uncached,
    cached (the growing KVCache), static (the StaticKVCache, eager step) or compiled (its step
    through torch.compile, with the aot_eager backend: see
    test_the_compiled_step_decodes_like_eager)."""
    import minigpt_cli.sample.sampling as sampling
    from minigpt_cli.sample.decoding import StaticDecoder
    from minigpt_cli.sample.sampling import generate_tokens

    seen = []
    real = sampling.sample_next
    monkeypatch.setattr(
        sampling, "sample_next", lambda logits, *a: seen.append(logits.clone()) or real(logits, *a)
    )
    rows = prompt.size(0)
    g = (
        [torch.Generator().manual_seed(7 + i) for i in range(rows)]
        if per_row
        else torch.Generator().manual_seed(7)
    )
    decoder = (
        StaticDecoder(model, rows, compile=mode == "compiled", backend="aot_eager")
        if mode in ("static", "compiled")
        else None
    )
    toks = generate_tokens(
        model,
        prompt,
        n,
        temperature=temperature,
        top_p=top_p,
        use_cache=mode != "uncached",
        generator=g,
        window_stride=stride,
        decoder=decoder,
    )
    out = torch.stack(list(toks), dim=1)
    monkeypatch.setattr(sampling, "sample_next", real)
    return out, torch.stack(seen)


#: Greedy and seeded sampling, each with another window stride (1: nanoGPT's slide; None: block_size
#: // 4 = 3).
MODES = ((0.0, None, 1), (1.0, None, None), (1.0, 0.9, 5))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
@pytest.mark.parametrize(
    "switch",
    [
        {},
        dict(norm="rmsnorm", norm_position="post"),
        dict(n_kv_head=1, ffn="swiglu", multiple_of=16, tie_weights=False),
    ],
    ids=["layernorm-pre", "rmsnorm-post", "gqa-swiglu-untied"],
)
def test_the_static_cache_decodes_like_the_other_paths(pos, switch, monkeypatch):
    """The static cache's step (eager here; compiled below) gives the tokens of the growing cache
    and of no cache, greedy and seeded, 5 + 30 tokens through a block of 12 (the window slides), and
    the logits each step samples from agree to float32 rounding (equal tokens alone could hide a
    drift)."""
    model = _model(pos_encoding=pos, **switch)
    prompt = torch.randint(0, 65, (2, 5))
    for temperature, top_p, stride in MODES:
        # Uncached against cached for every switch is test_variants' test; here once, for the greedy
        # mode.
        paths = ("cached", "static", "uncached") if temperature == 0 else ("cached", "static")
        runs = {
            m: _decode(model, prompt, m, temperature, top_p, stride, monkeypatch) for m in paths
        }
        tokens, logits = runs["cached"]
        assert tokens.shape == (2, 30)
        for mode in paths[1:]:
            assert torch.equal(runs[mode][0], tokens), (mode, temperature, top_p)
            assert (runs[mode][1] - logits).abs().max().item() < 1e-5, (mode, temperature, top_p)


def test_the_compiled_step_decodes_like_eager(monkeypatch):
    """torch.compile of the one-token step (fullgraph, static shapes) on one tiny variant (RoPE,
    RMSNorm, grouped-query attention, one layer): the tokens of the eager paths, greedy and seeded.

    The backend is aot_eager: Dynamo captures the step and AOTAutograd functionalizes its in-place
    cache writes, as for Inductor, but the graph runs on eager kernels. Inductor's C++ compile of
    this model takes 7 s here with a warm cache and about 20 s cold, over this file's budget;
    test_trainer's test_compile_trains_like_eager_on_cpu runs Inductor on the CPU, and ``minigpt
    bench`` (compile on) and scripts/gpu-check.sh compare Inductor's decoded tokens with the eager
    cache's (``gen_compiled_tokens_equal``)."""
    model = _model(pos_encoding="rope", norm="rmsnorm", n_kv_head=2, n_layer=1)
    prompt = torch.randint(0, 65, (2, 5))
    for temperature, top_p, stride in MODES[:2]:
        compiled, logits = _decode(
            model, prompt, "compiled", temperature, top_p, stride, monkeypatch
        )
        for mode in ("cached", "uncached"):
            tokens, eager_logits = _decode(
                model, prompt, mode, temperature, top_p, stride, monkeypatch
            )
            assert torch.equal(compiled, tokens), (mode, temperature)
            assert (logits - eager_logits).abs().max().item() < 1e-4, (mode, temperature)


def test_a_batch_row_is_the_single_sample_of_its_seed(monkeypatch):
    """Rows with a generator each: row i of a batch draws what a batch of one with that generator
    draws (the window slides for all rows at once, as for one); the paths agree on the batch too."""
    from minigpt_cli.sample.sampling import generate_tokens

    model = _model(sharpen=False, pos_encoding="rope", n_kv_head=2)  # near uniform: the rows differ
    prompt = torch.randint(0, 65, (1, 5)).expand(3, -1)
    for mode in ("cached", "static", "uncached"):
        batch, _ = _decode(model, prompt, mode, 1.0, None, None, monkeypatch, per_row=True)
        for i in range(3):
            g = torch.Generator().manual_seed(7 + i)
            single = torch.stack(
                list(
                    generate_tokens(
                        model,
                        prompt[:1],
                        30,
                        temperature=1.0,
                        generator=g,
                        use_cache=mode != "uncached",
                    )
                ),
                dim=1,
            )
            assert torch.equal(batch[i : i + 1], single), (mode, i)
        assert len({tuple(r) for r in batch.tolist()}) == 3  # three different samples


#: Tensor methods that hand a value to the host: on a GPU each waits for the device.
HOST_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"}


def _host_reads(tokens) -> tuple[int, list[torch.Tensor]]:
    """The host reads of tensor values (:data:`HOST_READS`) made while the iterator ``tokens`` is
    drained, and what it yields."""
    from torch.overrides import TorchFunctionMode

    reads = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in HOST_READS:
                reads.append(func.__name__)
            return func(*args, **(kwargs or {}))

    out = []
    with Count():
        for t in tokens:  # what the caller does with a token is its own read, not counted
            out.append(t)
    return len(reads), out


@pytest.mark.parametrize("mode", ["cached", "static", "uncached"])
def test_decoding_reads_the_device_once_per_read_of_its_tokens(mode):
    """Issue 36: the loop stays on the device between the reads of the tokens. One sample (which may
    be streamed) is read once per token, not three times (the logits' finite check, the sampled ids'
    range check and the ids themselves travel in one read); a batch of 3 every READ_EVERY tokens."""
    from minigpt_cli.sample.decoding import StaticDecoder
    from minigpt_cli.sample.sampling import READ_EVERY, generate_tokens

    model = _model(pos_encoding="rope")
    prompt = torch.randint(0, 65, (3, 5))
    for rows, n, temperature in ((1, 20, 1.0), (3, 40, 1.0), (3, 40, 0.0)):
        decoder = StaticDecoder(model, rows) if mode == "static" else None
        gens = [torch.Generator().manual_seed(i) for i in range(rows)]
        reads, toks = _host_reads(
            generate_tokens(
                model,
                prompt[:rows],
                n,
                temperature,
                top_k=20,
                use_cache=mode != "uncached",
                generator=gens,
                vocab_limit=60,
                decoder=decoder,
            )
        )
        assert len(toks) == n and all(t.shape == (rows,) for t in toks)
        assert reads == (n if rows == 1 else -(-n // READ_EVERY)), (rows, n, reads)


@pytest.mark.parametrize("rows", [1, 3])
def test_an_overflow_is_refused_at_its_step_after_the_tokens_before_it(rows, monkeypatch):
    """The finite check is read with the tokens, yet it refuses at the step that overflowed: the
    tokens before it are handed out (a streamed sample printed them), none after, for one row as for
    a batch read in chunks."""
    from minigpt_cli.errors import MinigptError
    from minigpt_cli.sample.decoding import CachedDecoder
    from minigpt_cli.sample.sampling import generate_tokens

    model = _model(pos_encoding="rope")
    prompt = torch.randint(0, 65, (rows, 5))
    clean = list(generate_tokens(model, prompt, 8, 0.0))
    real = CachedDecoder.step

    def overflowing(self, token, position):  # the 6th token's logits (window position 9) are NaN
        logits = real(self, token, position)
        return logits.fill_(float("nan")) if position == 9 else logits

    monkeypatch.setattr(CachedDecoder, "step", overflowing)
    got = []
    with pytest.raises(MinigptError, match="the model's output is NaN"):
        for t in generate_tokens(model, prompt, 8, 0.0):
            got.append(t)
    assert len(got) == 5 and all(torch.equal(a, b) for a, b in zip(got, clean))


def test_num_samples_is_one_batch_whose_samples_are_the_seeds_single_samples(run_dir, monkeypatch):
    """--num-samples 3 --seed 7: sample i is the single sample of seed 7 + i - 1 (what --help says),
    past block_size 32, each cut at its own stop; the batch is decoded once (one generate_tokens of
    3 rows) and written at the end, not streamed; beyond MAX_BATCH samples, in several batches."""
    import minigpt_cli.sample.generate as gen_mod

    calls = []
    real = gen_mod.generate_tokens

    def spy(model, idx, *args, **kwargs):
        calls.append(idx.size(0))
        return real(model, idx, *args, **kwargs)

    monkeypatch.setattr(gen_mod, "generate_tokens", spy)
    settings = {"prompt": PROMPT, "max_new_tokens": 100, "temperature": 1.0, "top_k": 30}
    singles = [generate(run_dir, settings, seed=7 + i, device="cpu") for i in range(3)]
    assert calls == [1, 1, 1] and len({s[0] for s in singles}) == 3
    out = Recorder()
    texts = generate(
        run_dir, {**settings, "num_samples": 3}, seed=7, device="cpu", stream=True, out=out
    )
    assert calls[3:] == [3]
    assert texts == [s[0] for s in singles]
    assert out.getvalue() == "".join(
        f"{'-' * 20} sample {i + 1} {'-' * 20}\n{t}\n" for i, t in enumerate(texts)
    )
    assert (
        len(out.writes) == 6
    )  # a header with the prompt, then the rest, per sample: nothing streamed
    # Stops: each sample ends at its own first occurrence, as it does alone.
    stop = texts[0][len(PROMPT) + 20 : len(PROMPT) + 22]
    cut = [generate(run_dir, settings, seed=7 + i, device="cpu", stop=[stop])[0] for i in range(3)]
    assert (
        generate(run_dir, {**settings, "num_samples": 3}, seed=7, device="cpu", stop=[stop]) == cut
    )
    assert len(cut[0]) == len(PROMPT) + 20 and len({len(t) for t in cut}) > 1
    # More samples than a batch holds: batches of MAX_BATCH, one after another, the same samples.
    monkeypatch.setattr(gen_mod, "MAX_BATCH", 2)
    del calls[:]
    assert generate(
        run_dir, {**settings, "num_samples": 3}, seed=7, device="cpu"
    ) == texts and calls == [2, 1]


def test_compile_flag_routes_through_the_static_decoder(gen, monkeypatch):
    """--compile decodes through the compiled step (here a stand-in for torch.compile, which the
    test above runs for real) with the same text as the eager cache; it needs the cache; a compile
    failure warns and decodes eagerly; the default on a CPU is off."""
    import minigpt_cli.sample.decoding as decoding

    modes = []

    def fake_compiled_step(mode, backend):
        modes.append((mode, backend))
        return decoding._step

    monkeypatch.setattr(decoding, "compiled_step", fake_compiled_step)
    eager = sampled(gen, n=100)
    assert modes == []  # off by default on a CPU
    res = gen("--prompt", PROMPT, "--max-new-tokens", "100", *SAMPLING, "--compile")
    assert res.exit_code == 0 and res.stdout == eager
    assert modes == [(None, "inductor")]  # Inductor in its default mode on a CPU (no CUDA graphs)
    assert "compiling the one-token decoding step" in res.stderr
    res = gen(
        "--prompt", PROMPT, "--max-new-tokens", "100", *SAMPLING, "--compile", "--num-samples", "2"
    )
    assert res.exit_code == 0 and res.stdout.split("\n", 1)[1].startswith(eager)
    assert _notes(
        gen("--prompt", PROMPT, "--max-new-tokens", "5", "--compile", "--no-kv-cache"), "--compile"
    ) == ["note: --compile has no effect with --no-kv-cache: it compiles the cached one-token step"]

    def broken(mode, backend):
        def step(*args):
            raise RuntimeError("no C++ compiler here")

        return step

    monkeypatch.setattr(decoding, "compiled_step", broken)
    res = gen("--prompt", PROMPT, "--max-new-tokens", "100", *SAMPLING, "--compile")
    assert res.exit_code == 0 and res.stdout == eager
    assert (
        "warning: torch.compile failed (RuntimeError: no C++ compiler here); decoding without it"
        in res.stderr
    )


def test_dtype_bfloat16_decodes_in_bfloat16(gen, run_dir, monkeypatch):
    """--dtype bfloat16: the logits the sampler sees come from bfloat16 weights; the text is
    reproducible and as long as asked; an unknown dtype is refused in one line."""
    import minigpt_cli.sample.sampling as sampling

    dtypes = []
    real = sampling.sample_next
    monkeypatch.setattr(
        sampling, "sample_next", lambda logits, *a: dtypes.append(logits.dtype) or real(logits, *a)
    )
    a = sampled(gen, "--dtype", "bfloat16", n=60)
    assert set(dtypes) == {torch.bfloat16} and len(dtypes) == 60
    assert a == sampled(gen, "--dtype", "bfloat16", n=60) and len(a) == len(PROMPT) + 61
    dtypes.clear()
    sampled(gen, n=5)
    assert set(dtypes) == {torch.float32}
    assert_user_error(gen("--dtype", "float16"), "--dtype float16", "'float32', 'bfloat16'")


@pytest.mark.parametrize(
    "seed,bound",
    [
        ("-1", "greater than or equal to 0"),
        (str(2**63), "less than or equal to 9223372036854775807"),
    ],
)
def test_a_seed_outside_0_to_2_63_is_refused_by_the_option(gen, seed, bound):
    assert_user_error(gen("--seed", seed, "--max-new-tokens", "5"), f"--seed {seed}", bound)
