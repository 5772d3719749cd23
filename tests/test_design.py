"""docs/design.md keeps to the code: its module map (section 10) lists every module of market/,
agents/ and scenarios/, each module imports only its own layer or the layers above it, the agents
import nothing of the market but actions, observations and mechanisms, and the only imports
against the layer order are the lazy ones the page names. Every code citation of the page names
a section that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PACKAGES = ("market", "agents", "scenarios")
# the lazy imports against the layer order that section 10 names (importer -> imported)
LAZY_UPWARD = {
    ("market/__init__.py", "market/environment/aec.py"),
    ("market/core/judge.py", "agents/llm/backends/openai_backend.py"),
}
AGENT_MARKET_IMPORTS = {"market/__init__.py", "market/core/actions.py", "market/environment/observations.py", "market/core/mechanisms.py"}


def module_layers() -> dict[str, int]:
    """Section 10's tables: module path -> layer number (0 = the first layer listed)."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("## 10. Module map"):]
    layers: dict[str, int] = {}
    layer = -1
    for line in section.splitlines():
        if line.startswith("**"):
            layer += 1
        elif line.startswith("| `"):
            for path in re.findall(r"`([a-z_/]+\.py)`", line.split("|")[1]):
                assert path not in layers, f"{path} is listed twice"
                layers[path] = layer
    assert layer == 5, "expected six layers"
    return layers


def source_modules() -> list[str]:
    return sorted(f.relative_to(ROOT).as_posix() for p in PACKAGES for f in (ROOT / p).rglob("*.py"))


def resolve(name: str) -> str | None:
    """The file of an imported project module (a package's __init__.py), or None if not ours."""
    if name.split(".")[0] not in PACKAGES:
        return None
    parts = name.split(".")
    while parts:
        base = ROOT.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py").relative_to(ROOT).as_posix()
        if (base / "__init__.py").is_file():
            return (base / "__init__.py").relative_to(ROOT).as_posix()
        parts.pop()  # ``market.__version__``: an attribute of the package
    return None


def imports(path: str) -> tuple[set[str], set[str]]:
    """Project modules ``path`` imports (module level, inside functions)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    top: set[str] = set()
    lazy: set[str] = set()
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
              for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from market import ledger`` imports the submodule market/core/ledger.py
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = resolve(name)
            if target is not None and target != path:
                (lazy if id(node) in nested else top).add(target)
    return top, lazy


def test_every_module_is_in_the_map() -> None:
    listed, present = set(module_layers()), set(source_modules())
    assert present - listed == set(), f"modules missing from docs/design.md section 10: {sorted(present - listed)}"
    assert listed - present == set(), f"docs/design.md section 10 lists modules that do not exist: {sorted(listed - present)}"


def test_modules_import_only_their_layer_or_above() -> None:
    layers = module_layers()
    wrong, lazy_up = [], set()
    for path in source_modules():
        top, lazy = imports(path)
        wrong += [f"{path} imports {t} (layer {layers[t]} > {layers[path]})" for t in top if layers[t] > layers[path]]
        lazy_up |= {(path, t) for t in lazy if layers[t] > layers[path]}
        if path.startswith("agents/"):
            wrong += [f"{path} imports {t}" for t in top if t.startswith("market/") and t not in AGENT_MARKET_IMPORTS]
    assert not wrong, "\n".join(wrong)
    assert lazy_up == LAZY_UPWARD, f"lazy imports against the layer order changed: {sorted(lazy_up ^ LAZY_UPWARD)}"


def test_the_checks_can_fail() -> None:
    """The layer check sees a real upward import: the env imports the ledger (layer 1)."""
    layers = module_layers()
    top, _ = imports("market/environment/aec.py")
    assert "market/core/ledger.py" in top and layers["market/core/ledger.py"] < layers["market/environment/aec.py"]
    assert "agents/scripted.py" in imports("market/environment/wrappers.py")[0]


def test_citations_name_existing_sections() -> None:
    """Every ``docs/design.md, section N`` in the code and the docs names a numbered heading."""
    text = DESIGN.read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))
    cited: list[tuple[str, str]] = []
    for path in source_modules() + sorted(f.relative_to(ROOT).as_posix() for f in (ROOT / "tests").glob("*.py")):
        for number in re.findall(r"docs/design\.md,? sections? (\d+(?:\.\d+)?)", (ROOT / path).read_text(encoding="utf-8")):
            cited.append((path, number))
    assert len(cited) >= 8, cited
    assert all(n in sections for _, n in cited), [c for c in cited if c[1] not in sections]
    tests = [f.relative_to(ROOT).as_posix() for f in (ROOT / "tests").glob("*.py") if f.name != "test_design.py"]
    docs = [f.relative_to(ROOT).as_posix() for f in (ROOT / "docs").glob("*.md")] + ["README.md"]
    stale = [p for p in source_modules() + tests + docs if "DESIGN.md" in (ROOT / p).read_text(encoding="utf-8")]
    assert not stale, f"citations of a DESIGN.md that is not in the repository: {stale}"
