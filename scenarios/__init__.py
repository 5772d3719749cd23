"""Built-in scenario files (TOML, shipped as package data) and their loader.

``load_scenario("market_round")`` loads a built-in; ``load_scenario("path/to/file.toml")`` a file.
A file may ``extends = "market_round"`` and override keys. Errors name the file, key and problem:
every problem with a file or override, however malformed (even arrays nested hundreds deep), is a
:class:`ScenarioError` with a one-line-per-problem message, never another exception.
"""

from __future__ import annotations

import copy
import functools
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from market.core.scenario_schema import Scenario

__all__ = ["Scenario", "ScenarioError", "builtin_names", "load_scenario", "read_table"]


class ScenarioError(ValueError):
    """A scenario file or override is invalid; the message says where and how to fix it."""

    @property
    def problems(self) -> list[str]:
        """One line per problem: a schema error's ``key '...': ...`` lines, or the message."""
        lines = str(self).splitlines()
        listed = [line.strip().removeprefix("- ") for line in lines[1:] if line.strip()]
        return listed or [str(self)]


def builtin_names() -> list[str]:
    return sorted(
        p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".toml")
    )


def _read(name_or_path: str | Path, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """The raw (merged over ``extends``) table of a scenario, and the name of its source."""
    text_name = str(name_or_path)
    if text_name in builtin_names():
        source = f"built-in scenario '{text_name}'"
        text = resources.files(__name__).joinpath(f"{text_name}.toml").read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        source = str(path)
        if not path.is_file():
            raise ScenarioError(
                f"{text_name!r} is neither a built-in scenario ({', '.join(builtin_names())}) "
                "nor an existing TOML file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError(f"{source}: cannot be read as UTF-8 text: {exc}") from None
    if text_name in seen:
        raise ScenarioError(
            f"{source}: 'extends' forms a cycle: {' -> '.join(seen + (text_name,))}"
        )
    try:
        table = _parse(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses per level of nested arrays and tables
        raise ScenarioError(
            f"{source}: arrays or tables nested too deeply to read; a scenario nests a few "
            "levels at most (see docs/scenarios.md)"
        ) from None
    parent = table.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ScenarioError(f"{source}: key 'extends' must be a scenario name or path string")
        if parent not in builtin_names() and not Path(parent).is_absolute():
            parent = str(Path(source).parent / parent) if Path(source).is_file() else parent
        try:
            parent_table, _ = _read(parent, seen + (text_name,))
        except ScenarioError as exc:  # name the file whose 'extends' failed, not only the parent
            raise ScenarioError(f"{source}: key 'extends': {exc}") from None
        table = deep_merge(parent_table, table)
    return table, source


def read_table(name_or_path: str | Path) -> tuple[dict[str, Any], str]:
    """The raw table of a scenario (merged over its ``extends``, not validated) and the name of
    its source, for checks that go on where validation stopped (``gpumarket validate`` checks
    the ``[agents]`` of a file whose other keys are wrong). :class:`ScenarioError` if the file
    cannot be read as TOML."""
    table, source = _read(name_or_path)
    table.setdefault("name", Path(str(name_or_path)).stem)
    return table, source


@functools.lru_cache(maxsize=128)
def _parsed(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


def _parse(text: str) -> dict[str, Any]:
    """The TOML table of ``text``, parsed once per process (runners load a scenario per
    episode); a deep copy, since callers merge into it."""
    return copy.deepcopy(_parsed(text))


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``; nested tables merge, everything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def overrides_to_table(overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides to a table: ``rounds=3``, ``labs={"count": 4}`` or ``labs__count=4``."""
    table: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split("__")
        node = table
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return table


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: {exc.error_count()} problem(s):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling against docs/scenarios.md)"
        lines.append(f"  - key '{key}': {msg}")
    return "\n".join(lines)


def load_scenario(
    name_or_path: str | Path | Scenario = "market_round", **overrides: Any
) -> Scenario:
    """Load, merge overrides into and validate a scenario. Raises :class:`ScenarioError`."""
    if isinstance(name_or_path, Scenario):
        if not overrides:
            return name_or_path
        table, source = name_or_path.model_dump(mode="python"), f"scenario '{name_or_path.name}'"
    else:
        table, source = _read(name_or_path)
        table.setdefault("name", Path(str(name_or_path)).stem)
    try:
        if overrides:
            table = deep_merge(table, overrides_to_table(overrides))
            source += " (with overrides)"
        return Scenario.model_validate(table)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc)) from None
    except RecursionError:  # e.g. an override nested thousands of levels deep
        raise ScenarioError(
            f"{source}: values nested too deeply to read; a scenario nests a few levels at most"
        ) from None
