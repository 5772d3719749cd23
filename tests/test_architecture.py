"""The house rules of the layout (docs/design.md, section 10), read off the source with ``ast``.

* no import cycle anywhere, except among the modules of ``market/environment/``;
* between rooms, only the arrows of :data:`ROOM_ARROWS` (a room imports only rooms below it);
* ``market/core`` imports nothing of the project but itself;
* ``agents`` imports only ``market.core``, the public names of ``market.environment`` and itself;
* nobody imports a private (``_name``) of another module;
* no module over 600 lines, the AEC env under 300;
* imports at module level only, except optional extras imported where they are used and the
  short named list of modules kept off the CLI's start-up path (issue 15), which a fresh
  interpreter checks;
* one source of truth for seat names, auction types and penalty constants; one LLM response
  cache; every module is in the room map of docs/design.md.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import networkx as nx
from support import ROOT

PACKAGES = ("market", "agents", "scenarios")
DESIGN = ROOT / "docs" / "design.md"
MAX_LINES = 600
ENV_MAX_LINES = 300
# the room map (docs/design.md, section 10): room -> the rooms it may import. A room is a
# top-level package, or a package of ``market``; ``market`` is the package's own __init__ (its
# scripting API, loaded on first use). Every room may import itself and ``market.version``.
BELOW_AGENTS = ("market.core", "scenarios", "market.environment")
BELOW_RECORD = (*BELOW_AGENTS, "agents")
ROOM_ARROWS: dict[str, tuple[str, ...]] = {
    "market.core": (),
    "scenarios": ("market.core",),
    "market.environment": ("market.core", "scenarios"),
    "agents": BELOW_AGENTS,
    "market.record": BELOW_RECORD,
    "market.run": (*BELOW_RECORD, "market.record"),
    "market.review": (*BELOW_RECORD, "market.record", "market.run"),
    "market.train": (*BELOW_RECORD, "market.record", "market.run", "market.review"),
    "market.serve": (*BELOW_RECORD, "market.record", "market.run", "market.review"),
    "market": (*BELOW_RECORD, "market.record", "market.run", "market.review"),
    "market.bench": (*BELOW_RECORD, "market.record", "market.run", "market.review", "market"),
    "market.cli": (
        *BELOW_RECORD,
        "market.record",
        "market.run",
        "market.review",
        "market.train",
        "market.serve",
        "market.bench",
    ),
    "market.__main__": ("market.cli",),
}
# heavy optional extras: imported inside the function that needs them, so that a base install
# (and every command that does not use them) never pays for them
OPTIONAL_EXTRAS = {
    "torch",
    "ray",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "gguf",
    "llama_cpp",
    "peft",
    "tiktoken",
    "xgrammar",
    "matplotlib",
}
# start-up time of the CLI (issue 15): the modules that only some commands or seats need, each
# imported inside the one function that needs it, so that ``import market.cli`` (which a run's
# pool workers inherit) and a run of scripted seats never load them. Module -> who needs it.
LAZY_FOR_START_UP = {
    "market.bench.suite": "gpumarket bench (the OpenAI client, the benchmarks' servers)",
    "market.train.training_data": "gpumarket export-sft (LLM prompts: jinja2)",
    "agents.llm.agent": "llm: seats (prompts, templates, backends)",
    "agents.llm.judge": "a scenario's LLM pitch judge (registered by agents/__init__.py)",
    "agents.llm.conduct_reader": "a scenario's LLM conduct reader (registered likewise)",
    "httpx": "the remote agent's first request",
    "networkx": "InteractionGraph.graph (the market keeps its edge counters in a dict)",
}
# start-up of the command line (issue 34): each command's module, and what only some commands
# need, is imported when that command runs (market.cli.handler, market.cli.parser), so that
# ``gpumarket --help`` and ``gpumarket agents`` load none of them (checked in a fresh interpreter)
LAZY_FOR_COMMANDS = {
    "market.cli.arguments": "the options of run, eval, tournament, ... (the LLM pool flags)",
    "market.cli.run_commands": "gpumarket run, eval, tournament",
    "market.cli.record_commands": "gpumarket train, report, show, replay",
    "market.cli.validate_command": "gpumarket validate",
    "market.cli.play_command": "gpumarket play",
    "market.cli.serve_command": "gpumarket serve",
    "market.cli.openenv_command": "gpumarket openenv",
    "market.cli.train_command": "gpumarket train-llm (TRL, PEFT: the [train] extra)",
    "agents.registry": "gpumarket agents with a plug-in installed, and regenerating its listing",
}
# what --help and agents must not load: the above, and the stacks the other commands import
NOT_FOR_HELP = (
    *LAZY_FOR_COMMANDS,
    "numpy",
    "pydantic",
    "rich",
    "pettingzoo",
    "scenarios",
    "market.environment",
    "market.run",
    "market.record",
    "market.review",
)
# what start-up must not load (checked in a fresh interpreter): the above, and what they pull in
NOT_AT_START_UP = (
    *LAZY_FOR_START_UP,
    "openai",
    "aiohttp",
    "jinja2",
    "agents.llm.backends.openai_backend",
    "agents.llm.prompts",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            out[module_name(f)] = f
    return out


def resolve(name: str) -> str | None:
    """The project module an import names (``market.core.ledger.pay`` -> ``market.core.ledger``)."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


@cache
def parsed(module: str) -> ast.Module:
    return ast.parse(modules()[module].read_text(encoding="utf-8"))


def import_nodes(module: str) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of ``module`` with whether it sits at module level."""
    tree = parsed(module)
    top = {id(n) for n in tree.body}
    # module-level ``if TYPE_CHECKING:`` / ``try:`` blocks count as module level
    for node in tree.body:
        if isinstance(node, ast.If | ast.Try):
            top |= {id(n) for n in ast.walk(node)}
    return [(n, id(n) in top) for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(project module, imported name or None) pairs of one import statement."""
    out: list[tuple[str, str | None]] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if (m := resolve(alias.name)) is not None:
                out.append((m, None))
    elif node.level == 0 and node.module:
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if full in modules():
                out.append((full, None))  # ``from market.core import ledger``
            elif (m := resolve(node.module)) is not None:
                out.append((m, alias.name))
    return out


@cache
def graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for module in modules():
        g.add_node(module)
        for node, _ in import_nodes(module):
            for target, _name in targets(node):
                if target != module:
                    g.add_edge(module, target)
    return g


def lines(module: str) -> int:
    return len(modules()[module].read_text(encoding="utf-8").splitlines())


def test_no_import_cycles_outside_the_environment_room() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph()) if len(c) > 1]
    allowed = [c for c in cycles if all(m.startswith("market.environment") for m in c)]
    assert [c for c in cycles if c not in allowed] == []


def room_of(module: str) -> str:
    """``market.run.rollout`` -> ``market.run``; ``agents.llm.agent`` -> ``agents``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "market" and len(parts) > 1 else parts[0]


def test_rooms_import_only_the_rooms_below_them() -> None:
    """Every arrow between rooms is in :data:`ROOM_ARROWS`, so the rooms form no cycle: the
    transcript format (``market.record``) sits below the episode driver (``market.run``), and
    replay and the reports that read transcripts back (``market.review``) above it."""
    rooms = {room_of(m) for m in modules()}
    assert rooms - {"market.version"} == set(ROOM_ARROWS), "add the room to ROOM_ARROWS"
    wrong = sorted(
        (m, t)
        for m, t in graph().edges
        if room_of(m) != room_of(t)
        and room_of(t) != "market.version"
        and room_of(t) not in ROOM_ARROWS[room_of(m)]
    )
    assert wrong == []
    arrows = nx.DiGraph([(room, below) for room, belows in ROOM_ARROWS.items() for below in belows])
    assert nx.is_directed_acyclic_graph(arrows)


def test_core_imports_only_itself() -> None:
    """The scenario model lives in the core (``market.core.scenario_schema``); the ``scenarios``
    package (the loader and the built-in files) sits above it."""
    wrong = [
        (m, t)
        for m, t in graph().edges
        if m.startswith("market.core") and not t.startswith("market.core")
    ]
    assert wrong == []


def test_scenarios_import_only_the_core() -> None:
    wrong = [
        (m, t)
        for m, t in graph().edges
        if m.startswith("scenarios") and not t.startswith(("market.core", "scenarios"))
    ]
    assert wrong == []


def test_agents_import_only_the_core_the_public_env_and_themselves() -> None:
    wrong = []
    for module in modules():
        if not module.startswith("agents"):
            continue
        for node, _ in import_nodes(module):
            for target, _name in targets(node):
                if target.startswith(("agents", "market.core", "scenarios")):
                    continue
                if target == "market.environment":  # the room's public names
                    continue
                wrong.append((module, target))
    assert wrong == []


def test_nobody_imports_a_private_name_of_another_module() -> None:
    wrong = []
    for module in modules():
        for node, _ in import_nodes(module):
            for target, name in targets(node):
                if (
                    target != module
                    and (name or "").startswith("_")
                    and not (name or "").startswith("__")
                ):
                    wrong.append((module, target, name))
            if isinstance(node, ast.ImportFrom) and node.module:
                wrong += [
                    (module, node.module, a.name)
                    for a in node.names
                    if node.module.split(".")[0] in PACKAGES
                    and a.name.startswith("_")
                    and a.name != "__version__"
                ]
    assert sorted(set(wrong)) == []


def test_module_sizes() -> None:
    big = {m: lines(m) for m in modules() if lines(m) > MAX_LINES}
    assert big == {}
    assert lines("market.environment.aec") < ENV_MAX_LINES


def lazy_allowed(name: str) -> bool:
    """An import that may sit inside a function: an optional extra, or a module of
    :data:`LAZY_FOR_START_UP` or :data:`LAZY_FOR_COMMANDS` (or one of its submodules)."""
    return name.split(".")[0] in OPTIONAL_EXTRAS or any(
        name == m or name.startswith(m + ".") for m in (*LAZY_FOR_START_UP, *LAZY_FOR_COMMANDS)
    )


def test_imports_sit_at_module_level_except_optional_extras() -> None:
    inner = []
    for module in modules():
        for node, at_top in import_nodes(module):
            if at_top:
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            if not all(lazy_allowed(n) for n in names):
                inner.append((module, ast.unparse(node)))
    assert inner == []


def test_the_lazy_set_is_small_and_used() -> None:
    """Every entry of :data:`LAZY_FOR_START_UP` is imported inside a function somewhere (a stale
    entry would widen the rule for nothing), and the rule still bites: a project module outside
    the set, imported in a function, is refused."""
    used = set()
    for module in modules():
        for node, at_top in import_nodes(module):
            if not at_top:
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                used |= {
                    m for m in (*LAZY_FOR_START_UP, *LAZY_FOR_COMMANDS) for n in names if n == m
                }
    assert used == {*LAZY_FOR_START_UP, *LAZY_FOR_COMMANDS}
    assert not lazy_allowed("market.run.runner")
    assert not lazy_allowed("agents.llm")  # the package above a lazy module stays eager
    assert lazy_allowed("torch.nn") and lazy_allowed("agents.llm.agent")


def code_of(module: str) -> str:
    """The source without docstrings and comments (what runs)."""
    tree = parsed(module)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def test_one_source_of_truth_for_seat_names() -> None:
    """Seat names are built and parsed by ``market.core.seats`` only."""
    built = re.compile(r"""f(['"])(bidder|designer)_\{""")
    sliced = re.compile(
        r"""(rsplit\((['"])_\2|\[len\((['"])bidder_|\[7:\]|split\((['"])_\4\)\[1\])"""
    )
    wrong = [
        m
        for m in modules()
        if m != "market.core.seats" and (built.search(code_of(m)) or sliced.search(code_of(m)))
    ]
    assert wrong == []


def test_one_source_of_truth_for_auction_types_and_penalties() -> None:
    spelled = re.compile(r"""['"]first_price['"]\s*,\s*['"]second_price['"]""")
    # written out once: the AuctionType literal in market.core.mechanisms
    assert [m for m in modules() if spelled.search(code_of(m))] == ["market.core.mechanisms"]
    for constant in ("BREACH_REPUTATION_LOSS", "FALSE_CLAIM_REPUTATION_LOSS"):
        defined = [
            m
            for m in modules()
            if re.search(rf"^{constant}\b.*=", modules()[m].read_text(encoding="utf-8"), flags=re.M)
        ]
        assert len(defined) == 1, (constant, defined)


def test_one_llm_response_cache() -> None:
    users = [
        m
        for m in modules()
        if re.search(
            r"^import sqlite3|^from sqlite3", modules()[m].read_text(encoding="utf-8"), flags=re.M
        )
    ]
    assert users == ["agents.llm.cache"]


def test_every_module_is_in_the_room_map() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("## 10. ") :]
    listed = set(re.findall(r"`((?:market|agents|scenarios)/[a-z_/]+\.py)`", section))
    present = {f.relative_to(ROOT).as_posix() for f in modules().values()}
    packages = {p for p in present if p.endswith("__init__.py")}
    assert present - packages - listed == set(), "add them to docs/design.md section 10"
    assert listed - present == set(), "docs/design.md section 10 names missing files"


def test_the_checks_see_real_imports() -> None:
    """The graph is not empty by accident: the env imports the ledger, the runner the env."""
    g = graph()
    assert g.has_edge("market.core.settlement", "market.core.ledger")
    assert nx.has_path(g, "market.run.rollout", "market.environment.aec")
    assert nx.has_path(g, "market.cli", "market.run.rollout")


def test_the_core_and_the_agents_import_on_their_own() -> None:
    """``market/__init__`` loads its scripting API on first use: importing the core does not pull
    in the env stack, and importing ``agents`` or ``scenarios`` first is not a circular import."""
    probe = (
        "import sys, {m}; heavy = [n for n in ('pettingzoo', 'openai', 'rich', 'networkx') "
        "if n in sys.modules]; print(heavy)"
    )
    for module, heavy in [
        ("market.core.mechanisms", "[]"),
        ("scenarios", "[]"),
        ("agents.base", "[]"),  # an agent that reads observations loads no PettingZoo
        ("market.environment", "[]"),  # the env itself on first use of raw_env, env, ...
        ("agents.registry", None),
        ("agents.llm.judge", None),
    ]:
        out = subprocess.run(
            [sys.executable, "-c", probe.format(m=module)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert out.returncode == 0, (module, out.stderr)
        if heavy is not None:
            assert out.stdout.strip() == heavy, (module, out.stdout)


START_UP_PROBE = """
import json, sys
loaded = lambda: [m for m in __NOT__ if m in sys.modules]
import market.cli, market.run.runner
start_up = loaded()
code = market.cli.main(["run", "market_round", "--seeds", "0:2", "--workers", "1",
                        "--no-progress", "--out", __OUT__])
run = loaded()
from agents.registry import make_agent
remote = make_agent("remote?url=http://127.0.0.1:9&timeout=1")
built = loaded()
from market.core.judge_specs import make_judge
judge = make_judge("llm:openai?model=m&base_url=http://127.0.0.1:9/v1")
print(json.dumps({"start_up": start_up, "run": run, "code": code, "built": built,
                  "remote": type(remote).__name__, "judge_backend": type(judge.backend).__name__,
                  "after_llm_judge": loaded()}))
"""


def test_start_up_and_a_scripted_run_load_no_llm_or_http_stack(tmp_path: Path) -> None:
    """Issue 15: ``import market.cli, market.run.runner`` (what a run's forked workers inherit)
    loads none of :data:`NOT_AT_START_UP`, and neither does a whole ``gpumarket run`` of the
    default seats with the rule judge (transcripts and report included) nor building a remote
    seat. Structural, never timed. The probe sees real imports: an LLM judge spec does load the
    OpenAI client and builds its backend."""
    code = START_UP_PROBE.replace("__NOT__", repr(NOT_AT_START_UP)).replace(
        "__OUT__", repr(str(tmp_path / "run"))
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["start_up"] == []
    assert probe["code"] == 0 and probe["run"] == []
    assert (tmp_path / "run" / "results.jsonl").is_file()  # --out: the run folder itself
    assert probe["remote"] == "RemoteAgent" and probe["built"] == []
    assert probe["judge_backend"] == "OpenAIBackend"
    assert {"openai", "agents.llm.backends.openai_backend"} <= set(probe["after_llm_judge"])


HELP_PROBE = """
import contextlib, io, json, sys
import market.cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        market.cli.main(["--help"])
    except SystemExit as stop:
        code = stop.code
    agents = market.cli.main(["agents"])
heavy = lambda: [m for m in __NOT__ if any(n == m or n.startswith(m + ".") for n in sys.modules)]
print(json.dumps({"help": code, "agents": agents, "loaded": heavy(), "text": out.getvalue()}))
"""


def test_help_and_agents_load_no_command_module_and_no_env() -> None:
    """Issue 34: ``gpumarket --help`` and ``gpumarket agents`` import none of
    :data:`LAZY_FOR_COMMANDS` and none of the stacks the other commands import (numpy, pydantic,
    rich, the env, the runner, the record), so they start in a fraction of the time those take.
    Structural, never timed: ``gpumarket bench --only startup`` times them."""
    code = HELP_PROBE.replace("__NOT__", repr(NOT_FOR_HELP))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["help"] == 0 and probe["agents"] == 0
    assert "rule_expert" in probe["text"] and "usage: gpumarket" in probe["text"]
    assert probe["loaded"] == []


def test_design_citations_name_existing_sections() -> None:
    """Every ``docs/design.md, section N`` in the code, the tests and the docs names a numbered
    heading, and nothing cites a design file outside the repository."""
    text = DESIGN.read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))
    sources = [f for p in (*PACKAGES, "tests") for f in (ROOT / p).rglob("*.py")]
    docs = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    cited = [
        (f.name, n)
        for f in sources + docs
        for n in re.findall(
            r"docs/design\.md,? sections? (\d+(?:\.\d+)?)", f.read_text(encoding="utf-8")
        )
    ]
    assert len(cited) >= 8, cited
    assert [c for c in cited if c[1] not in sections] == []
    this = Path(__file__).name
    stale = [
        f.name
        for f in sources + docs
        if f.name != this and "DESIGN.md" in f.read_text(encoding="utf-8")
    ]
    assert stale == []


def test_the_market_and_the_agents_add_floats_in_order() -> None:
    """Python 3.12's built-in ``sum`` of floats is compensated, 3.11's adds left to right: a sum
    that reaches state, rewards, observations or a decision would differ between them and a
    transcript recorded on one would not replay on the other (market/core/summation.py)."""
    found = []
    for folder in ("market/core", "market/environment", "agents"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "sum"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "use market.core.summation.ordered_sum (or math.fsum): " + ", ".join(found)


def test_ordered_sum_adds_left_to_right_as_python_3_11_does() -> None:
    from market.core.summation import ordered_sum  # noqa: PLC0415

    # compensated summation gives 1.0 here; left to right, 1e16 + 1.0 rounds back to 1e16
    assert ordered_sum([1e16, 1.0, -1e16]) == 0.0
    assert ordered_sum([0.1, 0.2, 0.3]) == (0.1 + 0.2) + 0.3
    assert ordered_sum([2, 3]) == 5 and isinstance(ordered_sum([2, 3]), int)
    assert ordered_sum([]) == 0 and ordered_sum([[1], [2]], []) == [1, 2]
