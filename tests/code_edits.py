"""Edits to kernel sources that see the code and nothing else.

The mutation list (scripts/mutants.py) and the tests that break a kernel on purpose (remove a
barrier, widen a guard) find their place in a source by its code, never by its comments or
its layout: a pattern and the source are both cut into tokens (words, numbers, single
punctuation characters; a string literal's contents too), comments and whitespace dropped,
and the pattern matches where its tokens occur in a row. So a reworded comment, a reflowed
line or clang-format's spacing leaves every edit applying as before, and an edit that no
longer finds its code says so instead of silently changing nothing.

    replace_code(text, "__syncthreads();\\nbuf ^= 1;", "buf ^= 1;")  # the barrier before the swap

A pattern that is ambiguous is made longer (a neighbouring statement), not anchored on a
comment; ``count`` says how many places it must match (1 unless stated).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int


def language_of(path: str | Path) -> str:
    """'python' for .py files, else 'c' (C, C++, CUDA and their headers)."""
    return "python" if str(path).endswith(".py") else "c"


def _string_end(text: str, start: int, quote: str) -> int:
    """Index just past the closing ``quote`` of the literal whose opening quote ends at ``start``."""
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(quote, i):
            return i + len(quote)
        if len(quote) == 1 and text[i] == "\n":  # an unterminated one-line literal ends at the line
            return i
        i += 1
    return len(text)


def _split_code(text: str, start: int, end: int, tokens: list[Token]) -> None:
    i = start
    while i < end:
        char = text[i]
        if char.isspace() or text.startswith("\\\n", i):  # a line continuation is layout too
            i += 2 if char == "\\" else 1
            continue
        word = WORD.match(text, i, end)
        stop = word.end() if word else i + (2 if char == "\\" else 1)
        tokens.append(Token(text[i:stop], i, stop))
        i = stop


def _scan(text: str, language: str) -> tuple[list[Token], list[int]]:
    """(code tokens, start offsets of the line comments) of ``text``."""
    out: list[Token] = []
    line_comments: list[int] = []
    line_comment = "#" if language == "python" else "//"
    quotes = ('"""', "'''", '"', "'") if language == "python" else ('"', "'")
    i, code_start = 0, 0
    while i < len(text):
        if text.startswith(line_comment, i):
            _split_code(text, code_start, i, out)
            line_comments.append(i)
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            code_start = i
            continue
        if language == "c" and text.startswith("/*", i):
            _split_code(text, code_start, i, out)
            close = text.find("*/", i + 2)
            i = len(text) if close < 0 else close + 2
            code_start = i
            continue
        quote = next((q for q in quotes if text.startswith(q, i)), None)
        if quote:
            _split_code(text, code_start, i, out)
            end = _string_end(text, i + len(quote), quote)
            closed = end - len(quote) >= i + len(quote) and text.startswith(quote, end - len(quote))
            inner_end = end - len(quote) if closed else end
            out.append(Token(quote, i, i + len(quote)))
            _split_code(text, i + len(quote), inner_end, out)
            if closed:
                out.append(Token(quote, inner_end, end))
            i = code_start = end
            continue
        i += 1
    _split_code(text, code_start, len(text), out)
    return out, line_comments


def tokens(text: str, language: str = "c") -> list[Token]:
    """The code tokens of ``text``: comments and whitespace left out, string contents split too."""
    return _scan(text, language)[0]


def find_code(text: str, pattern: str, language: str = "c") -> list[tuple[int, int]]:
    """The (start, end) spans of ``text`` where ``pattern``'s tokens occur in a row, left to right,
    not overlapping."""
    wanted = [t.text for t in tokens(pattern, language)]
    if not wanted:
        raise ValueError(f"the pattern {pattern!r} has no code in it")
    have = tokens(text, language)
    spans, i = [], 0
    while i + len(wanted) <= len(have):
        if all(have[i + j].text == w for j, w in enumerate(wanted)):
            spans.append((have[i].start, have[i + len(wanted) - 1].end))
            i += len(wanted)
        else:
            i += 1
    return spans


def replace_code(
    text: str, old: str, new: str, *, language: str = "c", count: int | None = 1, first_only: bool = False
) -> str:
    """``text`` with every place ``old``'s code occurs replaced by ``new`` (inserted as written),
    or only the first place with ``first_only``.

    Raises LookupError when ``old`` occurs a number of times other than ``count`` (None: any
    number but zero), naming the pattern, so a stale edit fails loudly."""
    spans = find_code(text, old, language)
    if not spans or (count is not None and len(spans) != count):
        expected = "at least once" if count is None else f"{count} time(s)"
        raise LookupError(f"the code {old!r} occurs {len(spans)} time(s), expected {expected}")
    for start, end in reversed(spans[:1] if first_only else spans):
        text = text[:start] + new + text[end:]
    return text


def comment_lines(text: str, language: str = "c") -> list[int]:
    """Indexes (from 0) of the lines that end inside a line comment, where a word can be appended."""
    return sorted({text.count("\n", 0, offset) for offset in _scan(text, language)[1]})
