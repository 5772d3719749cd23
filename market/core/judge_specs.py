"""Judges by name: what a scenario's ``judge`` and ``conduct_judge`` fields build.

``rule`` names the core's own pitch judge (:class:`~market.core.judge.RuleJudge`) and conduct
reader (:class:`~market.core.conduct.reading.RuleReader`). Every other spec is built by the
factory registered for its *kind*, the part before the first ``?``
(``llm:openai?model=m&base_url=...`` has the kind ``llm:openai``); a factory registered for a
prefix ending in ``:`` (``llm:``) builds every kind that starts with it.

The core imports no room above it. The rooms that build model judges register their factories
when they are imported (:func:`register_judge`, :func:`register_reader`); the built-in LLM judges
are registered by the ``agents`` package. A spec whose kind has no factory yet makes this module
import the plug-in packages of :data:`PLUGIN_PACKAGES` once (so ``market.env(...)`` with an LLM
judge works in a script that never imported ``agents``) before it says the kind is unknown.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from market.core.conduct.reading import ConductReader, RuleReader
from market.core.judge import Judge, RuleJudge

__all__ = [
    "PLUGIN_PACKAGES",
    "UnknownJudgeError",
    "make_judge",
    "make_reader",
    "register_judge",
    "register_reader",
]

#: packages imported (once) when a spec names a kind no factory was registered for
PLUGIN_PACKAGES: tuple[str, ...] = ("agents",)

JudgeFactory = Callable[[str], Judge]
ReaderFactory = Callable[[str], ConductReader]
F = TypeVar("F")

_JUDGES: dict[str, JudgeFactory] = {}
_READERS: dict[str, ReaderFactory] = {}
_plugins_loaded = False


class UnknownJudgeError(ValueError):
    """A judge or conduct-reader spec whose kind no factory builds."""


def register_judge(prefix: str, factory: JudgeFactory) -> None:
    """Build pitch judges whose spec's kind is ``prefix`` (or starts with it, when it ends in
    ``:``) with ``factory(spec)``. Registering a prefix again replaces its factory."""
    _JUDGES[_checked(prefix)] = factory


def register_reader(prefix: str, factory: ReaderFactory) -> None:
    """As :func:`register_judge`, for conduct readers (a scenario's ``conduct_judge``)."""
    _READERS[_checked(prefix)] = factory


def make_judge(spec: str = "rule") -> Judge:
    """The pitch judge ``spec`` names: ``rule``, or a spec a registered factory builds."""
    if spec == "rule":
        return RuleJudge()
    return _factory(_JUDGES, spec, "judge")(spec)


def make_reader(spec: str = "rule") -> ConductReader:
    """The conduct reader ``spec`` names: ``rule``, or a spec a registered factory builds."""
    if spec == "rule":
        return RuleReader()
    return _factory(_READERS, spec, "conduct judge")(spec)


def _checked(prefix: str) -> str:
    if not prefix or "?" in prefix or prefix == "rule":
        raise ValueError(
            f"a judge factory's prefix must be a kind other than 'rule', got {prefix!r}"
        )
    return prefix


def _factory(table: dict[str, F], spec: str, what: str) -> F:
    global _plugins_loaded
    if not isinstance(spec, str) or not spec.strip():
        raise UnknownJudgeError(f"empty {what} spec: use 'rule' or 'llm:openai?model=NAME'")
    kind = spec.strip().partition("?")[0]
    found = _lookup(table, kind)
    if found is None and not _plugins_loaded:
        _plugins_loaded = True
        for package in PLUGIN_PACKAGES:
            importlib.import_module(package)
        found = _lookup(table, kind)
    if found is None:
        known = ", ".join(["rule", *sorted(table)]) or "rule"
        raise UnknownJudgeError(f"unknown {what} {kind!r}; known: {known} (e.g. 'rule')")
    return found


def _lookup(table: dict[str, F], kind: str) -> F | None:
    if kind in table:
        return table[kind]
    for prefix, factory in table.items():
        if prefix.endswith(":") and kind.startswith(prefix):
            return factory
    return None
