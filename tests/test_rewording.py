"""Comments are for readers: rewording every one of them changes no test's outcome.

A scratch copy of the repository gets a word appended to every comment line of every .cu, .h
and .py file under cuda/ and triton/ (the ``@launch`` and ``@archs`` declarations aside: they
are the harness's input, not prose), then runs the fast tier and the mutation subset there. A test
that finds its place in a kernel by a comment's words, or a mutant anchored on one, fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from code_edits import comment_lines, language_of
from test_mutants import mutants  # its file list, and its BOOTSTRAP (the copy's harness imported)

from harness.backends.cuda.plans import FIELDS
from harness.env import sources

ROOT = Path(__file__).resolve().parents[1]
INNER_RUN = "MATMUL_REWORDED_RUN"  # set in the copy's runs, so this file does not run itself there
WORD = " (reworded)"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get(INNER_RUN)), reason="already inside the reworded copy"),
    pytest.mark.skipif(not sources.in_checkout() or shutil.which("git") is None, reason="copies a git checkout"),
]


def _is_launch_declaration(comment: str, previous_was_launch: bool) -> bool:
    """A comment the harness reads: a ``@launch`` declaration (and its continuation lines) or an
    ``@archs`` line (cuda/wgmma.cu's sm_90a)."""
    words = comment.split()
    return bool(words) and (words[0] in ("@launch", "@archs") or (previous_was_launch and words[0] in FIELDS))


def reword(path: Path) -> int:
    """Appends WORD to every line of ``path`` that ends in a comment; returns how many."""
    text = path.read_text()
    lines = text.split("\n")
    changed, in_launch = 0, False
    for number in comment_lines(text, language_of(path)):
        marker = "#" if language_of(path) == "python" else "//"
        comment = lines[number][lines[number].rfind(marker) + len(marker) :]
        in_launch = _is_launch_declaration(comment, in_launch)
        if not in_launch:
            lines[number] += WORD
            changed += 1
    path.write_text("\n".join(lines))
    return changed


def _copy_checkout(destination: Path) -> None:
    for name in mutants.repository_files():  # tracked and untracked, not ignored
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    # a checkout of its own: scripts/mutants.py copies what git lists
    for command in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(command, cwd=destination, check=True, capture_output=True)


def test_rewording_every_comment_under_cuda_and_triton_changes_no_outcome(tmp_path):
    copy = tmp_path / "repository"
    _copy_checkout(copy)
    kernels = [p for p in sorted((copy / "cuda").rglob("*")) + sorted((copy / "triton").rglob("*.py"))]
    changed = sum(reword(p) for p in kernels if p.suffix in (".cu", ".h", ".py"))
    assert changed > 500, f"only {changed} comment lines found to reword"
    tiled = (copy / "cuda" / "tiled.cu").read_text()
    assert "before the next phase overwrites it" + WORD in tiled and "@launch tiled" in tiled
    assert WORD not in tiled.split("@launch")[1].split("\n")[0], "the launch declaration is left as it is"

    # The copy builds its own C library (its tests truncate and rebuild it: never the checkout's).
    env = {**os.environ, INNER_RUN: "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MATMUL_C_LIBRARY", None)
    # test_no_shadowing asks what `import cuda` finds from the root of the checkout that is
    # installed; from a copy, the checkout's own folders are what is installed (editable).
    fast = subprocess.run(
        [
            sys.executable,
            "-c",
            mutants.BOOTSTRAP,
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "--deselect",
            "tests/test_no_shadowing.py",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert fast.returncode == 0, "the fast tier fails in the reworded copy:\n" + fast.stdout[-5000:]
    mutation = subprocess.run(
        [sys.executable, "scripts/mutants.py", "--fast", "--cache", str(tmp_path / "emulation")],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert mutation.returncode == 0, "the mutation subset fails in the reworded copy:\n" + mutation.stdout[-5000:]
