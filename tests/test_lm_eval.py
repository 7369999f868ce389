"""lm-evaluation-harness on an export, with its defaults: every tokenizer kind has a begin token it
can use, and ``minigpt evaluate --windows lm-eval`` gives its bits per byte."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import tiny  # noqa: E402

from minigpt_cli.eval.evaluate import full_windows, lm_eval_windows  # noqa: E402
from minigpt_cli.hf.export import begin_token, export_run  # noqa: E402
from minigpt_cli.run import folder as runs  # noqa: E402
from minigpt_cli.tokenizer.kinds import load_tokenizer  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()

#: A run of each tokenizer kind, none with an end-of-text token: exports that had no begin token.
KINDS = {
    "char": [],
    "bpe": ["tokenizer.kind=bpe", "tokenizer.vocab_size=300"],
    "wordpiece": ["tokenizer.kind=wordpiece", "tokenizer.vocab_size=300"],
}


@pytest.fixture(scope="module", params=list(KINDS))
def exported(request, tmp_path_factory, data_dir):
    """(run folder, export folder) of a 3-step run of each tokenizer kind."""
    root = tmp_path_factory.mktemp(request.param)
    cfg = tiny(data_dir, "train.max_iters=3", f"train.out_dir={root}/runs", *KINDS[request.param])
    run = train(cfg, "r", echo=lambda m: None, progress=False).run_dir
    return run, export_run(run, root / "hf")


@pytest.fixture(scope="module")
def passage(corpus_file) -> str:
    """About 600 characters of the validation text: many windows of 32 tokens."""
    return corpus_file.read_text(encoding="utf-8")[-700:-100]


def test_lm_evals_windows_are_its_own():
    """:func:`lm_eval_windows` against lm-eval's own ``get_rolling_token_windows``, when installed,
    and against its docstring: every token scored once, no window longer than block_size."""
    try:
        from lm_eval import utils
    except ImportError:  # lm-evaluation-harness is not installed: the docstring's promises only
        utils = None
    for n, T in [(1, 4), (4, 4), (5, 4), (17, 4), (100, 32), (64, 32), (65, 32)]:
        spans = list(lm_eval_windows(n, T))
        scored = [i for b, e, s in spans for i in range(e - s, e)]
        assert scored == list(range(1, n + 1)) and all(e - b - 1 <= T for b, e, _ in spans)
        if utils is not None:
            seq = list(range(1, n + 1))  # token i at index i; the begin token is 0
            theirs = [
                utils.make_disjoint_window(w)
                for w in utils.get_rolling_token_windows(seq, 0, max_seq_len=T, context_len=1)
            ]
            ours = [([*range(n + 1)][b : e - s], [*range(n + 1)][e - s : e]) for b, e, s in spans]
            assert ours == [(list(a), list(b)) for a, b in theirs]
    assert list(full_windows(3, 4, 2)) == [(0, 3, 2)]


def test_every_export_names_a_begin_token_transformers_reads(exported):
    from transformers import AutoTokenizer

    run, out = exported
    tok = load_tokenizer(run / runs.TOKENIZER)
    hf = AutoTokenizer.from_pretrained(out)
    text, i = begin_token(tok)
    assert hf.bos_token_id == i and hf.bos_token == text
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == i
    sample = "To be, or not to be:\nthat is the question."
    ids = hf.encode(sample, add_special_tokens=False)
    assert ids == tok.encode(sample)  # naming the token changed no encoding
    if tok.kind == "char":
        assert text == "\n"  # what came before every document: the blank line between them
        assert hf.decode(ids) == sample


def test_lm_eval_windows_equal_transformers_on_one_window(exported, tmp_path, passage, cli):
    """Text inside one window: lm-eval's score is the export's on the begin token and the text."""
    from transformers import AutoModelForCausalLM

    run, out = exported
    tok = load_tokenizer(run / runs.TOKENIZER)
    text = passage[:20]
    ids = tok.encode(text)
    assert len(ids) <= 32
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    res = cli(
        "evaluate",
        "--run",
        run,
        "--text-file",
        tmp_path / "t.txt",
        "--windows",
        "lm-eval",
        "--json",
    )
    assert res.exit_code == 0, res
    got = json.loads(res.stdout)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[begin_token(tok)[1], *ids[:-1]]])).logits[0].double()
    nats = -logits.log_softmax(-1)[range(len(ids)), ids].sum().item()
    assert got["mode"] == "lm-eval" and got["tokens"] == len(ids)
    assert got["bits_per_byte"] == pytest.approx(nats / math.log(2) / len(text.encode()), abs=1e-6)


TASK = """\
task: minigpt_passage
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: text
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


@pytest.mark.client
@pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-evaluation-harness is not installed (pip install 'minigpt-cli[lm-eval]'; .ci/run does)",
)
def test_lm_eval_runs_every_export_with_its_defaults_and_agrees(exported, tmp_path, passage, cli):
    """``lm_eval --model hf --model_args pretrained=DIR``, no other model argument, offline, on a
    local one-document task: its bits per byte are ``minigpt evaluate --windows lm-eval``'s to
    1e-6."""
    run, out = exported
    (tmp_path / "doc.jsonl").write_text(json.dumps({"text": passage}) + "\n", encoding="utf-8")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "passage.yaml").write_text(TASK.format(data=tmp_path / "doc.jsonl"))
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={out}",
            "--tasks",
            "minigpt_passage",
            "--include_path",
            str(tmp_path / "tasks"),
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    found = next(Path(tmp_path / "results").rglob("results*.json"))
    theirs = json.loads(found.read_text())["results"]["minigpt_passage"]
    (tmp_path / "doc.txt").write_text(passage, encoding="utf-8")
    ours = cli(
        "evaluate",
        "--run",
        run,
        "--text-file",
        tmp_path / "doc.txt",
        "--windows",
        "lm-eval",
        "--json",
    )
    assert ours.exit_code == 0, ours
    ours = json.loads(ours.stdout)
    assert ours["bits_per_byte"] == pytest.approx(theirs["bits_per_byte,none"], abs=1e-6)
    assert 2 ** ours["bits_per_byte"] == pytest.approx(theirs["byte_perplexity,none"], rel=1e-6)
