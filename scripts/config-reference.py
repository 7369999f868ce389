"""Rewrite docs/config.md's key table from the schema (tests/test_docs.py checks the two agree)."""

from pathlib import Path

from minigpt_cli.config.keys import markdown_reference

PAGE = Path(__file__).resolve().parent.parent / "docs" / "config.md"
MARK = "<!-- config-keys:"

text = PAGE.read_text(encoding="utf-8")
start = text.index("\n", text.index(MARK)) + 1  # the table starts on the line after the marker
end = text.index("\n\n", start)
PAGE.write_text(text[:start] + markdown_reference() + text[end:], encoding="utf-8")
print(f"wrote {PAGE}")
