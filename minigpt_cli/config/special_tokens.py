"""Special tokens (``<|endoftext|>``, ...): checking the configured list, and cutting text around them.

Pure Python with no dependencies inside the package but :mod:`.errors`, so
that the config (which refuses bad special tokens when it is read) and the
tokenizers both import it, and neither imports the other's way back.
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
    """What is wrong with a list of special tokens (an empty, padded or repeated entry, the unknown token), or
    None when each is non-empty text without whitespace at its ends, listed once."""
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
    """The special tokens as a list, checked (:func:`special_token_problem`).

    Raises:
        MinigptError: the problem.
    """
    tokens = list(special_tokens)
    problem = special_token_problem(tokens)
    if problem:
        raise MinigptError(problem)
    return tokens


def split_special(text: str, special_tokens: Sequence[str]) -> list[str]:
    """``text`` cut around its special tokens: [text, special, text, special, ..., text].

    Odd positions hold special tokens (longest match first); even positions
    hold the ordinary text between them, possibly empty.
    """
    if not special_tokens:
        return [text]
    alternatives = "|".join(re.escape(s) for s in sorted(special_tokens, key=len, reverse=True))
    return re.split(f"({alternatives})", text)
