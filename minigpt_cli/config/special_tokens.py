"""Special tokens (``<|endoftext|>``, ...): checking a list, and cutting text around them (no torch;
the config and the tokenizers both import it).
"""

from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

from ..errors import MinigptError

#: The unknown token of the Unigram and WordPiece kinds (byte-level BPE has none).
UNK = "<unk>"
#: Spellings of an end-of-text token (GPT-2, SentencePiece, Llama 3, ...): the first special token of a
#: tokenizer that is one of these joins the documents of a corpus.
END_OF_TEXT = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|eot|>")


def special_token_problem(special_tokens: Iterable[str]) -> Optional[str]:
    """What is wrong with a list of special tokens (an empty, padded or repeated entry, the unknown
    token), or None when each is non-empty text without whitespace at its ends, listed once."""
    seen: set[str] = set()
    for s in special_tokens:
        if not isinstance(s, str) or not s or s != s.strip():
            return f"special token {s!r} must be non-empty text without spaces at its ends"
        if s == UNK:
            return f"special token {UNK!r} is the unknown token the tokenizer adds itself; drop it"
        if s in seen:
            return f"special token {s!r} is listed twice; list each once"
        seen.add(s)
    return None


def check_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    """The special tokens as a list, checked; MinigptError names the problem
    (:func:`special_token_problem`)."""
    tokens = list(special_tokens)
    problem = special_token_problem(tokens)
    if problem:
        raise MinigptError(problem)
    return tokens


def split_special(text: str, special_tokens: Sequence[str]) -> list[str]:
    """``text`` cut around its special tokens (longest first): [text, special, text, ..., text],
    text maybe empty."""
    if not special_tokens:
        return [text]
    alternatives = "|".join(re.escape(s) for s in sorted(special_tokens, key=len, reverse=True))
    return re.split(f"({alternatives})", text)
