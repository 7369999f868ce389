"""Whether a train/val split leaves both sides enough tokens, and the one-line refusal when it does not.

A side needs one (x, y) window: ``block_size + 1`` tokens, and never fewer
than :data:`MIN_SPLIT_TOKENS` (a window of ``block_size`` 1). The refusal's
fix is one that is then accepted: a lower ``model.block_size`` only when
this split has a block size that fits, another ``data.val_fraction`` only
when the corpus is large enough for one (:func:`_fraction_that_fits`), and
otherwise that the corpus is too small, with the text it would take.
:func:`check_split_counts` is what :func:`~minigpt_cli.data.preparation.prepare`,
``train`` and ``train --dry-run`` refuse with. No torch here.
"""

from __future__ import annotations

import math
from typing import Optional

from ..errors import MinigptError

#: Fewest tokens a split can have: one (x, y) window with block_size 1.
MIN_SPLIT_TOKENS = 2

_MESSAGES = {
    "split": ("data.val_fraction={val_fraction:.12g} splits the corpus into {n_train:,} train and {n_val:,} val "
              "tokens, too few for {small} (they need {need_s}); {fix}"),
    "need_block": "at least model.block_size+1 = {need:,} tokens each",
    "need": "at least {need} tokens each",
    "another_fraction": "choose a data.val_fraction such as {fits:g}, ",
    "lower_block": "{another}lower model.block_size (to at most {most:,} with this split), or use more text",
    "fraction": "choose a data.val_fraction such as {fits:g}, or use more text",
    "fraction_and_block": ("choose a data.val_fraction such as {fits:g}, then a lower model.block_size (with this "
                           "split a side has under {least} tokens, which no block size fits), or use more text"),
    "too_small": ("the corpus is too small for any model.block_size ({total:,} tokens, and train and val need "
                  "{least} or more each); use more text: about {more:,} tokens give each side {need:,} with this "
                  "data.val_fraction"),
}


def _fraction_that_fits(val_fraction: float, total: int, need: int) -> Optional[float]:
    """A ``data.val_fraction`` leaving both sides at least ``need`` of ``total`` tokens (about): 0.1 when it
    does, else the nearest such value to ``val_fraction``, rounded to two digits; None when none can."""
    if total < 2 * need:
        return None
    lo, hi = need / total, 1 - need / total
    if lo >= hi:
        return None
    if lo <= 0.1 <= hi and val_fraction != 0.1:
        return 0.1
    fits = math.ceil(lo * 100 + 1) / 100 if val_fraction < lo or val_fraction == 0.1 else math.floor(hi * 100 - 1) / 100
    return fits if lo <= fits <= hi else round((lo + hi) / 2, 3)


def _fix(val_fraction: float, n_train: int, n_val: int, need: int, block_size: Optional[int]) -> str:
    """What to change, for a split with a side under ``need`` tokens: a value then accepted, or more text."""
    total, smallest = n_train + n_val, min(n_train, n_val)
    fits = _fraction_that_fits(val_fraction, total, need)  # another split, this block size
    if block_size is not None and smallest >= MIN_SPLIT_TOKENS:  # this split holds a window of smallest - 1
        another = _MESSAGES["another_fraction"].format(fits=fits) if fits is not None else ""
        return _MESSAGES["lower_block"].format(another=another, most=smallest - 1)
    if fits is not None:
        return _MESSAGES["fraction"].format(fits=fits)
    fits = _fraction_that_fits(val_fraction, total, MIN_SPLIT_TOKENS)  # another split and a smaller block
    if fits is not None:
        return _MESSAGES["fraction_and_block"].format(fits=fits, least=MIN_SPLIT_TOKENS)
    more = math.ceil(need / min(val_fraction, 1 - val_fraction)) if 0 < val_fraction < 1 else 2 * need
    return _MESSAGES["too_small"].format(total=total, least=MIN_SPLIT_TOKENS, more=more, need=need)


def check_split_counts(val_fraction: float, n_train: int, n_val: int, block_size: Optional[int] = None) -> None:
    """Refuse a split with fewer than :data:`MIN_SPLIT_TOKENS` tokens on a side
    (:func:`~minigpt_cli.data.preparation.prepare`'s refusal) or, given ``block_size``, fewer than ``block_size + 1``
    (:func:`~minigpt_cli.data.preparation.check_split_sizes`).

    Raises:
        MinigptError: one line naming ``data.val_fraction``, the token counts and the fix.
    """
    need = max(block_size + 1, MIN_SPLIT_TOKENS) if block_size is not None else MIN_SPLIT_TOKENS
    if min(n_train, n_val) >= need:
        return
    small = " and ".join(name for name, n in (("train", n_train), ("val", n_val)) if n < need)
    need_s = _MESSAGES["need_block" if block_size is not None else "need"].format(need=need)
    raise MinigptError(_MESSAGES["split"].format(
        val_fraction=val_fraction, n_train=n_train, n_val=n_val, small=small, need_s=need_s,
        fix=_fix(val_fraction, n_train, n_val, need, block_size)))
