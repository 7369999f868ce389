"""One-line notes on a config: what it sets that cannot take effect, and where a variant departs from its source.

:func:`notes` walks one table, :data:`RULES`: each rule is a condition on the
config and the note it prints (a ``str.format`` template), so the wording
lives here and nowhere else. ``train --dry-run`` and ``train`` print them
before anything runs. Three kinds:

- a setting that has no effect in the combination it is in (``model.rope_base``
  without RoPE, ``train.min_lr`` with a constant schedule, ...). Noted only
  when the user gave the key a value of its own (:func:`given`), so a config
  that writes out every key at its default (``configs/shakespeare.yaml``, a
  run's ``config.yaml``) gets none;
- a value derived from others that defeats a setting (``train.max_iters``
  ending inside the warmup);
- a variant that departs from the paper it comes from, with the section cited
  and the setting that follows it.

No torch here; the ``data.url`` rule reads the corpus file's checksum (about
5 ms for Tiny Shakespeare's 1 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from .config import Config
from .paths import corpus_path

#: The schedules that decay to ``train.min_lr`` at ``train.lr_decay_iters`` (:func:`~minigpt_cli.trainer.lr_at`).
DECAYING = ("cosine", "linear")


@dataclass(frozen=True)
class Rule:
    """A note and when it applies.

    ``key``: the setting the note is about; the rule is checked only when the
    user gave it (:func:`given`). None: checked on every config. ``text``: the
    note, formatted with ``c`` (the config), ``key`` and :func:`_values`.
    """

    key: Optional[str]
    when: Callable[[Config], bool]
    text: str


def given(cfg: Config, key: str) -> bool:
    """Whether the user gave ``key`` (``section.key`` or a top-level key) a value of its own.

    That is: it appears in the YAML or a ``--set`` (pydantic's ``model_fields_set``,
    which :func:`~minigpt_cli.config.load_config` keeps per section), and is
    neither null nor its default (a key written out at its default changes
    nothing, whether or not it takes effect).
    """
    section_name, _, name = key.rpartition(".")
    section = getattr(cfg, section_name) if section_name else cfg
    if name not in section.model_fields_set:
        return False
    value = getattr(section, name)
    return value is not None and value != type(section).model_fields[name].get_default(call_default_factory=True)


def _corpus_on_disk(cfg: Config) -> bool:
    from .download import file_ok  # requests: imported only when a url is set

    return file_ok(corpus_path(cfg.data.data_dir, cfg.data.dataset), cfg.data.dataset)


def _values(cfg: Config) -> dict[str, Any]:
    """The derived values the templates name."""
    tc, warmup = cfg.train, max(cfg.train.warmup_iters, 1)
    # inverse_sqrt peaks at step+1 = warmup: d^-0.5 · warmup^-0.5, times learning_rate (Vaswani et al. 2017 §5.3).
    peak = cfg.model.n_embd ** -0.5 * warmup ** -0.5
    return {"corpus": corpus_path(cfg.data.data_dir, cfg.data.dataset), "paper_peak": peak,
            "run_peak": tc.learning_rate * peak}


_NO_DECAY = ("note: {key} has no effect with train.lr_schedule {c.train.lr_schedule}: only the cosine and linear "
             "schedules decay to train.min_lr at train.lr_decay_iters")
_GREEDY = "note: {key} has no effect with sample.temperature 0: greedy decoding always takes the likeliest token"

#: Every note, in the order printed.
RULES: tuple[Rule, ...] = (
    # Settings that cannot take effect in this combination.
    Rule("data.url", lambda c: bool(c.data.url.strip()) and _corpus_on_disk(c),
         "note: data.url is not fetched: {corpus} is on disk and passes its checksum, so it is used as it is; "
         "data.url only names a mirror of that same file (training on your own text is not supported yet; a "
         "later version adds data.path)"),
    Rule("tokenizer.vocab_size", lambda c: c.tokenizer.kind == "char",
         "note: tokenizer.vocab_size ({c.tokenizer.vocab_size}) has no effect with tokenizer.kind char: the "
         "corpus's characters decide its size; drop it, or pick a trained kind (bpe, wordpiece, unigram)"),
    Rule("model.rope_base", lambda c: c.model.pos_encoding != "rope",
         "note: model.rope_base has no effect with model.pos_encoding {c.model.pos_encoding}: it sets the "
         "rotary frequencies of model.pos_encoding rope"),
    Rule("model.multiple_of", lambda c: c.model.ffn != "swiglu",
         "note: model.multiple_of has no effect with model.ffn {c.model.ffn}: it rounds the derived width of "
         "model.ffn swiglu"),
    Rule("model.multiple_of", lambda c: c.model.ffn == "swiglu" and c.model.d_ff is not None,
         "note: model.multiple_of has no effect when model.d_ff is set ({c.model.d_ff}): it rounds only the "
         "derived width"),
    Rule("train.min_lr", lambda c: c.train.lr_schedule not in DECAYING, _NO_DECAY),
    Rule("train.lr_decay_iters", lambda c: c.train.lr_schedule not in DECAYING, _NO_DECAY),
    Rule("train.keep_every", lambda c: c.train.keep_every > c.train.max_iters,
         "note: train.keep_every ({c.train.keep_every}) is beyond train.max_iters ({c.train.max_iters}): no "
         "checkpoints/step-NNNNNNN is kept"),
    Rule("sample.top_k", lambda c: c.sample.temperature == 0, _GREEDY),
    Rule("sample.top_p", lambda c: c.sample.temperature == 0, _GREEDY),
    # Values derived from others. With lr_decay_iters null (= max_iters) the load check cannot refuse this, and
    # short trial runs of a recipe (--set train.max_iters=50) are legitimate: a note, not an error.
    Rule(None, lambda c: c.train.lr_schedule != "inverse_sqrt" and 0 < c.train.max_iters < c.train.warmup_iters,
         "note: train.max_iters ({c.train.max_iters}) ends inside the warmup (train.warmup_iters "
         "{c.train.warmup_iters}): the learning rate never reaches train.learning_rate"),
    # Variants that depart from their source.
    Rule(None, lambda c: c.model.pos_encoding == "sinusoidal" and not c.model.emb_scale,
         "note: model.pos_encoding sinusoidal without model.emb_scale departs from Vaswani et al. 2017 (§3.4 "
         "scales embeddings by sqrt(n_embd)); set model.emb_scale=true to follow it"),
    Rule(None, lambda c: c.model.ffn == "swiglu" and c.model.bias,
         "note: model.ffn swiglu with model.bias true departs from Shazeer 2020 (§2, eq. 6: SwiGLU has no bias "
         "terms, nor have PaLM and Llama); set model.bias=false to follow it"),
    Rule(None, lambda c: c.train.lr_schedule == "inverse_sqrt" and c.train.learning_rate != 1.0,
         "note: train.lr_schedule inverse_sqrt with train.learning_rate {c.train.learning_rate:g} departs from "
         "Vaswani et al. 2017 (§5.3's formula has no such factor: its peak here would be {paper_peak:.2e}, this "
         "run's is {run_peak:.2e}); set train.learning_rate=1 to follow it"),
)


def notes(cfg: Config) -> list[str]:
    """The notes :data:`RULES` give ``cfg``, one line each, starting ``note: ``; empty when none applies.

    Raises nothing: a note never stops a run.
    """
    values: Optional[dict[str, Any]] = None
    out = []
    for rule in RULES:
        if (rule.key is None or given(cfg, rule.key)) and rule.when(cfg):
            values = values if values is not None else _values(cfg)
            out.append(rule.text.format(c=cfg, key=rule.key, **values))
    return out
