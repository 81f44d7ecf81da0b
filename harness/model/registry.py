"""The registry: every implementation, in reading order (simplest first).

Each backend module registers its own implementations with ``register`` when it is imported;
``harness/backends/__init__.py`` imports them in reading order, the only list (and the
registry imports none of them: it sits below the backends). A user's own
implementation joins the same way: ``harness.register(harness.Implementation(...))``.
"""

from __future__ import annotations

import fnmatch

from harness.model.core import Implementation

REGISTRY: dict[str, Implementation] = {}


def register(impl: Implementation, *, replace: bool = False) -> Implementation:
    """Add ``impl`` to the registry (after those registered before it) and return it. A name
    already taken is an error unless ``replace`` (a learner's edited copy of a kernel)."""
    if not isinstance(impl, Implementation):
        raise TypeError(f"register() takes an Implementation, got {type(impl).__name__}")
    if "." not in impl.name:
        raise ValueError(f"an implementation's name is '<language>.<technique>', got {impl.name!r}")
    if impl.name in REGISTRY and not replace:
        raise ValueError(
            f"an implementation named {impl.name!r} is already registered (pass replace=True to replace it)"
        )
    REGISTRY[impl.name] = impl
    return impl


def implementations(*patterns: str) -> list[Implementation]:
    """Implementations named by ``patterns`` (exact names, else glob patterns; all if none), in
    registry order. A pattern that matches nothing is an error, so a typo is not silent."""
    patterns = [p for p in patterns if p is not None]
    if not patterns:
        return list(REGISTRY.values())
    chosen = set()
    for pattern in patterns:
        if pattern in REGISTRY:  # a name is itself, even one with glob characters (a user's "[c].c")
            matched = {pattern}
        else:
            matched = {name for name in REGISTRY if fnmatch.fnmatchcase(name, pattern) or name.split(".")[0] == pattern}
        if not matched:
            raise KeyError(f"no implementation matches {pattern!r}; known: {', '.join(REGISTRY)}")
        chosen |= matched
    return [impl for name, impl in REGISTRY.items() if name in chosen]


def describe(impl: Implementation) -> str | None:
    """What the implementation runs on this machine when that varies (a peer library's version
    and kernel set), or None."""
    if not impl.available:
        return None
    try:
        return impl.backend.describe(impl)
    except Exception as error:  # a description is a courtesy: never a reason for a row to fail
        return f"({type(error).__name__}: {error})"


def lookup(name: str) -> Implementation:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(REGISTRY)}") from None
