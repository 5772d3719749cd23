"""The plug-in author's docs stay true (issue 34, item 10): docs/agents.md's actions table lists
every action class and field of market.core.actions with its default, each helper has one
import path, ``gpumarket agents`` shows plain-text descriptions (a fallback line without a
docstring) and names every spec form, and the index's table lists every registered agent."""

from __future__ import annotations

import ast
import json
import re
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from agents.registry import NO_DESCRIPTION, REGISTRY, description, plain_text
from market.cli import main as cli
from market.core.actions import ACTION_CLASSES, MechanismUpdate

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMMON = {"agent", "reasoning", "action_type"}  # every action's fields, described once above
CODE = re.compile(r"`([^`]+)`")
HELPERS = ("marginal_values", "affordable", "can_complete")


def table_after(page: str, marker: str) -> list[list[str]]:
    """The cells of the first Markdown table after ``marker`` in ``docs/page``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    assert marker in text, f"{page} lost its {marker!r}"
    lines = text[text.index(marker) :].splitlines()[1:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]  # after the header and its rule


def default_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return json.loads(json.dumps(value))


def test_the_actions_table_lists_every_action_class_field_and_default() -> None:
    rows = table_after("agents.md", "<!-- the actions table")
    by_class = {CODE.fullmatch(row[0]).group(1): row for row in rows}  # type: ignore[union-attr]
    models: dict[str, type[BaseModel]] = {c.__name__: c for c in ACTION_CLASSES.values()}
    models["MechanismUpdate"] = MechanismUpdate
    assert sorted(by_class) == sorted(models), "add or remove rows of docs/agents.md's table"
    assert len(rows) == len(models)
    for name, model in models.items():
        row = by_class[name]
        if name in (c.__name__ for c in ACTION_CLASSES.values()):
            assert row[1] == f"`{model.model_fields['action_type'].default}`", name
        documented: dict[str, str | None] = {}
        for token in CODE.findall(row[3]):
            field, eq, default = token.partition("=")
            documented[field] = default if eq else None
        fields = {n: f for n, f in model.model_fields.items() if n not in COMMON}
        assert sorted(documented) == sorted(fields), f"{name}: fields {sorted(fields)}"
        for field, info in fields.items():
            if info.is_required():
                assert documented[field] is None, f"{name}.{field} is required"
            else:
                shown = documented[field]
                assert shown is not None, f"{name}.{field} has a default: write {field}=..."
                expected = default_json(info.get_default(call_default_factory=True))
                assert json.loads(shown) == expected, f"{name}.{field}={shown}, not {expected}"


def test_each_helper_has_one_documented_import_path() -> None:
    rows = table_after("agents.md", "## Helpers")
    imports = [CODE.fullmatch(row[1]).group(1) for row in rows]  # type: ignore[union-attr]
    for line in imports:
        node = ast.parse(line).body[0]
        assert isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names:
            assert hasattr(import_module(node.module), alias.name), line
    for helper in HELPERS:
        assert f"from market.environment import {helper}" in imports
    # no page, README or docstring shows another path to the helpers
    wrong = re.compile(
        r"from (?!market\.environment\b)([\w.]+) import [^\n]*\b(" + "|".join(HELPERS) + r")\b"
    )
    for page in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        found = wrong.search(page.read_text(encoding="utf-8"))
        assert found is None, f"{page.name}: {found.group(0) if found else ''}"
    for package in ("agents", "market", "scenarios"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for helper in HELPERS:
                assert f"agents.scripted.{helper}" not in text, (
                    f"{path}: names agents.scripted.{helper}"
                )


def test_plain_text_strips_rest_markup() -> None:
    assert plain_text("Sends :data:`DAEDALUS_ROBUST` every\n  turn::") == (
        "Sends DAEDALUS_ROBUST every turn:"
    )
    assert plain_text("See :func:`~market.environment.marginal_values`.") == "See marginal_values."
    assert plain_text(":class:`the bid <market.core.actions.Bid>` and ``code``") == (
        "the bid and code"
    )
    assert plain_text("*emphasis*, **strong**, `docs <https://example.org>`_, 2 * 3") == (
        "emphasis, strong, docs, 2 * 3"
    )


def test_agents_lists_plain_text_descriptions_and_every_spec_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["agents"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in lines if line.split()}
    for name, cls in REGISTRY.items():
        line = by_name[name]
        assert description(cls) in line
        assert "`" not in line and not re.search(r":\w+:", line), line
        assert NO_DESCRIPTION not in line, f"{name} has no docstring"
    # the first paragraph, not its first line; the role reduced to its target
    assert "Sends DAEDALUS_ROBUST at every design turn" in by_name["daedalus_robust"]
    assert "the environment converts it to credits." in by_name["daedalus_robust"]
    assert "leaves the market (finish) after patience losing rounds" in by_name["dropout"]
    also = lines[-1]
    assert also.startswith("also: ")
    for form in (
        "py:package.module:ClassName",
        "llm:openai?",
        "llm:hf?",
        "torch_policy?path=",
        "remote?url=",
    ):
        assert form in also, form


UNDOCUMENTED = """from agents.scripted import TruthfulBidder


class Quiet(TruthfulBidder):
    name = "quiet"
"""


def test_an_agent_without_a_docstring_of_its_own_gets_the_fallback_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # an installed plug-in: its module, and a bare dist-info folder whose entry point names it
    (tmp_path / "quiet_plugin.py").write_text(UNDOCUMENTED)
    info = tmp_path / "gm_quiet_plugin-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gm-quiet-plugin\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[gpumarket.agents]\nquiet = quiet_plugin:Quiet\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "quiet_plugin", raising=False)
    assert cli(["agents"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("quiet "))
    # TruthfulBidder's docstring is inherited, but it describes another agent: not shown
    assert NO_DESCRIPTION in line and "(plug-in quiet_plugin:Quiet)" in line
    assert "marginal value" not in line
    assert description(REGISTRY["truthful"]) != NO_DESCRIPTION


def test_the_index_lists_every_registered_agent() -> None:
    rows = table_after("index.md", "### Registered agents")
    listed = {name for row in rows for name in CODE.findall(row[0])}
    missing = sorted(set(REGISTRY) - listed)
    assert not missing, f"docs/index.md's agents table lacks {missing}"
