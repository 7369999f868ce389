"""The config schema: shipped YAML, strictness, overrides, cross-field rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from helpers import assert_user_error
from pydantic import BaseModel

from minigpt_cli.config import yaml_io
from minigpt_cli.config.keys import describe_keys
from minigpt_cli.config.schema import (
    Config,
    ConfigError,
    ModelConfig,
    apply_overrides,
    load_config,
    parse_yaml,
    text_override,
    validate,
)
from minigpt_cli.config.yaml_io import dump_yaml

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
CONFIG_PAGE = CONFIGS.parent / "docs" / "config.md"  # the config reference
#: The example configs and the presets (package data in minigpt_cli/config/presets/).
SHIPPED = sorted(CONFIGS.rglob("*.yaml")) + sorted(
    (CONFIGS.parent / "minigpt_cli" / "config" / "presets").glob("*.yaml")
)


def test_the_shipped_configs_exist():
    names = {p.name for p in SHIPPED}
    assert {"tiny.yaml", "shakespeare-cpu.yaml", "shakespeare.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(CONFIGS.parent)) for p in SHIPPED])
def test_every_shipped_yaml_loads(path):
    cfg = load_config(path)
    assert cfg.model.n_embd % cfg.model.n_head == 0


def test_load_config_takes_a_shipped_name_as_the_cli_does(tmp_path, monkeypatch):
    """One resolver (paths.resolve_config): the name alone, or configs/NAME.yaml from a folder
    without it."""
    monkeypatch.chdir(tmp_path)
    by_file = load_config(CONFIGS / "shakespeare-cpu.yaml", ["train.max_iters=7"])
    assert load_config("shakespeare-cpu", ["train.max_iters=7"]) == by_file
    notes = []
    assert (
        load_config("configs/shakespeare-cpu.yaml", ["train.max_iters=7"], note=notes.append)
        == by_file
    )
    assert notes and "using the copy shipped" in notes[0]
    with pytest.raises(ConfigError, match="not found; shipped configs"):
        load_config("no-such-config")


def test_gpu_recipe_is_nanogpts_baby_gpt():
    cfg = load_config(CONFIGS / "shakespeare.yaml")
    m, t = cfg.model, cfg.train
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout) == (6, 6, 384, 256, 0.2)
    assert (t.batch_size, t.learning_rate, t.max_iters) == (64, 1e-3, 5000)


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  learnig_rate: 0.001\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "train.learnig_rate: unknown key; did you mean train.learning_rate?" in msg
    assert "\n" not in msg


def test_unknown_section_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trian:\n  max_iters: 3\n")
    with pytest.raises(ConfigError, match=r"trian: unknown key; did you mean train\?"):
        load_config(p)


def test_wrong_type_names_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  n_layer: many\n")
    with pytest.raises(ConfigError, match=r"model\.n_layer: .*integer.*'many'"):
        load_config(p)


def test_n_embd_must_divide_by_n_head():
    with pytest.raises(
        ConfigError, match=r"model\.n_embd \(100\) must be divisible by model\.n_head \(3\)"
    ):
        validate({"model": {"n_embd": 100, "n_head": 3}})


def test_rope_needs_even_head_size():
    with pytest.raises(ConfigError, match=r"rope.*even head size"):
        validate({"model": {"n_embd": 12, "n_head": 4, "pos_encoding": "rope"}})


def test_a_suggested_width_passes_every_rule_on_the_width():
    """The head counts and the n_embd a head-size refusal suggests are accepted: n_head=3 under RoPE
    at width 128 gets the nearest dividing head counts 2 or 4 first, then the width 126, not 129
    (odd heads)."""
    import re

    with pytest.raises(
        ConfigError,
        match=r"must be divisible by model\.n_head \(3\); e\.g\. n_head=2 or 4 \(dividing 128\), "
        r"or n_embd=126$",
    ):
        validate({"model": {"n_embd": 128, "n_head": 3, "pos_encoding": "rope"}})
    refused = 0
    for pos in ("learned", "rope", "sinusoidal"):
        for n_head in range(1, 9):
            for n_embd in range(1, 66):
                model = {"n_embd": n_embd, "n_head": n_head, "pos_encoding": pos}
                try:
                    validate({"model": model})
                except ConfigError as exc:
                    refused += 1
                    fit = int(re.search(r"n_embd=(\d+)$", str(exc)).group(1))
                    assert abs(fit - n_embd) <= 2 * n_head, (model, str(exc))  # a near width
                    validate({"model": {**model, "n_embd": fit}})
                    heads = re.search(r"e\.g\. n_head=(\d+)(?: or (\d+))?", str(exc))
                    for h in filter(None, heads.groups() if heads else ()):
                        validate({"model": {**model, "n_head": int(h)}})  # the width kept
    assert refused > 1000


def test_a_whole_float_is_an_integer_key_and_a_fraction_is_refused(cli, tmp_path):
    """max_iters: 1e4 (YAML reads a float) and --set train.max_iters=1e4 mean 10000; 1.5 is
    refused."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  max_iters: 1e4\n  warmup_iters: 10.0\n")
    assert load_config(cfg).train.max_iters == 10000
    assert type(load_config(cfg).train.warmup_iters) is int
    assert load_config(cfg, ["train.max_iters=2e3"]).train.max_iters == 2000
    with pytest.raises(
        ConfigError, match=r"train\.max_iters: input should be a valid integer \(got 1\.5\)"
    ):
        load_config(cfg, ["train.max_iters=1.5"])
    tiny = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"
    res = cli("train", tiny, "--set", "train.max_iters=1e4", "--dry-run")
    assert "max_iters: 10000" in res.stdout, res


def test_gqa_needs_divisible_heads():
    with pytest.raises(
        ConfigError, match=r"model\.n_head \(6\) must be a multiple of model\.n_kv_head \(4\)"
    ):
        validate({"model": {"n_embd": 48, "n_head": 6, "n_kv_head": 4}})


def test_bad_device_and_values():
    with pytest.raises(ConfigError, match="device"):
        validate({"device": "gpu"})
    with pytest.raises(ConfigError, match=r"train\.min_lr"):
        validate({"train": {"learning_rate": 1e-4, "min_lr": 1e-3}})
    with pytest.raises(ConfigError, match=r"model\.dropout"):
        validate({"model": {"dropout": 1.5}})


#: Plain values as a user writes them: what the config gets, or the words of the refusal (YAML 1.1 and
#: YAML 1.2 read them differently: config/yaml_io.py's rule). Each goes through a config file, --set and a
#: sweep file.
FORMS = [
    ("train.max_iters", "90", 90),
    ("train.max_iters", "+12", 12),
    ("train.max_iters", "0x1F", 31),  # hexadecimal: one reading in both
    ("train.learning_rate", "3e-4", 3e-4),  # YAML 1.1 leaves it text; as everyone means it, a float
    ("train.learning_rate", "1e-3", 1e-3),
    ("train.learning_rate", "3.0e-4", 3e-4),
    ("train.learning_rate", "1E-3", 1e-3),
    ("train.learning_rate", ".5e-3", 5e-4),
    ("model.bias", "true", True),
    ("model.bias", "False", False),
    ("model.vocab_size", "~", None),
    ("model.vocab_size", "null", None),
    (
        "train.max_iters",
        "1:30",
        "reads as 90 in YAML 1.1 and as the text '1:30' in YAML 1.2; write 90, or quote it",
    ),
    (
        "train.learning_rate",
        "1:30.5",
        "reads as 90.5 in YAML 1.1 and as the text '1:30.5' in YAML 1.2; write 90.5",
    ),
    ("train.max_iters", "017", "reads as 15 in YAML 1.1 and as 17 in YAML 1.2; write 15 or 17"),
    (
        "train.max_iters",
        "-017",
        "reads as -15 in YAML 1.1 and as -17 in YAML 1.2; write -15 or -17",
    ),
    (
        "train.max_iters",
        "0o17",
        "reads as the text '0o17' in YAML 1.1 and as 15 in YAML 1.2; write 15, or quote",
    ),
    (
        "train.max_iters",
        "08",
        "reads as the text '08' in YAML 1.1 and as 8 in YAML 1.2; write 8, or quote it",
    ),
    (
        "train.max_iters",
        "0b101",
        "reads as 5 in YAML 1.1 and as the text '0b101' in YAML 1.2; write 5",
    ),
    (
        "train.max_iters",
        "1_000",
        "reads as 1000 in YAML 1.1 and as the text '1_000' in YAML 1.2; write 1000",
    ),
    (
        "train.max_iters",
        "-0x1F",
        "reads as -31 in YAML 1.1 and as the text '-0x1F' in YAML 1.2; write -31",
    ),
    (
        "train.learning_rate",
        "1_0.5",
        "reads as 10.5 in YAML 1.1 and as the text '1_0.5' in YAML 1.2",
    ),
    (
        "model.bias",
        "yes",
        "reads as true in YAML 1.1 and as the text 'yes' in YAML 1.2; write true, or quote",
    ),
    ("model.bias", "on", "reads as true in YAML 1.1 and as the text 'on' in YAML 1.2"),
    (
        "model.bias",
        "NO",
        "reads as false in YAML 1.1 and as the text 'NO' in YAML 1.2; write false",
    ),
    (
        "train.max_iters",
        "2024-01-01",
        "reads as the date 2024-01-01 in YAML 1.1 and as the text '2024-01-01'",
    ),
    (
        "train.max_iters",
        "2024-13-45",
        "reads as an invalid number or date in YAML 1.1 and as the text",
    ),
    (
        "train.max_iters",
        "<<",
        "reads as a merge key (<<) in YAML 1.1 and as the text '<<' in YAML 1.2; quote",
    ),
    ("train.max_iters", "=", "reads as a default-value key (=) in YAML 1.1 and as the text '='"),
]
#: Explicitly tagged values: each refused, naming its key (PyYAML builds them by YAML 1.1's rules).
TAGGED = "the tag {} is not read; write the value plainly (quote it for text)"
FORMS += [
    ("train.max_iters", "!!int 1:30", TAGGED.format("!!int")),
    ("train.max_iters", "!!int 0b101", TAGGED.format("!!int")),
    ("train.max_iters", "!!int +0x_1F", TAGGED.format("!!int")),
    ("train.max_iters", "!!int 1_000", TAGGED.format("!!int")),
    ("train.max_iters", "!!int 90", TAGGED.format("!!int")),
    ("train.max_iters", "!!float 1:30.5", TAGGED.format("!!float")),
    ("train.learning_rate", "!!float 1_0.5", TAGGED.format("!!float")),
    ("train.eval_at_start", "!!bool yes", TAGGED.format("!!bool")),
    ("model.bias", "!!str true", TAGGED.format("!!str")),
    ("train.max_iters", "!mine 3", TAGGED.format("!mine")),
]


@pytest.mark.parametrize("route", ["file", "--set", "sweep"])
@pytest.mark.parametrize(("key", "written", "expected"), FORMS, ids=[f[1] for f in FORMS])
def test_a_value_yaml_1_1_reads_otherwise_is_refused_naming_both(
    tmp_path, route, key, written, expected
):
    from minigpt_cli.experiments.sweep import load_sweep

    section, name = key.split(".")
    base = tmp_path / "c.yaml"
    base.write_text(f"name: c\n{section}:\n  {name}: {written if route == 'file' else 'null'}\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"base: {base}\nbudget: {{seconds: 5}}\ngrid:\n  {key}: [{written}]\n")
    source = {
        "file": f"{base}: line 3, column {len(name) + 5}",
        "--set": "--set",
        "sweep": f"{sweep}: line 4, column {len(key) + 6}",
    }[route]
    where = {"file": key, "--set": key, "sweep": f"grid.{key}[0]"}[route]

    def load():
        if route == "sweep":
            return load_sweep(sweep).runs[0].cfg
        return load_config(base, [f"{key}={written}"] if route == "--set" else [])

    if isinstance(expected, str):
        with pytest.raises(ConfigError) as e:
            load()
        said = expected if written.startswith("!") else f"{written} {expected}"
        assert str(e.value).startswith(f"{source}: {where}: {said}"), str(e.value)
    else:
        got = load().flat()[key]
        assert got == expected and type(got) is type(expected)


def test_a_text_key_keeps_what_set_gives_and_a_file_quotes_it(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\n")
    cfg = load_config(p, ["sample.prompt=yes", "name=2024-01-01", "train.out_dir=1:30"])
    assert (cfg.sample.prompt, cfg.name, cfg.train.out_dir) == ("yes", "2024-01-01", "1:30")
    p.write_text("name: '2024-01-01'\nsample:\n  prompt: 'yes'\n")
    assert (load_config(p).name, load_config(p).sample.prompt) == ("2024-01-01", "yes")
    p.write_text("name: c\nsample:\n  prompt: yes\n")
    with pytest.raises(ConfigError, match="sample.prompt: yes reads as true in YAML 1.1"):
        load_config(p)


def test_a_tag_in_a_text_keys_set_value_is_refused_as_in_a_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\n")
    for key, value, tag in [
        ("name", "!!str tiny", "!!str"),
        ("data.data_dir", "!!int 5", "!!int"),
        ("sample.prompt", "!Hello", "!Hello"),
        ("name", "! x", "!"),  # the non-specific tag
        ("train.max_iters", "! 5", "!"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(p, [f"{key}={value}"])
        assert str(e.value) == f"--set: {key}: {TAGGED.format(tag)}", str(e.value)


#: Paths a command line may name (--init-from, --out) that YAML would read otherwise: a comment, null,
#: a syntax error, an alias, an anchor, a tag, a flow list, a date, a YAML 1.1 boolean and octal.
ODD_PATHS = ["x #y", "null", "~", "@x", "*a", "&a", "!x", "[x", "%x", "`x", "2024-01-01", "yes"]
ODD_PATHS += ["017", 'a"b\\c', "tab\there", "é ü", "'q'", " lead and trail "]
#: And characters YAML would fold or refuse unescaped: next-line, line separator, DEL, astral ones.
ODD_PATHS += ["nel\u0085x", "ls\u2028x", "d\x7f", "\U0001f600/é"]


def test_a_path_the_command_line_names_is_given_as_the_text_it_is(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: c\n")
    for text in ODD_PATHS:
        cfg = load_config(p, [text_override("train.out_dir", text)])
        assert cfg.train.out_dir == os.path.expanduser(text), text  # ~ is the home folder


def test_init_from_names_a_folder_even_where_yaml_reads_otherwise(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("null", "2024-01-01", "x #y"):
        res = cli("train", "tiny", "--dry-run", "--init-from", name)
        assert_user_error(res, f"'{tmp_path / name}' is not a folder")


@pytest.mark.parametrize(
    "text", ["08", "3e-4", "yes", "1:30", "0o17", "2024-01-01", "<<", "=", "1_000"]
)
def test_what_the_dumper_writes_reads_back_as_written(text):
    """A run's config.yaml, written by dump_yaml, reads back: a text that looks like a number is
    quoted."""
    assert parse_yaml(dump_yaml({"name": text, "list": [text]})) == {"name": text, "list": [text]}


class _PyDumper(yaml.SafeDumper):
    """dump_yaml's dumper on PyYAML's pure-Python emitter."""


_PyDumper.add_representer(str, yaml_io._represent_str)


def test_libyaml_and_pyyamls_own_parser_and_emitter_agree():
    """parse_yaml and dump_yaml run on libyaml (PyYAML's C extension) where PyYAML has it. On every
    shipped YAML file, every plain value of FORMS and the dumper's tricky texts, the pure-Python
    loader and emitter give the same values, refusals and text."""
    if yaml_io.CParser is None:
        pytest.skip("this PyYAML was built without libyaml: there is one path only")

    def read(loader: type, text: str):
        try:
            return yaml_io._load(loader, text, "", False)
        except yaml.YAMLError as exc:  # a refusal: its words and where
            return type(exc).__name__, exc.problem, exc.problem_mark.line, exc.problem_mark.column

    texts = [p.read_text(encoding="utf-8") for p in SHIPPED]
    texts += [f"{key.split('.')[1]}: {form}\n" for key, form, _ in FORMS]
    texts += ["a: 1\na: 2\n", "x: &a 1\ny: *a\n", "m: !!int 3\n", "m: !x 3\n", "[" * 40 + "]" * 40]
    for text in texts:
        assert read(yaml_io._Loader, text) == read(yaml_io._PyLoader, text), text
    # Where they differ (6,000 random edits of the shipped configs found 52, all tabs), libyaml
    # follows YAML 1.2: a tab may separate a value or a comment, not indent.
    for text in ("seed:\t1337\n", "seed: 1337\t# a comment\n"):
        assert parse_yaml(text) == {"seed": 1337}
        assert read(yaml_io._PyLoader, text)[0] == "ScannerError"
    for text in ("train:\n\tmax_iters: 5\n", "\t# c\nseed: 1\n", "model:\n  \t# c\n  bias: true\n"):
        with pytest.raises(ConfigError, match=r"found character '\\t' that cannot start any token"):
            parse_yaml(text)  # a tab that starts a line, whatever follows it
    tricky = ["yes", "08", "3e-4", "a\nb", "", " x", "x: y", "#c", "- a", "~", "é", "a " * 60]
    data = [load_config(p).model_dump(mode="json") for p in SHIPPED] + [{"s": tricky}]
    for item in data:
        fast = yaml_io.dump_yaml(item)
        assert fast == yaml.dump(item, Dumper=_PyDumper, sort_keys=False)
        assert parse_yaml(fast) == item


def test_an_empty_config_gets_a_note_and_an_empty_folder_key_is_refused(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("# nothing yet\n")
    notes = []
    assert load_config(p, note=notes.append) == Config()
    assert notes == [
        f"note: {p} is empty: every key takes its default (minigpt config-keys lists them)"
    ]
    for key in ("train.out_dir", "data.data_dir"):
        with pytest.raises(
            ConfigError, match=rf"--set: {key}: string should have at least 1 character"
        ):
            load_config(p, [f"{key}="])


def test_set_overrides_are_typed(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_iters: 10\n")
    cfg = load_config(
        p,
        [
            "train.learning_rate=3e-4",
            "model.bias=false",
            "model.vocab_size=null",
            "train.max_iters=7",
            "name=exp1",
        ],
    )
    assert cfg.train.learning_rate == pytest.approx(3e-4) and isinstance(
        cfg.train.learning_rate, float
    )
    assert cfg.model.bias is False
    assert cfg.model.vocab_size is None
    assert cfg.train.max_iters == 7
    assert cfg.name == "exp1"


def test_set_unknown_key_and_bad_syntax(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("")
    with pytest.raises(
        ConfigError, match=r"train\.learnig_rate: unknown key; did you mean train\.learning_rate"
    ):
        load_config(p, ["train.learnig_rate=1e-3"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(p, ["train.learning_rate"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_errors_name_where_the_bad_value_came_from(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("compile: maybe\ntrain:\n  batch_size: 4\n")
    with pytest.raises(ConfigError, match=r"^.*c\.yaml: compile: input should be a valid boolean"):
        load_config(p)
    p.write_text("train:\n  batch_size: 4\n")
    with pytest.raises(
        ConfigError, match=r"^--set: compile: input should be a valid boolean \(got 'maybe'\)"
    ):
        load_config(p, ["compile=maybe"])
    with pytest.raises(ConfigError, match=r"^--set: train\.batch_sise: unknown key"):
        load_config(p, ["train.batch_sise=3"])
    # A rule over a section names the file and the --set keys that took part.
    with pytest.raises(
        ConfigError,
        match=r"c\.yaml with --set model\.n_head: model\.n_embd .* divisible by model\.n_head",
    ):
        load_config(p, ["model.n_head=5"])
    p.write_text("train:\n  batch_size: -4\n")  # the file's value is bad, the override is fine
    with pytest.raises(ConfigError, match=r"c\.yaml: train\.batch_size"):
        load_config(p, ["train.max_iters=5"])
    p.write_text("hello\n")  # not a mapping at all: the file's fault, whatever --set adds
    with pytest.raises(ConfigError, match=r"^\S*c\.yaml: the top level must be a mapping"):
        load_config(p, ["train.max_iters=5"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(p)
    p.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="is a folder; give the path of a file"):
        load_config(tmp_path)
    p.write_bytes(
        "model:\n  name: caf\u00e9\n".encode("latin-1")
    )  # a Latin-1 file: é is the byte 0xe9
    with pytest.raises(
        ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 18\); convert it to UTF-8"
    ):
        load_config(p)


def test_a_section_given_a_value_says_so_without_class_names(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: 5\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "model: is a section, not a value (got 5)" in str(e.value) and "ModelConfig" not in str(
        e.value
    )
    with pytest.raises(
        ConfigError,
        match=r"--set: train: is a section, not a value \(got 3\).*--set train.KEY=VALUE",
    ):
        load_config(CONFIGS / "tiny.yaml", ["train=3"])


def test_swiglu_hidden_size_follows_llama():
    # Llama-2-7B: d=4096, multiple_of=256 -> 11008 (Meta's FeedForward).
    m = ModelConfig(n_embd=4096, n_head=32, ffn="swiglu", multiple_of=256)
    assert m.ffn_hidden == 11008
    assert ModelConfig(n_embd=384, n_head=6).ffn_hidden == 4 * 384
    assert ModelConfig(n_embd=384, n_head=6, d_ff=1000).ffn_hidden == 1000


def test_resolved_config_round_trips():
    cfg = load_config(CONFIGS / "tiny.yaml")
    again = validate(parse_yaml(cfg.to_yaml()))
    assert again == cfg


def test_a_duplicate_key_is_an_error_naming_it_and_its_lines(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text(
        "name: x\ntrain:\n  learning_rate: 1.0e-3\n  max_iters: 10\n  learning_rate: 3.0e-4\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "duplicate key 'learning_rate'" in msg and "line 5" in msg and "line 3" in msg, msg
    assert "\n" not in msg
    p.write_text("train:\n  max_iters: 10\ntrain:\n  max_iters: 20\n")  # a whole section twice
    with pytest.raises(ConfigError, match="duplicate key 'train'"):
        load_config(p)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "'inf'"])
def test_non_finite_floats_are_refused(tmp_path, value):
    p = tmp_path / "c.yaml"
    p.write_text(f"train:\n  learning_rate: {value}\n")
    # A quoted 'inf' is a string, and strings are not numbers (strict types).
    expected = "a valid number" if value.startswith("'") else "a finite number"
    with pytest.raises(ConfigError, match=f"train.learning_rate: input should be {expected}"):
        load_config(p)
    with pytest.raises(ConfigError, match="model.rope_base: input should be a finite number"):
        load_config(CONFIGS / "tiny.yaml", ["model.rope_base=.inf"])
    with pytest.raises(ConfigError, match="train.weight_decay"):
        load_config(CONFIGS / "tiny.yaml", ["train.weight_decay=nan"])


def test_nested_aliases_fail_fast_with_a_short_line(tmp_path):
    """The "billion laughs" document: 9**9 strings if expanded; refused at the first alias."""
    import time

    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    lines.append("name: *i")
    p = tmp_path / "lol.yaml"
    p.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "line 2" in msg and "alias" in msg and len(msg) < 300, msg


def test_a_huge_value_is_quoted_short(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: [" + ", ".join(["lol"] * 20_000) + "]\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "name:" in str(e.value) and len(str(e.value)) < 400


def test_deep_nesting_is_a_config_error(tmp_path):
    p = tmp_path / "deep.yaml"
    p.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(p)


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("model.n_layer=true", "model.n_layer: input should be a valid integer"),
        ("model.bias=1", "model.bias: input should be a valid boolean"),
        ("sample.window_stride=true", "sample.window_stride: input should be a valid integer"),
        ("model.n_layer='8'", "model.n_layer: input should be a valid integer"),
        ("train.max_iters=1.5", "train.max_iters: input should be a valid integer"),
    ],
)
def test_wrong_types_are_not_coerced(override, fragment):
    """Strict types: YAML true is not 1, 1 is not true, a quoted '8' is not 8."""
    with pytest.raises(ConfigError, match=fragment):
        load_config(CONFIGS / "tiny.yaml", [override])
    assert (
        load_config(CONFIGS / "tiny.yaml", ["train.learning_rate=1"]).train.learning_rate == 1.0
    )  # int -> float is fine


def test_schedules_and_special_tokens_that_cannot_work_are_refused_at_load():
    with pytest.raises(
        ConfigError, match=r"train.lr_decay_iters \(10\) ends the decay before the warmup ends"
    ):
        load_config(CONFIGS / "tiny.yaml", ["train.lr_decay_iters=10", "train.warmup_iters=50"])
    load_config(
        CONFIGS / "tiny.yaml", ["train.lr_decay_iters=50", "train.warmup_iters=50"]
    )  # equal is fine
    for bad, fragment in (('[""]', "must be non-empty"), ('["<s>", "<s>"]', "listed twice")):
        with pytest.raises(ConfigError, match=fragment):
            load_config(CONFIGS / "tiny.yaml", [f"tokenizer.special_tokens={bad}"])


def _schema_keys(model=Config, prefix=""):
    """Every leaf key of the schema, ``section.key`` in a section (walked here, not with config.py's
    helper)."""
    keys = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _schema_keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_the_schema_walk_sees_every_section():
    keys = _schema_keys()
    assert {
        "name",
        "device",
        "model.n_layer",
        "tokenizer.special_tokens",
        "data.url",
        "train.tensorboard",
        "sample.window_stride",
    } <= set(keys)
    assert len(keys) == len(set(keys)) > 55


@pytest.mark.parametrize(
    "key,hint",
    [
        # The key lives in another section, or at the top level: that place first, however close a
        # sibling is.
        ("model.batch_size", "did you mean train.batch_size?"),
        ("train.block_size", "did you mean model.block_size?"),
        ("train.n_layer", "did you mean model.n_layer?"),
        ("train.n_embd", "did you mean model.n_embd?"),
        ("train.compile", "did you mean top-level compile?"),
        ("train.seed", "did you mean top-level seed?"),
        ("sample.seed", "did you mean top-level seed?"),
        ("model.learning_rate", "did you mean train.learning_rate?"),
        ("data.kind", "did you mean tokenizer.kind?"),
        ("n_layer", "did you mean model.n_layer?"),
        ("train.vocab_size", "did you mean model.vocab_size or tokenizer.vocab_size?"),
        ("train.momentum", "did you mean train.muon.momentum?"),
        # Then a close spelling: in the same section, else anywhere.
        ("model.n_layr", "did you mean model.n_layer?"),
        ("train.batch_sise", "did you mean train.batch_size?"),
        ("model.learnig_rate", "did you mean train.learning_rate?"),
        ("sample.seeds", "did you mean top-level seed?"),
        # Nothing alike: no guess.
        ("model.colour", "remove it (minigpt config-keys lists the keys)"),
    ],
)
def test_an_unknown_key_is_pointed_to_where_it_lives(tmp_path, key, hint):
    section, _, name = key.rpartition(".")
    p = tmp_path / "c.yaml"
    p.write_text(f"{section}:\n  {name}: 16\n" if section else f"{name}: 16\n")
    for source, overrides in ((str(p), []), ("--set", [f"{key}=16"])):
        if overrides:
            p.write_text("")
        with pytest.raises(ConfigError) as e:
            load_config(p, overrides)
        assert str(e.value) == f"{source}: {key}: unknown key; {hint}"


def test_a_weak_likeness_is_not_suggested():
    # "sample.seed" is 70% like "sample"; "train.seed" 67% like "train.lr_schedule" (difflib's old
    # 0.6 cutoff).
    for key in ("sample.seed", "train.seed", "train.n_layer", "train.compile"):
        with pytest.raises(ConfigError) as e:
            load_config(CONFIGS / "tiny.yaml", [f"{key}=1"])
        assert "did you mean sample?" not in str(e.value) and "min_lr" not in str(e.value)
        assert "lr_schedule" not in str(e.value)


def test_float16_on_the_cpu_is_refused_at_load(tmp_path):
    fix = "dtype: float16 needs a GPU; use dtype: auto, float32 or bfloat16 on the CPU"
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "shakespeare.yaml", ["dtype=float16", "device=cpu"])
    assert str(e.value).endswith(": " + fix) and "--set dtype, device" in str(e.value)
    p = tmp_path / "c.yaml"
    p.write_text("device: cpu\ndtype: float16\n")
    with pytest.raises(ConfigError, match=f"^{p}: {fix}$"):
        load_config(p)
    # A GPU (or a device that may be one) keeps float16; the CPU keeps the other dtypes.
    for device in ("auto", "cuda", "cuda:1", "mps"):
        assert (
            load_config(CONFIGS / "shakespeare.yaml", ["dtype=float16", f"device={device}"]).dtype
            == "float16"
        )
    for dtype in ("auto", "float32", "bfloat16"):
        assert load_config(CONFIGS / "tiny.yaml", [f"dtype={dtype}"]).device == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU", "cuda0", "tpu"])
def test_a_bad_device_is_a_field_error_at_load(tmp_path, device):
    msg = f"device: {device!r} is not one of auto, cpu, cuda, cuda:N, mps"
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "tiny.yaml", [f"device={device}"])
    assert str(e.value) == f"--set: {msg}"  # the --set value is named, not the file
    p = tmp_path / "c.yaml"
    p.write_text(f"device: {device}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}: {msg}"


def test_values_a_null_stands_for_pass_the_checks_their_explicit_form_gets():
    # d_ff, n_kv_head and window_stride: null means a value that always passes (4*d, n_head,
    # block_size // 4).
    cfg = load_config(
        CONFIGS / "tiny.yaml", ["model.block_size=1", "model.n_head=2", "model.ffn=swiglu"]
    )
    assert (
        cfg.sample.window_stride is None
        and cfg.model.kv_heads == 2
        and cfg.model.ffn_hidden % 256 == 0
    )
    with pytest.raises(
        ConfigError, match=r"sample\.window_stride: 2 is larger than model\.block_size \(1\)"
    ):
        load_config(CONFIGS / "tiny.yaml", ["model.block_size=1", "sample.window_stride=2"])
    with pytest.raises(
        ConfigError, match=r"model\.n_kv_head \(4\) must not exceed model\.n_head \(2\)"
    ):
        load_config(CONFIGS / "tiny.yaml", ["model.n_kv_head=4"])
    # lr_decay_iters: null (max_iters) below warmup_iters ends the run inside the warmup, with no
    # cliff to min_lr after it: a short trial run loads. The explicit form is refused (test above).
    cfg = load_config(CONFIGS / "tiny.yaml", ["train.max_iters=3"])
    assert (cfg.train.max_iters, cfg.train.warmup_iters, cfg.train.lr_decay_iters) == (3, 5, None)


def test_every_key_has_a_one_line_meaning():
    for section in [
        Config,
        *(
            f.annotation
            for f in Config.model_fields.values()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
        ),
    ]:
        for name, field in section.model_fields.items():
            assert field.description and field.description.strip(), (
                f"{section.__name__}.{name} has no description"
            )
            assert "\n" not in field.description and len(field.description) < 140, name


def test_describe_keys_lists_every_key_with_its_default_and_meaning():
    text = describe_keys()
    lines = {line.split()[0]: line for line in text.splitlines()[1:]}
    assert list(lines) == _schema_keys()
    assert text.splitlines()[0].split() == ["key", "type", "default", "meaning"]
    m = lines["model.scale_residual_init"]
    assert m.split()[1:3] == ["bool", "true"] and m.endswith("by 1/sqrt(2·n_layer) (GPT-2 §2.3)")
    assert lines["model.ffn"].split()[1:8] == ["relu", "|", "gelu", "|", "gelu_tanh", "|", "swiglu"]
    assert lines["train.lr_decay_iters"].split()[1:5] == ["int", "or", "null", "null"]
    assert lines["device"].split()[1:10] == [
        "auto",
        "|",
        "cpu",
        "|",
        "cuda",
        "|",
        "cuda:N",
        "|",
        "mps",
    ]
    assert lines["sample.prompt"].split()[2] == '"\\n"'
    assert lines["tokenizer.special_tokens"].split()[1:5] == ["list", "of", "str", "[]"]


def test_the_config_reference_gives_every_key_a_meaning():
    section = CONFIG_PAGE.read_text(encoding="utf-8")
    for key in _schema_keys():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, f"docs/config.md's table has no row for {key}"
        assert len(row.split(" | ")) >= 4 and row.rstrip(" |").split(" | ")[-1].strip(), row


def test_the_full_recipe_writes_out_every_key_with_a_comment():
    path = CONFIGS / "shakespeare.yaml"
    data = parse_yaml(path.read_text(encoding="utf-8"))

    def leaves(d, prefix=""):
        return [
            k
            for key, v in d.items()
            for k in (leaves(v, f"{prefix}{key}.") if isinstance(v, dict) else [prefix + key])
        ]

    written = leaves(data)
    assert sorted(written) == sorted(_schema_keys())
    for line in path.read_text(encoding="utf-8").splitlines():
        if (
            line.strip() and not line.startswith("#") and not line.endswith(":")
        ):  # a key: value line
            assert "  # " in line, f"no comment: {line!r}"


# ----------------------------------------------------------------------------- notes

TINY = CONFIGS / "tiny.yaml"

#: (a fragment of the note, --set values on tiny.yaml that give it, --set values that do not).
NOTE_CASES = [
    (
        "tokenizer.vocab_size (100) has no effect with tokenizer.kind char",
        ["tokenizer.vocab_size=100"],
        ["tokenizer.vocab_size=100", "tokenizer.kind=bpe"],
    ),
    (
        "model.rope_base has no effect with model.pos_encoding learned",
        ["model.rope_base=500000"],
        ["model.rope_base=500000", "model.pos_encoding=rope"],
    ),
    (
        "model.multiple_of has no effect with model.ffn gelu",
        ["model.multiple_of=64"],
        ["model.multiple_of=64", "model.ffn=swiglu"],
    ),
    (
        "model.multiple_of has no effect when model.d_ff is set (96)",
        ["model.ffn=swiglu", "model.multiple_of=64", "model.d_ff=96"],
        ["model.ffn=swiglu", "model.multiple_of=64"],
    ),
    (
        "train.min_lr has no effect with train.lr_schedule constant",
        ["train.lr_schedule=constant"],
        ["train.lr_schedule=linear"],
    ),
    (
        "train.lr_decay_iters has no effect with train.lr_schedule inverse_sqrt",
        ["train.lr_schedule=inverse_sqrt", "train.lr_decay_iters=20"],
        ["train.lr_decay_iters=20"],
    ),
    (
        "train.keep_every (100) is beyond train.max_iters (30)",
        ["train.keep_every=100"],
        ["train.keep_every=10"],
    ),
    (
        "sample.top_k has no effect with sample.temperature 0",
        ["sample.temperature=0", "sample.top_k=5"],
        ["sample.top_k=5"],
    ),
    (
        "sample.top_p has no effect with sample.temperature 0",
        ["sample.temperature=0", "sample.top_p=0.9"],
        ["sample.top_p=0.9"],
    ),
    (
        "train.max_iters (3) ends inside the warmup (train.warmup_iters 5): the learning rate never reaches "
        "train.learning_rate",
        ["train.max_iters=3"],
        ["train.max_iters=5"],
    ),
    (
        "train.early_stop_patience (3) can never stop this run: it evaluates 3 time(s)",  # at 0, 15, 30
        ["train.early_stop_patience=3"],
        ["train.early_stop_patience=2"],
    ),
    # "\n" and 32 tokens reach block_size + 1 only after the last token; a 33rd token follows a
    # slide
    (
        "sample.window_stride has no effect: the context window never slides",
        ["sample.window_stride=2", "sample.max_new_tokens=32", "train.sample_tokens=32"],
        ["sample.window_stride=2", "sample.max_new_tokens=32", "train.sample_tokens=33"],
    ),
    (
        "train.ema_start has no effect with train.ema_decay null",
        ["train.ema_start=10"],
        ["train.ema_start=10", "train.ema_decay=0.99"],
    ),
    (
        "train.ema_start (30) is not before train.max_iters (30): the EMA equals the weights",
        ["train.ema_decay=0.99", "train.ema_start=30"],
        ["train.ema_decay=0.99", "train.ema_start=29"],
    ),
    (
        "train.batch_size_warmup_start has no effect with train.batch_size_warmup_iters 0",
        ["train.batch_size_warmup_start=2"],
        ["train.batch_size_warmup_start=2", "train.batch_size_warmup_iters=10"],
    ),
    (
        "the batch-size ramp (train.batch_size_warmup_iters 31) ends after train.max_iters (30)",
        ["train.batch_size_warmup_iters=31"],
        ["train.batch_size_warmup_iters=30"],
    ),
    (
        "train.block_size_warmup_multiple has no effect with train.block_size_warmup_iters 0",
        ["train.block_size_warmup_multiple=8"],
        ["train.block_size_warmup_multiple=8", "train.block_size_warmup_iters=10"],
    ),
    (
        "the sequence-length warmup (train.block_size_warmup_iters 31) ends after train.max_iters (30)",
        ["train.block_size_warmup_iters=31"],
        ["train.block_size_warmup_iters=30"],
    ),
    (
        "model.pos_encoding sinusoidal without model.emb_scale departs from Vaswani et al. 2017 (§3.4",
        ["model.pos_encoding=sinusoidal"],
        ["model.pos_encoding=sinusoidal", "model.emb_scale=true"],
    ),
    (
        "model.ffn swiglu with model.bias true departs from Shazeer 2020 (§2, eq. 6",
        ["model.ffn=swiglu", "model.bias=true"],
        ["model.ffn=swiglu"],
    ),
    (
        "train.lr_schedule inverse_sqrt with train.learning_rate 0.003 departs from Vaswani et al. 2017 (§5.3",
        ["train.lr_schedule=inverse_sqrt"],
        ["train.lr_schedule=inverse_sqrt", "train.learning_rate=1"],
    ),
]


@pytest.mark.parametrize(
    "fragment, on, off",
    NOTE_CASES,
    ids=[c[0].split(" ")[0] + " " + " ".join(c[1]) for c in NOTE_CASES],
)
def test_each_note_is_given_where_it_applies_and_only_there(tmp_path, fragment, on, off):
    from minigpt_cli.config.notes import notes

    data = [f"data.data_dir={tmp_path}"]
    got = notes(load_config(TINY, data + on))
    assert [n for n in got if fragment in n], (fragment, got)
    assert all(n.startswith("note: ") and "\n" not in n for n in got)
    assert not [n for n in notes(load_config(TINY, data + off)) if fragment in n]


def test_every_note_rule_has_a_case():
    from minigpt_cli.config.notes import RULES

    # + the data.url rule (test_data_url_is_noted_when_the_corpus_is_on_disk) and generate's window
    # rule (test_generate.py: test_a_window_stride_the_window_never_reaches_is_noted)
    assert len(NOTE_CASES) + 2 == len(RULES)
    assert [r.route for r in RULES].count("generate") == 1


def test_data_url_is_noted_when_the_corpus_is_on_disk(tmp_path, data_dir):
    from minigpt_cli.trainer.run_notes import config_notes as notes

    url = "data.url=file:///home/me/my-own.txt"
    (note,) = notes(load_config(TINY, [f"data.data_dir={data_dir}", url]))
    assert note.startswith(
        f"note: data.url is not fetched: {data_dir / 'tinyshakespeare' / 'input.txt'} is on disk"
    )
    assert "mirror of that same file" in note and "for your own text, set data.path" in note
    assert (
        notes(load_config(TINY, [f"data.data_dir={tmp_path}", url])) == []
    )  # not on disk: the url is fetched
    assert notes(load_config(TINY, [f"data.data_dir={data_dir}"])) == []


def test_a_key_counts_as_given_only_when_set_to_a_value_of_its_own():
    from minigpt_cli.config.notes import given, notes

    cfg = load_config(TINY, ["model.rope_base=5e5", "compile=true", "train.keep_every=null"])
    assert (
        given(cfg, "model.rope_base") and given(cfg, "compile") and given(cfg, "train.min_lr")
    )  # YAML, --set
    assert not given(cfg, "train.keep_every")  # null
    assert not given(cfg, "model.multiple_of") and not given(cfg, "data.url")  # absent
    # A recipe that writes every key out at its default (rope_base, multiple_of) gets no note for
    # them.
    full = load_config(CONFIGS / "shakespeare.yaml")
    assert "rope_base" in full.model.model_fields_set and not given(full, "model.rope_base")
    assert notes(full) == []


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_get_no_notes(path, tmp_path):
    from minigpt_cli.config.notes import notes

    assert notes(load_config(path, [f"data.data_dir={tmp_path}"])) == []


@pytest.mark.parametrize(
    "key,meant",
    [
        ("train.warmup", "train.warmup_iters"),
        ("train.lr", "train.learning_rate"),
        ("train.lr_decay", "train.lr_decay_iters"),
        ("sample.temp", "sample.temperature"),
        ("model.rope_theta", "model.rope_base"),
        ("train.gradient_accumulation_steps", "train.grad_accum_steps"),
        ("model.ffn_dim", "model.d_ff"),
        ("model.N_LAYER", "model.n_layer"),
        ("model.hidden_size", "model.n_embd"),
    ],
)
def test_other_tools_names_and_other_letter_cases_find_the_key(key, meant):
    with pytest.raises(ConfigError, match=rf"{key}: unknown key; did you mean {meant}\?$"):
        load_config(CONFIGS / "tiny.yaml", [f"{key}=2"])


def test_a_text_key_takes_the_text_as_typed():
    """YAML would read ROMEO: as a mapping and 2024 as a number; the schema wants text there."""
    cfg = load_config(
        CONFIGS / "tiny.yaml", ["sample.prompt=ROMEO:", "name=2024", "data.url=http://m/x:1"]
    )
    assert (cfg.sample.prompt, cfg.name, cfg.data.url) == ("ROMEO:", "2024", "http://m/x:1")
    assert load_config(CONFIGS / "tiny.yaml", ["data.url=null"]).data.url is None
    with pytest.raises(
        ConfigError, match="train.max_iters"
    ):  # numbers stay numbers, and are checked
        load_config(CONFIGS / "tiny.yaml", ["train.max_iters=ROMEO:"])


# ----------------------------------------------------------------------------- limits (issue 27 §3)


HUGE = "1" * 5000  # past Python's 4,300-digit limit for int(str)


@pytest.mark.parametrize(
    "args",
    [
        ["--set", f"seed={HUGE}"],
        ["--set", f"model.n_layer={10**400}"],
        ["--set", f"model.n_embd={10**400}"],
        ["--set", f"model.vocab_size={10**400}"],
        ["--set", f"model.d_ff={10**400}"],
        ["--set", f"train.batch_size={10**400}"],
        ["--set", f"train.warmup_iters={10**400}"],
        ["--set", f"train.learning_rate={10**400}"],
    ],
)
def test_huge_integers_are_one_line_through_the_cli(cli, args):
    res = cli("train", TINY, *args, "--dry-run")
    assert res.exit_code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --set"), res.stderr
    assert "Traceback" not in res.stderr and len(lines[0]) < 400


def test_a_huge_integer_in_a_config_file_or_sweep_file_is_one_line(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"train:\n  max_iters: {HUGE}\n")
    res = cli("train", cfg, "--dry-run")
    assert res.exit_code == 2 and "line 2, column 14: an integer of 5,000 digits" in res.stderr, (
        res.stderr
    )
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        f"name: s\nbase: {TINY}\nvariants: {{v: {{}}}}\nseeds: [{HUGE}]\nbudget: {{iters: 2}}\n"
    )
    res = cli("sweep", sweep)
    assert res.exit_code == 2 and "an integer of 5,000 digits" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "key",
    [
        "model.n_layer",
        "model.n_head",
        "model.n_embd",
        "model.block_size",
        "model.d_ff",
        "model.vocab_size",
        "train.batch_size",
        "train.grad_accum_steps",
        "train.max_iters",
        "train.warmup_iters",
        "sample.max_new_tokens",
        "sample.num_samples",
        "tokenizer.vocab_size",
        "train.eval_iters",
    ],
)
def test_every_size_and_count_has_an_upper_bound_that_config_keys_states(key):
    from minigpt_cli.config.keys import key_rows

    section, name = key.split(".")
    field = Config.model_fields[section].annotation.model_fields[name]
    most = next(m.le for m in field.metadata if hasattr(m, "le"))
    with pytest.raises(ConfigError, match=rf"{key}: input should be less than or equal to {most}"):
        load_config(TINY, [f"{key}={most + 1}"])
    meaning = next(row[3] for row in key_rows() if row[0] == key)
    assert meaning.endswith(f" .. {most:,})"), meaning


def test_the_config_reference_states_each_keys_range_as_config_keys_does():
    import html

    from minigpt_cli.config.keys import key_rows

    text = html.unescape(CONFIG_PAGE.read_text(encoding="utf-8"))  # the page escapes < and >
    for key, _, _, meaning in key_rows():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{key}` |"))
        if meaning.endswith(")") and " .. " in meaning.rsplit("(", 1)[-1]:
            assert row.endswith(f"({meaning.rsplit('(', 1)[-1]} |"), row


@pytest.mark.parametrize(
    "flag,value,limit", [("--max-new-tokens", 2**64, "1048576"), ("--num-samples", 10**12, "1024")]
)
def test_generate_refuses_counts_past_the_stated_limit(cli, tmp_path, flag, value, limit):
    res = cli("generate", "--run", tmp_path / "no-run", flag, value)
    assert res.exit_code == 2
    assert (
        res.stderr.strip()
        == f"error: {flag} {value}: input should be less than or equal to {limit}"
    ), res.stderr


# ----------------------------------------------------------------------------- messages (issue 27
# §5)


def test_every_problem_of_a_yaml_is_reported_in_one_pass(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-3\n  batch_sise: 4\nmodel:\n  n_layr: 2\n  n_embd: -1\n")
    with pytest.raises(ConfigError, match=r"^\S+c\.yaml: 4 problems: \(1\) ") as e:
        load_config(p)
    assert "\n" not in str(e.value)
    text = str(e.value)
    for fragment in (
        "train.lr: unknown key; did you mean train.learning_rate?",
        "train.batch_sise: unknown key; did you mean train.batch_size?",
        "model.n_layr: unknown key; did you mean model.n_layer?",
        "model.n_embd: input should be greater than or equal to 1",
    ):
        assert fragment in text, text


def test_every_broken_rule_is_reported_together():
    with pytest.raises(ConfigError) as e:
        load_config(
            TINY,
            [
                "model.n_embd=30",
                "model.n_head=4",
                "model.n_kv_head=3",
                "train.min_lr=1",
                "train.learning_rate=0.1",
            ],
        )
    text = str(e.value)
    assert "3 problems" in text and "divisible by model.n_head" in text, text
    assert "multiple of model.n_kv_head" in text and "train.min_lr (1.0) must not exceed" in text, (
        text
    )


def test_a_list_key_given_a_value_shows_the_list_syntax(cli):
    res = cli("train", TINY, "--set", "tokenizer.special_tokens=<|endoftext|>", "--dry-run")
    assert res.exit_code == 2
    assert "input should be a valid list" in res.stderr
    assert "--set 'tokenizer.special_tokens=[a, b]'" in res.stderr, res.stderr
    cfg = load_config(
        TINY, ["tokenizer.special_tokens=[<|endoftext|>]"]
    )  # the syntax the hint shows works
    assert cfg.tokenizer.special_tokens == ["<|endoftext|>"]


def test_messages_name_what_is_wrong_with_odd_keys_and_long_numbers(tmp_path):
    """An empty part of a --set key, a key that starts with an invisible byte-order mark, a key YAML
    reads as no text (true, 1.5, null), and a number too long for YAML 1.1 to build: each named as
    it is."""
    p = tmp_path / "c.yaml"
    p.write_text("name: c\n")
    for key in (".seed", "seed.", "train..max_iters"):
        with pytest.raises(ConfigError, match=f"the key '{key}' has an empty part"):
            load_config(p, [f"{key}=5"])
    p.write_text("name: c\n\ufeffmodel:\n  n_layer: 2\n")
    with pytest.raises(ConfigError, match=r"'\\ufeffmodel': unknown key; did you mean model\?"):
        load_config(p)
    for text, said in [
        ("true: x\n", "the key true is a boolean in YAML"),
        ("model:\n  false: 1\n", "model: the key false is a boolean in YAML"),
        ("1.5: x\n", "the key 1.5 is a number in YAML"),
        ("~: x\n", "the key null is null in YAML"),
    ]:
        p.write_text("name: c\n" + text)
        with pytest.raises(ConfigError) as e:
            load_config(p)
        assert str(e.value) == (
            f"{p}: {said}, not a name; no config key is named so (minigpt config-keys lists them)"
        )
    long = "1_" + "0" * 450
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "c.yaml", [f"train.max_iters={long}"])
    assert "reads as an integer of more than 400 characters in YAML 1.1 and as the text " in str(
        e.value
    )
    assert len(str(e.value)) < 300  # both quotations shortened
