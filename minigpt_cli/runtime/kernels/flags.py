"""The environment switches of the faster kernels (``MINIGPT_ONEDNN``, ``MINIGPT_FAST_DROPOUT``)."""

from __future__ import annotations

import os

from ...errors import MinigptError

_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")


def env_flag(name: str, on: str, off: str) -> bool:
    """Whether the environment variable ``name`` (default on) is on; ``on``/``off`` say what each
    means.

    Raises:
        MinigptError: the value is neither on (1, true, yes, on) nor off (0, false, no, off).
    """
    value = os.environ.get(name, "1")
    if value.strip().lower() not in _OFF + _ON:
        raise MinigptError(f"{name}={value!r}: use 1 ({on}) or 0 ({off})")
    return value.strip().lower() not in _OFF
