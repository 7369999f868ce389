"""One-line notes on a config (:data:`RULES`): what it sets that cannot take effect, and where a
variant departs from its source. A setting without effect is noted only when the user gave it
(:func:`given`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Optional

from ..paths import corpus_path
from .schema import Config, TrainConfig

#: The schedules that decay to ``train.min_lr`` at ``train.lr_decay_iters``
#: (:func:`~minigpt_cli.trainer.lr_at`).
DECAYING = ("cosine", "linear")


@dataclass(frozen=True)
class Facts:
    """What a rule may need besides the config: the ``route`` (``"config"`` or ``"generate"``), the
    prompt's length in tokens (on the config route an upper bound: its UTF-8 bytes), whether the
    named corpus is on disk."""

    route: str = "config"
    prompt_tokens: int = 1
    corpus_on_disk: bool = (
        False  # the named corpus is on disk and passes its checksum (the caller looks)
    )


@dataclass(frozen=True)
class Rule:
    """A note: ``key`` (checked only when the user gave it; None: always), ``when(c, f)``, the
    ``text`` (formatted with ``c``, ``key``, ``n[KEY]`` as spelled and :func:`_values`), and its
    ``route`` (None: both)."""

    key: Optional[str]
    when: Callable[[Config, Facts], bool]
    text: str
    route: Optional[str] = None


class _Names(dict):
    """How the user spelled each key on this route (``--top-k``); a key not in it is spelled as
    itself."""

    def __missing__(self, key: str) -> str:
        return key


def given(cfg: Config, key: str) -> bool:
    """Whether the user gave ``key`` (``section.key`` or top-level) a value of its own: set in the
    YAML or a ``--set`` (pydantic's ``model_fields_set``), and neither null nor its default."""
    section_name, _, name = key.rpartition(".")
    section = getattr(cfg, section_name) if section_name else cfg
    if name not in section.model_fields_set:
        return False
    value = getattr(section, name)
    return value is not None and value != type(section).model_fields[name].get_default(
        call_default_factory=True
    )


def evals_in_run(tc: TrainConfig) -> int:
    """The evals a run from step 0 to ``train.max_iters`` makes
    (:func:`~minigpt_cli.trainer.should_eval`)."""
    n = tc.max_iters // tc.eval_interval + 1 + (tc.max_iters % tc.eval_interval != 0)
    return n - (not tc.eval_at_start and tc.max_iters > 0)


def _never_slides(c: Config, f: Facts) -> bool:
    """Whether no sample (``sample.max_new_tokens``; on the config route also
    ``train.sample_tokens``) grows past block_size + 1 tokens with one more to draw: then the window
    never slides."""
    block = c.model.block_size
    seen = min(f.prompt_tokens, block)  # a longer prompt is cropped to its last block_size tokens
    lengths = [c.sample.max_new_tokens] + ([c.train.sample_tokens] if f.route == "config" else [])
    return all(seen + n < block + 2 for n in lengths)


def _values(cfg: Config, f: Facts) -> dict[str, Any]:
    """The derived values the templates name."""
    tc, warmup = cfg.train, max(cfg.train.warmup_iters, 1)
    # inverse_sqrt peaks at step+1 = warmup: d^-0.5 · warmup^-0.5, times learning_rate (Vaswani et
    # al. 2017 §5.3).
    peak = cfg.model.n_embd**-0.5 * warmup**-0.5
    evals = evals_in_run(tc)
    return {
        "corpus": corpus_path(cfg.data.data_dir, cfg.data.dataset),
        "paper_peak": peak,
        "run_peak": tc.learning_rate * peak,
        "evals": evals,
        "evals_after_first": max(evals - 1, 0),
        "prompt_tokens": f.prompt_tokens,
    }


_NO_DECAY = (
    "note: {key} has no effect with train.lr_schedule {c.train.lr_schedule}: only the cosine and linear "
    "schedules decay to train.min_lr at train.lr_decay_iters (wsd: to train.min_lr at train.max_iters)"
)
_GREEDY = (
    "note: {key} has no effect with {n[sample.temperature]} 0: greedy decoding always takes the likeliest "
    "token"
)


#: Every note, in the order printed.
def _ramp_rules(key: str, iters: str, ramp: str, whole: str) -> tuple[Rule, Rule]:
    """A ramp's two notes: ``train.{key}`` given while the ramp is off (``train.{iters}`` 0), and a
    ramp longer than the run (no step trains ``whole``)."""
    return (
        Rule(
            f"train.{key}",
            lambda c, f: not getattr(c.train, iters),
            f"note: train.{key} has no effect with train.{iters} 0 ({ramp} is off); set "
            f"train.{iters} to its steps",
        ),
        Rule(
            f"train.{iters}",
            lambda c, f: getattr(c.train, iters) > c.train.max_iters > 0,
            f"note: {ramp} (train.{iters} {{c.train.{iters}}}) ends after train.max_iters "
            f"({{c.train.max_iters}}): no step trains {whole}",
        ),
    )


RULES: tuple[Rule, ...] = (
    # Settings that cannot take effect in this combination.
    Rule(
        "data.url",
        lambda c, f: bool(c.data.url.strip()) and f.corpus_on_disk,
        "note: data.url is not fetched: {corpus} is on disk and passes its checksum, so it is used as it is; "
        "data.url only names a mirror of that same file (for your own text, set data.path)",
    ),
    Rule(
        "tokenizer.vocab_size",
        lambda c, f: c.tokenizer.kind == "char",
        "note: tokenizer.vocab_size ({c.tokenizer.vocab_size}) has no effect with tokenizer.kind char: the "
        "corpus's characters decide its size; drop it, or pick a trained kind (bpe, wordpiece, unigram)",
    ),
    Rule(
        "model.rope_base",
        lambda c, f: c.model.pos_encoding != "rope",
        "note: model.rope_base has no effect with model.pos_encoding {c.model.pos_encoding}: it sets the "
        "rotary frequencies of model.pos_encoding rope",
    ),
    Rule(
        "model.multiple_of",
        lambda c, f: c.model.ffn != "swiglu",
        "note: model.multiple_of has no effect with model.ffn {c.model.ffn}: it rounds the derived width of "
        "model.ffn swiglu",
    ),
    Rule(
        "model.multiple_of",
        lambda c, f: c.model.ffn == "swiglu" and c.model.d_ff is not None,
        "note: model.multiple_of has no effect when model.d_ff is set ({c.model.d_ff}): it rounds only the "
        "derived width",
    ),
    Rule("train.min_lr", lambda c, f: c.train.lr_schedule not in (*DECAYING, "wsd"), _NO_DECAY),
    Rule("train.lr_decay_iters", lambda c, f: c.train.lr_schedule not in DECAYING, _NO_DECAY),
    Rule(
        "train.keep_every",
        lambda c, f: c.train.keep_every > c.train.max_iters,
        "note: train.keep_every ({c.train.keep_every}) is beyond train.max_iters ({c.train.max_iters}): no "
        "checkpoints/step-NNNNNNN is kept",
    ),
    Rule("sample.top_k", lambda c, f: c.sample.temperature == 0, _GREEDY),
    Rule("sample.top_p", lambda c, f: c.sample.temperature == 0, _GREEDY),
    Rule(
        "sample.window_stride",
        _never_slides,
        "note: sample.window_stride has no effect: the context window never slides, as sample.prompt (at most "
        "{prompt_tokens} token(s)) followed by sample.max_new_tokens ({c.sample.max_new_tokens}) or "
        "train.sample_tokens ({c.train.sample_tokens}) tokens stays within model.block_size "
        "({c.model.block_size}); it applies to longer samples (minigpt generate --max-new-tokens N)",
        "config",
    ),
    Rule(
        "sample.window_stride",
        _never_slides,
        "note: {key} has no effect: the context window never slides, as the prompt ({prompt_tokens} token(s)) "
        "followed by {n[sample.max_new_tokens]} {c.sample.max_new_tokens} stays within the model's block_size "
        "({c.model.block_size}); it applies only past block_size",
        "generate",
    ),
    # Values derived from others. With lr_decay_iters null (= max_iters) the load check cannot
    # refuse this, and short trial runs of a recipe (--set train.max_iters=50) are legitimate: a
    # note, not an error.
    Rule(
        None,
        lambda c, f: (
            c.train.lr_schedule != "inverse_sqrt" and 0 < c.train.max_iters < c.train.warmup_iters
        ),
        "note: train.max_iters ({c.train.max_iters}) ends inside the warmup (train.warmup_iters "
        "{c.train.warmup_iters}): the learning rate never reaches train.learning_rate",
    ),
    Rule(
        "train.ema_start",
        lambda c, f: c.train.ema_decay is None,
        "note: train.ema_start has no effect with train.ema_decay null (no weight EMA is kept); set "
        "train.ema_decay too, e.g. 0.999",
    ),
    Rule(
        None,
        lambda c, f: c.train.ema_decay is not None and c.train.ema_start >= c.train.max_iters > 0,
        "note: train.ema_start ({c.train.ema_start}) is not before train.max_iters "
        "({c.train.max_iters}): the EMA equals the weights to the end, never an average; lower "
        "train.ema_start",
    ),
    *_ramp_rules(
        "batch_size_warmup_start",
        "batch_size_warmup_iters",
        "the batch-size ramp",
        "at train.batch_size ({c.train.batch_size})",
    ),
    *_ramp_rules(
        "block_size_warmup_multiple",
        "block_size_warmup_iters",
        "the sequence-length warmup",
        "on whole windows of model.block_size ({c.model.block_size})",
    ),
    Rule(
        "train.early_stop_patience",
        lambda c, f: c.train.early_stop_patience >= evals_in_run(c.train),
        "note: train.early_stop_patience ({c.train.early_stop_patience}) can never stop this run: it evaluates "
        "{evals} time(s) (train.max_iters {c.train.max_iters}, train.eval_interval {c.train.eval_interval}) and "
        "the first eval sets the best val loss, so at most {evals_after_first} can follow without a new best; "
        "lower it, or raise train.max_iters",
    ),
    # Variants that depart from their source.
    Rule(
        None,
        lambda c, f: c.model.pos_encoding == "sinusoidal" and not c.model.emb_scale,
        "note: model.pos_encoding sinusoidal without model.emb_scale departs from Vaswani et al. 2017 (§3.4 "
        "scales embeddings by sqrt(n_embd)); set model.emb_scale=true to follow it",
    ),
    Rule(
        None,
        lambda c, f: c.model.ffn == "swiglu" and c.model.bias,
        "note: model.ffn swiglu with model.bias true departs from Shazeer 2020 (§2, eq. 6: SwiGLU has no bias "
        "terms, nor have PaLM and Llama); set model.bias=false to follow it",
    ),
    Rule(
        None,
        lambda c, f: c.train.lr_schedule == "inverse_sqrt" and c.train.learning_rate != 1.0,
        "note: train.lr_schedule inverse_sqrt with train.learning_rate {c.train.learning_rate:g} departs from "
        "Vaswani et al. 2017 (§5.3's formula has no such factor: its peak here would be {paper_peak:.2e}, this "
        "run's is {run_peak:.2e}); set train.learning_rate=1 to follow it",
    ),
)


def notes(
    cfg: Config,
    *,
    route: str = "config",
    given_keys: Optional[Collection[str]] = None,
    names: Optional[Mapping[str, str]] = None,
    prompt_tokens: Optional[int] = None,
    corpus_on_disk: bool = False,
) -> list[str]:
    """The notes :data:`RULES` give ``cfg``, one line each, starting ``note: ``. ``given_keys``: the
    keys the user gave (None: :func:`given`); ``names``: how they were spelled (``{"sample.top_k":
    "--top-k"}``)."""
    if prompt_tokens is None:
        prompt_tokens = max(len(cfg.sample.prompt.encode("utf-8", "surrogatepass")), 1)
    facts = Facts(route, prompt_tokens, corpus_on_disk)
    spelled = _Names(names or {})
    values: Optional[dict[str, Any]] = None
    out = []
    for rule in RULES:
        if rule.route not in (None, route) or (
            route == "generate" and not (rule.key or "").startswith("sample.")
        ):
            continue
        if rule.key is not None and not (
            given(cfg, rule.key) if given_keys is None else rule.key in given_keys
        ):
            continue
        if rule.when(cfg, facts):
            values = values if values is not None else _values(cfg, facts)
            key = spelled[rule.key] if rule.key is not None else None
            out.append(rule.text.format(c=cfg, key=key, n=spelled, **values))
    return out
