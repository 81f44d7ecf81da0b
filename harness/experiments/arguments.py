"""The types of every command's options (the experiments' and ``compare``'s): a bad value is a
usage error that names its option, before anything is measured, not a row error or a traceback."""

from __future__ import annotations

import argparse
import math

from harness.model.inputs import shape_argument


def positive_seconds(text: str) -> float:
    """A time in seconds: a finite number > 0 (0, -1, nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: expected seconds, a number > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"invalid time {text}: expected a finite number of seconds > 0")
    return value


def count_at_least(lowest: int):
    """The type of a count: a whole number >= ``lowest``."""

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number >= {lowest}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"invalid number {value}: expected a whole number >= {lowest}")
        return value

    return count


def shape_without_zeros(text: str) -> str:
    """A shape, N or MxNxK, with no dimension 0 (a product of nothing has no time to measure),
    returned as given: the experiments compare their shapes' text with their defaults'."""
    shape = shape_argument(text)
    if 0 in shape:
        raise argparse.ArgumentTypeError(f"invalid shape {text!r}: every dimension must be 1 or more")
    return text


def nk_shape(text: str) -> str:
    """A weight matrix's shape NxK, both 1 or more, as "NxK" (decode's --batch-shape, prefill's --shape)."""
    n, _, k = text.strip().lower().partition("x")
    if not (n.isdigit() and k.isdigit() and int(n) >= 1 and int(k) >= 1):
        raise argparse.ArgumentTypeError(f"invalid shape {text!r}: expected NxK, both 1 or more, e.g. 4096x14336")
    return f"{int(n)}x{int(k)}"
