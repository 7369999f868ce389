"""The one-line messages for a config that fails validation, with a hint for an unknown key.

Kept apart from the schema (:mod:`minigpt_cli.config.schema`) so that the message texts stay out of the rules'
way: a misspelt key is pointed to the key meant (the same key in another section, another tool's name for
it, a close spelling), a bad value is named with what was given.
"""

from __future__ import annotations

import difflib
import reprlib
from typing import Any

#: Shows a value in an error message, cut to a readable length.
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = 80
_short_repr.maxlist = _short_repr.maxdict = 6
_short_repr.maxlevel = 3

#: How alike (difflib's ratio of two key names) a misspelling must be to be suggested: "learnig_rate" and
#: "trian" pass, "seed" for "sample" or "n_layer" for "min_lr" do not.
_CLOSE = 0.75


#: Other tools' names for our keys (Hugging Face, nanoGPT's short forms): an unknown key named so is pointed here.
_ALIASES = dict(lr="learning_rate", warmup="warmup_iters", warmup_steps="warmup_iters", temp="temperature",
                gradient_accumulation_steps="grad_accum_steps", rope_theta="rope_base", ffn_dim="d_ff",
                intermediate_size="d_ff", n_layers="n_layer", num_hidden_layers="n_layer", n_heads="n_head",
                num_attention_heads="n_head", hidden_size="n_embd", d_model="n_embd", max_steps="max_iters",
                num_key_value_heads="n_kv_head", max_position_embeddings="block_size")


#: The cross-field rules of the model section (and the sample section's stride against it); ``{fit}`` is
#: :meth:`~minigpt_cli.config.schema.ModelConfig.fitting_width`, a width every rule on it accepts.
MODEL_RULES = {
    "divisible": "model.n_embd ({n_embd}) must be divisible by model.n_head ({n_head}); e.g. n_embd={fit}",
    "rope": ("model.pos_encoding=rope needs an even head size, but model.n_embd/model.n_head = {n_embd}/{n_head} "
             "= {head}; e.g. n_embd={fit}"),
    "sinusoidal": "model.pos_encoding=sinusoidal needs an even model.n_embd, got {n_embd}; e.g. n_embd={fit}",
    "kv_above": ("model.n_kv_head ({n_kv_head}) must not exceed model.n_head ({n_head}); grouped-query attention "
                 "shares each key/value head among n_head/n_kv_head query heads"),
    "kv_divisor": "model.n_head ({n_head}) must be a multiple of model.n_kv_head ({n_kv_head})",
    "window_stride": ("sample.window_stride: {stride} is larger than model.block_size ({block_size}); "
                      "use 1 .. {block_size}"),
}


def _suggest(loc: str, keys: list[str]) -> str:
    """The hint for an unknown key: where the same key lives (another section, or the top level; in any
    letter case, or by another tool's name for it), else the key it begins (``lr_decay``), else a close
    spelling in the same section, else anywhere; else the advice to remove it."""
    section, _, name = loc.rpartition(".")
    place = lambda key: key if "." in key or not section else f"top-level {key}"  # noqa: E731
    wanted = _ALIASES.get(name.lower(), name.lower())
    same = [key for key in keys if key.rpartition(".")[2] == wanted and key.lower() != loc.lower()]
    same = same or [key for key in keys if key.lower() == loc.lower() and key != loc]
    if not same and len(name) >= 3:
        same = [key for key in keys if key.rpartition(".")[0] == section
                and key.rpartition(".")[2].startswith(name.lower() + "_")]
    if not same:
        for pool in ([k for k in keys if k.rpartition(".")[0] == section], keys):
            names = {k.rpartition(".")[2]: k for k in pool}
            close = difflib.get_close_matches(name, list(names), n=1, cutoff=_CLOSE)
            if close:
                same = [names[close[0]]]
                break
    if same:
        return f"did you mean {' or '.join(place(key) for key in same)}?"
    return "remove it (the Configs section of README.md lists the keys)"


def format_error(err: dict[str, Any], source: str, keys: list[str]) -> str:
    """One line for pydantic's error ``err`` (its ``loc``, ``type``, ``msg`` and ``input``) in a config from
    ``source``; ``keys`` are every ``section.key`` of the schema, for the hint after an unknown key."""
    loc = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{source}: {loc}: unknown key; {_suggest(loc, keys)}"
    msg = err["msg"]
    if err["type"] == "model_type":  # "valid dictionary or instance of TrainConfig": a section given a value
        return (f"{source}: {loc or 'config'}: is a section, not a value (got {_short_repr.repr(err.get('input'))}); "
                f"give it keys: a mapping under {loc or 'train'}: in the file, or --set {loc or 'train'}.KEY=VALUE")
    if msg.startswith("Value error, "):
        # Cross-field rules already name their keys.
        return f"{source}: {msg[len('Value error, '):]}"
    got = err.get("input")
    got_s = "" if isinstance(got, dict) else f" (got {_short_repr.repr(got)})"
    return f"{source}: {loc or 'config'}: {msg[0].lower() + msg[1:]}{got_s}"
