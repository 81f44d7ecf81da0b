"""tests/code_edits.py: edits find code by its tokens, whatever the comments and the layout say."""

from __future__ import annotations

import pytest
from code_edits import comment_lines, find_code, replace_code

KERNEL = """\
    __syncthreads();  // the tile is fully loaded
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  /* everyone is done */
    asm volatile("cp.async.commit_group;" ::: "memory");  // "quoted" // twice
"""


def test_a_pattern_matches_across_comments_and_reflowed_lines():
    dot = "for (int k = 0; k < TILE; ++k)\n        acc += As[ty][k] * Bs[k][tx];"
    edited = replace_code(KERNEL, dot + " __syncthreads();", "/* cut */")
    assert edited.count("__syncthreads();") == 1 and "/* cut */" in edited
    assert "everyone is done" in edited, "text outside the matched code is kept"


def test_comments_never_match_and_strings_do():
    assert find_code(KERNEL, "the tile is fully loaded") == []
    assert len(find_code(KERNEL, "cp.async.commit_group;")) == 1  # inside the asm string
    assert find_code(KERNEL, "quoted") == [], "a quote inside a comment is comment"


def test_a_count_that_differs_is_an_error_naming_the_code():
    with pytest.raises(LookupError, match=r"__syncthreads\(\);.*occurs 2 time"):
        replace_code(KERNEL, "__syncthreads();", "")
    assert replace_code(KERNEL, "__syncthreads();", "", count=2).count("__syncthreads") == 0
    assert replace_code(KERNEL, "__syncthreads();", "", count=None, first_only=True).count("__syncthreads") == 1
    with pytest.raises(LookupError, match="occurs 0 time"):
        replace_code(KERNEL, "__syncwarp();", "")


def test_python_comments_and_docstrings():
    source = 'def f(x):\n    """K is masked here"""\n    return x  # K is masked\ns = "a # b"\n'
    assert find_code(source, "return x", language="python") != []
    assert find_code(source, "is masked", language="python") != [], "a docstring is a string, not a comment"
    assert comment_lines(source, language="python") == [2]


def test_comment_lines_of_c():
    assert comment_lines(KERNEL) == [0, 3]
