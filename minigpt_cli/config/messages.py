"""The one-line messages for a config that fails validation: a misspelt key is pointed to the key
meant (in another section, by another tool's name, a close spelling), a bad value is named with what
was given."""

from __future__ import annotations

import difflib
import reprlib
from typing import Any, Sequence

#: Shows a value in an error message, cut to a readable length.
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = 80
_short_repr.maxlist = _short_repr.maxdict = 6
_short_repr.maxlevel = 3

#: How alike (difflib's ratio of two key names) a misspelling must be to be suggested: "learnig_rate" and
#: "trian" pass, "seed" for "sample" or "n_layer" for "min_lr" do not.
_CLOSE = 0.75


#: Other tools' names for our keys (Hugging Face, nanoGPT's short forms): an unknown key named so is
#: pointed here.
_ALIASES = dict(
    lr="learning_rate",
    warmup="warmup_iters",
    warmup_steps="warmup_iters",
    temp="temperature",
    gradient_accumulation_steps="grad_accum_steps",
    rope_theta="rope_base",
    ffn_dim="d_ff",
    intermediate_size="d_ff",
    n_layers="n_layer",
    num_hidden_layers="n_layer",
    n_heads="n_head",
    num_attention_heads="n_head",
    hidden_size="n_embd",
    d_model="n_embd",
    max_steps="max_iters",
    num_key_value_heads="n_kv_head",
    max_position_embeddings="block_size",
)


#: What a value refused by a pattern is told, by key (pydantic would quote the regular expression).
_PATTERNS = {
    "name": "may only hold ASCII letters, digits, '.', '_' and '-'",
    "device": "is not one of auto, cpu, cuda, cuda:N, mps",
}

#: How a list is written, for a key that wants one.
_LIST_EXAMPLE = (
    "write a list in brackets: {loc}: [a, b] in the file, or --set '{loc}=[a, b]' "
    "(e.g. --set 'tokenizer.special_tokens=[<|endoftext|>]')"
)


def _suggest(loc: str, keys: list[str]) -> str:
    """The hint for an unknown key: where the same key lives (another section, or the top level; in
    any letter case, or by another tool's name for it), else the key it begins (``lr_decay``), else
    a close spelling in the same section, else anywhere; else the advice to remove it."""
    section, _, name = loc.rpartition(".")
    place = lambda key: key if "." in key or not section else f"top-level {key}"  # noqa: E731
    wanted = _ALIASES.get(name.lower(), name.lower())
    same = [key for key in keys if key.rpartition(".")[2] == wanted and key.lower() != loc.lower()]
    # train.lr is train.learning_rate, not also train.muon.learning_rate: the same section first,
    # else no nested one.
    same = (
        [k for k in same if k.rpartition(".")[0] == section]
        or [k for k in same if k.count(".") <= 1]
        or same
    )
    same = same or [key for key in keys if key.lower() == loc.lower() and key != loc]
    if not same and len(name) >= 3:
        same = [
            key
            for key in keys
            if key.rpartition(".")[0] == section
            and key.rpartition(".")[2].startswith(name.lower() + "_")
        ]
    if not same:
        for pool in ([k for k in keys if k.rpartition(".")[0] == section], keys):
            names: dict[str, str] = {}
            for (
                k
            ) in pool:  # the first key of a name: train.learning_rate, not train.muon.learning_rate
                names.setdefault(k.rpartition(".")[2], k)
            close = difflib.get_close_matches(name, list(names), n=1, cutoff=_CLOSE)
            if close:
                same = [names[close[0]]]
                break
    if same:
        return f"did you mean {' or '.join(place(key) for key in same)}?"
    return "remove it (minigpt config-keys lists the keys)"


def format_errors(
    errors: list[dict[str, Any]], source: str, overridden: Sequence[str], keys: list[str]
) -> str:
    """One line for pydantic's ``errors`` (each with its ``loc``, ``type``, ``msg`` and ``input``)
    in a config from ``source``: the problem when there is one, else each numbered. ``overridden``:
    the keys ``--set`` gave (a problem with one of them names ``--set``); ``keys``: every
    ``section.key``, for the hints."""
    problems = [
        (where, text) for err in errors for where, text in _problems(err, source, overridden, keys)
    ]
    if len(problems) == 1:
        return f"{problems[0][0]}: {problems[0][1]}"
    return f"{source}: {len(problems)} problems: " + " ".join(
        f"({i}) {text if where == source else f'{where}: {text}'}"
        for i, (where, text) in enumerate(problems, 1)
    )


def _problems(err: dict[str, Any], source: str, overridden: Sequence[str], keys: list[str]):
    """(where, text) for one pydantic error: ``where`` is ``source``, ``--set`` or ``source with
    --set KEY``."""
    loc = ".".join(str(p) for p in err["loc"])
    file = source
    if any(loc == key or loc.startswith(key + ".") for key in overridden):
        source = "--set"  # the bad value is one the command line gave
    else:  # a rule over a whole section (or the config) that a --set value may be part of
        within = [key for key in overridden if not loc or key.startswith(loc + ".")]
        source = f"{source} with --set {', '.join(dict.fromkeys(within))}" if within else source
    kind, msg, got = err["type"], err["msg"], err.get("input")
    if kind == "invalid_key":  # the loc holds the key as a number (True is 1): named as read
        section = ".".join(str(p) for p in err["loc"][:-1])
        written = "null" if got is None else str(got).lower() if isinstance(got, bool) else str(got)
        what = (
            "null"
            if got is None
            else "a boolean"
            if isinstance(got, bool)
            else "a number"
            if isinstance(got, (int, float))
            else f"a {type(got).__name__}"
        )
        yield (
            source,
            f"{section + ': ' if section else ''}the key {written} is {what} in YAML, not a name; "
            "no config key is named so (minigpt config-keys lists them)",
        )
        return
    if kind == "extra_forbidden":
        shown = loc if loc.isprintable() else repr(loc)  # an invisible byte-order mark, a tab
        yield source, f"{shown}: unknown key; {_suggest(loc, keys)}"
    elif kind == "model_type" and not loc:  # the file itself: no --set made it so
        yield file, f"the top level must be a mapping of sections, got {type(got).__name__}"
    elif (
        kind == "model_type"
    ):  # "valid dictionary or instance of TrainConfig": a section given a value
        yield (
            source,
            (
                f"{loc}: is a section, not a value (got {_short_repr.repr(got)}); give it keys: a mapping "
                f"under {loc}: in the file, or --set {loc}.KEY=VALUE"
            ),
        )
    elif msg.startswith("Value error, "):  # the cross-field rules, one a line; they name their keys
        yield from ((source, rule) for rule in msg[len("Value error, ") :].splitlines())
    elif kind == "string_pattern_mismatch" and loc in _PATTERNS:
        yield source, f"{loc}: {got!r} {_PATTERNS[loc]}"
    else:
        hint = {
            "list_type": _LIST_EXAMPLE.format(loc=loc),
            "bool_type": "write true or false",
            "string_too_short": "give a folder (. is the current one)",
        }.get(kind)
        hint = f"; {hint}" if hint else ""
        got_s = "" if isinstance(got, dict) else f" (got {_short_repr.repr(got)})"
        yield source, f"{loc}: {msg[0].lower() + msg[1:]}{got_s}{hint}"
