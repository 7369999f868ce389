"""Every shipped config's run, exported, runs in transformers as it runs in minigpt: the same
logits, the default pipeline within the context, the same greedy tokens; and ``generate`` ends at
end-of-text as transformers does.

Each config trains 2 steps at a tiny size (``SHRINK``: 1 layer, 32 wide, block 16), its architecture
switches kept. transformers is the oracle, in this process for the logits and in one fresh process
for the pipelines.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from minigpt_cli.config.schema import load_config  # noqa: E402
from minigpt_cli.hf.export import export_run, hf_state_dict, hf_target  # noqa: E402
from minigpt_cli.hf.load import load_hf_folder  # noqa: E402
from minigpt_cli.sample.generate import generate  # noqa: E402
from minigpt_cli.sample.load import load_run  # noqa: E402
from minigpt_cli.trainer import train  # noqa: E402

transformers.logging.set_verbosity_error()

#: The shipped configs and the target each exports as.
SHIPPED = {
    "shakespeare-cpu": "gpt_neox",
    "shakespeare": "gpt2",
    "shakespeare-gpt2": "gpt2",
    "shakespeare-llama": "llama",
    "shakespeare-bpe": "gpt2",
    "tiny": "gpt2",
}
SHRINK = [
    "model.n_layer=1",
    "model.n_head=4",
    "model.n_embd=32",
    "model.block_size=16",
    "tokenizer.vocab_size=300",
    "train.max_iters=2",
    "train.batch_size=4",
    "train.eval_iters=1",
    "train.eval_interval=2",
    "train.sample_tokens=0",
    "device=cpu",
]
PROMPT, NEW = "ROMEO:", 8  # 6 characters and 8 new tokens: within the 16-token context

#: What the fresh process does with each folder: the pipeline and ``generate`` with their defaults,
#: then greedy.
_HF_SCRIPT = """
import json, os, sys
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
transformers.logging.set_verbosity_error()
transformers.set_seed(0)
out = {}
for folder, prompt, new in json.loads(sys.argv[1]):
    pipe = pipeline("text-generation", model=folder)
    tok, model = pipe.tokenizer, pipe.model
    default = pipe(prompt)[0]["generated_text"]
    ids = model.generate(**tok(prompt, return_tensors="pt"))[0].tolist()
    greedy = pipe(prompt, do_sample=False, max_new_tokens=new)[0]["generated_text"]
    ended = ids[-1] == model.generation_config.eos_token_id
    out[folder] = {"default": default, "length": len(ids), "ended": ended, "greedy": greedy}
print(json.dumps(out), flush=True)
os._exit(0)  # without the interpreter's teardown of torch and transformers (about a second)
"""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, data_dir):
    """{config name: (run folder, export folder, echoed lines)}, one 2-step run of each."""
    root = tmp_path_factory.mktemp("shipped")
    made = {}
    for name in SHIPPED:
        cfg = load_config(
            name, [*SHRINK, f"data.data_dir={data_dir}", f"train.out_dir={root}/runs"]
        )
        run = train(cfg, name, echo=lambda m: None, progress=False).run_dir
        lines: list[str] = []
        made[name] = run, export_run(run, root / name, echo=lines.append), lines
    return made


@pytest.fixture(scope="module")
def in_transformers(shipped):
    """What the fresh process's pipelines gave, by export folder."""
    jobs = [(str(out), PROMPT, NEW) for _, out, _ in shipped.values()]
    res = subprocess.run(
        [sys.executable, "-c", _HF_SCRIPT, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", list(SHIPPED))
def test_every_shipped_config_exports_with_transformers_logits(shipped, name, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    run, out, lines = shipped[name]
    loaded = load_run(run)
    mc = loaded.config.model
    assert hf_target(mc) == SHIPPED[name]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == SHIPPED[name]
    assert json.loads((out / "generation_config.json").read_text())["max_length"] == 16
    assert (
        "max_length 16 (prompt and new tokens within the model's context) in place of sample.max_new_tokens"
        in lines[-1]
    )
    ids = loaded.tokenizer.encode("ROMEO: what, art thou mad? Be gone!")[:16]
    ref = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        diff = (ref(x).logits - loaded.model(x)[0]).abs().max().item()
    assert diff < 1e-5, diff
    # export -> import -> export: the same bytes
    back = load_hf_folder(out)
    save_file(
        hf_state_dict(back, back.config, SHIPPED[name]),
        str(tmp_path / "again.safetensors"),
        metadata={"format": "pt"},
    )
    assert (tmp_path / "again.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


@pytest.mark.parametrize("name", list(SHIPPED))
def test_the_default_pipeline_stays_in_the_context_and_greedy_tokens_are_minigpts(
    shipped, in_transformers, name
):
    run, out, _ = shipped[name]
    got = in_transformers[str(out)]
    assert got["default"].startswith(PROMPT)
    # max_length: the whole context, prompt included, and no further; shorter only where end-of-text
    # was drawn
    assert got["length"] == 16 or (got["length"] < 16 and got["ended"]), got
    ours = generate(run, {"prompt": PROMPT, "max_new_tokens": NEW, "temperature": 0})
    assert got["greedy"] == ours[0]


def test_generate_ends_each_sample_at_end_of_text_unless_told_to_go_on(
    data_dir, tmp_path, monkeypatch
):
    """Sample i draws the end-of-text id at step i + 1 (a scripted sampler): it ends there, without
    the token, while the others go on; ``ignore_eos`` goes on past it, printing it, as before."""
    import minigpt_cli.sample.generate as gen

    cfg = load_config(
        "tiny",
        [
            *SHRINK,
            "tokenizer.special_tokens=[<|endoftext|>]",
            f"data.data_dir={data_dir}",
            f"train.out_dir={tmp_path}/runs",
        ],
    )
    run = train(cfg, "eos", echo=lambda m: None, progress=False).run_dir
    tok = load_run(run).tokenizer
    eos, a = tok.encode("<|endoftext|>")[0], tok.encode("a")[0]

    def scripted(model, idx, max_new_tokens, *args, **kwargs):
        for step in range(max_new_tokens):
            yield torch.tensor([eos if step == row + 1 else a for row in range(idx.size(0))])

    monkeypatch.setattr(gen, "generate_tokens", scripted)
    sample = {"prompt": "x", "max_new_tokens": 5, "num_samples": 3}
    assert generate(run, sample) == ["xa", "xaa", "xaaa"]
    assert generate(run, sample, ignore_eos=True) == [
        "xa<|endoftext|>aaa",
        "xaa<|endoftext|>aa",
        "xaaa<|endoftext|>a",
    ]
    assert generate(run, {**sample, "num_samples": 1}) == ["xa"]


#: Runs with the speedrun's switches (README, "Model switches from the speedrun"): the target each exports as,
#: or the key an export refuses, naming it.
SWITCHED = {
    "qwen3": ("shakespeare-llama", ["model.qk_norm=true", "model.bias=false"], "qwen3"),
    "neox-relu2": ("shakespeare-cpu", ["model.ffn=relu2", "model.zero_init_proj=true"], "gpt_neox"),
    "gpt2-relu2": ("tiny", ["model.ffn=relu2"], "gpt2"),
    "softcap": ("shakespeare-llama", ["model.logit_softcap=15"], "model.logit_softcap"),
    "value-embeddings": (
        "shakespeare-llama",
        ["model.value_embeddings=true"],
        "model.value_embeddings",
    ),
}


@pytest.mark.parametrize("name", list(SWITCHED))
def test_switched_runs_export_as_the_architecture_that_computes_them_or_are_refused(
    name, data_dir, tmp_path
):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from minigpt_cli.errors import MinigptError

    base, sets, want = SWITCHED[name]
    cfg = load_config(
        base, [*SHRINK, *sets, f"data.data_dir={data_dir}", f"train.out_dir={tmp_path}/runs"]
    )
    run = train(cfg, name, echo=lambda m: None, progress=False).run_dir
    if want.startswith("model."):
        with pytest.raises(MinigptError, match=rf"{want}=.*no equivalent") as info:
            export_run(run, tmp_path / "out", echo=lambda m: None)
        assert info.value.key == want and not (tmp_path / "out").exists()
        return
    out = export_run(run, tmp_path / "out", echo=lambda m: None)
    assert json.loads((out / "config.json").read_text())["model_type"] == want
    loaded = load_run(run)
    ids = loaded.tokenizer.encode("ROMEO: what, art thou mad? Be gone!")[:16]
    ref = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        diff = (ref(x).logits - loaded.model(x)[0]).abs().max().item()
        greedy = ref.generate(x[:1, :6], do_sample=False, max_new_tokens=NEW, eos_token_id=None)[
            0
        ].tolist()
    assert diff < 1e-5, diff
    ours = generate(
        run,
        {"prompt": loaded.tokenizer.decode(ids[:6]), "max_new_tokens": NEW, "temperature": 0},
        ignore_eos=True,
    )
    assert loaded.tokenizer.decode(greedy) == ours[0]
    back = load_hf_folder(out)
    assert back.config.qk_norm == cfg.model.qk_norm and back.config.ffn == cfg.model.ffn
    save_file(
        hf_state_dict(back, back.config, want),
        str(tmp_path / "again.safetensors"),
        metadata={"format": "pt"},
    )
    assert (tmp_path / "again.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
