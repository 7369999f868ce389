"""``minigpt generate``'s sampling controls through the real CLI: --stop, --prompt-file, --prompt -,
--max-new-tokens 0, --top-p, the KV cache switch."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from helpers import assert_user_error, working_dir

from minigpt_cli.generation import find_stop, generate, stop_holdback

TINY = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir):
    """configs/tiny.yaml trained once through the CLI (30 steps, block_size 32), for this module."""
    from typer.testing import CliRunner

    from minigpt_cli.cli import app

    work = tmp_path_factory.mktemp("gen")
    with working_dir(work):
        res = CliRunner().invoke(app, ["train", str(TINY), "--run-name", "g", "--no-progress",
                                       "--set", f"data.data_dir={data_dir}", "--set", "train.sample_tokens=0"])
    assert res.exit_code == 0, res.stderr
    return work / "runs" / "g"


@pytest.fixture
def gen(cli, run_dir):
    def run(*args, input=None):
        return cli("generate", "--run", run_dir, *args, input=input)
    return run


SAMPLING = ("--temperature", "1", "--top-k", "30", "--seed", "7")  # seeded: the same text every time


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
    assert_user_error(cli("generate", "--run", run, "--prompt", "x"), "not found", "copy it back from")


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


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_stop_ends_the_sample_and_is_not_printed(gen, stream):
    full = sampled(gen, n=120)
    new = full[len(PROMPT):-1]
    stop = new[40:43]  # three characters the model does produce
    cut = new.find(stop)
    assert cut >= 10, new  # a stop well inside the text
    res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", stop, stream)
    assert res.exit_code == 0, res
    assert res.stdout == PROMPT + new[:cut] + "\n"
    # Several stops: the earliest occurrence wins; one that never occurs changes nothing.
    other = new[70:72]
    res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING,
              "--stop", other, "--stop", stop, "--stop", "\u00a7never", stream)
    assert res.stdout == PROMPT + new[:min(cut, new.find(other))] + "\n"
    res = gen("--prompt", PROMPT, "--max-new-tokens", "120", *SAMPLING, "--stop", "\u00a7never", stream)
    assert res.stdout == full


def test_stop_only_looks_at_the_new_text(gen):
    """The prompt holds the stop text; generation still runs (and stops only if the model writes it)."""
    full = sampled(gen, n=60)
    new = full[len(PROMPT):-1]
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

    class Recorder(io.StringIO):
        def __init__(self):
            super().__init__()
            self.writes = []

        def write(self, s):
            self.writes.append(s)
            return super().write(s)

    out = Recorder()
    generate(run_dir, {"prompt": PROMPT, "max_new_tokens": 120, "temperature": 1.0, "top_k": 30}, seed=7,
             stream=True, device="cpu", out=out, stop=[stop])
    assert out.getvalue() == PROMPT + text[:cut] + "\n"
    # Writes only append, so a correct end result means no part of the stop text was ever
    # printed: without the hold-back, its first characters would be out before it completes.
    assert len(out.writes) > 5  # it did stream


def sampled_text(run_dir, n):
    out = io.StringIO()
    generate(run_dir, {"prompt": PROMPT, "max_new_tokens": n, "temperature": 1.0, "top_k": 30}, seed=7,
             device="cpu", out=out)
    return out.getvalue()[len(PROMPT):-1]


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
    tiny = gen("--prompt", PROMPT, "--temperature", "1", "--top-p", "1e-9", "--max-new-tokens", "60")
    assert tiny.exit_code == 0 and tiny.stdout == greedy(gen, n=60)
    full = gen("--prompt", PROMPT, "--top-p", "1", "--max-new-tokens", "60", "--seed", "3")
    assert full.exit_code == 0 and len(full.stdout) == len(PROMPT) + 61


def test_sampled_text_is_the_same_with_and_without_the_cache(gen):
    """Seeded sampling, 100 tokens: well past block_size 32, so the window slides."""
    args = ("--prompt", PROMPT, "--max-new-tokens", "100", "--seed", "5", "--temperature", "1", "--top-k", "20")
    a, b = gen(*args), gen(*args, "--no-kv-cache")
    assert a.exit_code == b.exit_code == 0
    assert a.stdout == b.stdout


def test_window_stride(gen, monkeypatch):
    """--window-stride sets how the context slides past block_size 32; both cache paths follow it."""
    for stride in ("1", "32"):
        args = ("--prompt", PROMPT, "--max-new-tokens", "100", "--window-stride", stride, *SAMPLING)
        a, b = gen(*args), gen(*args, "--no-kv-cache")
        assert a.exit_code == b.exit_code == 0, (a, b)
        assert a.stdout == b.stdout
    # The default (block_size // 4 = 8) is what --window-stride 8 gives.
    # The stride reaches the sampler: the default (block_size // 4 = 8) or the option's value.
    import minigpt_cli.generation as gen_mod

    seen = []
    real = gen_mod.generate_tokens

    def spy(*args, **kwargs):
        seen.append(kwargs["window_stride"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gen_mod, "generate_tokens", spy)
    sampled(gen, n=10)
    sampled(gen, "--window-stride", "3", n=10)
    assert seen == [8, 3]
    assert_user_error(gen("--window-stride", "33"), "window_stride 33", "block_size (32)")
    assert_user_error(gen("--window-stride", "0"), "--window-stride")


def test_window_stride_in_the_config_is_checked_against_block_size(tmp_path):
    from minigpt_cli.config import ConfigError, load_config

    cfg = load_config(TINY, ["sample.window_stride=32"])
    assert cfg.sample.window_stride == 32
    with pytest.raises(ConfigError, match="sample.window_stride: 33 is larger than model.block_size"):
        load_config(TINY, ["sample.window_stride=33"])


def test_a_vanishing_temperature_is_greedy(gen):
    """1e-45 overflows logits / T in float32: the limit of T -> 0, greedy, not a crash."""
    for extra in ((), ("--no-kv-cache",)):
        assert sampled(gen, "--temperature", "1e-45", *extra, n=40) == greedy(gen, n=40)
