"""What code an agent runs: the part of a run folder's fingerprint that notices an edited agent.

The rules (docs/running.md, "One folder holds one configuration"):

* An agent is identified by its spec's name (``rule_expert``, ``py:pkg.mod:Class``, ``llm:openai``,
  a plug-in's name); its parameters are part of the seat specs, hashed beside this.
* Its **source** is the module that defines the class of the agent the spec builds, plus every
  module of the same top-level package that module imports, directly or through other modules of
  that package (static ``import`` / ``from ... import`` statements anywhere in the file, relative
  ones included, read with :mod:`ast`; a name imported from a package counts its submodule when
  one exists). For a ``py:`` spec the module the spec names is a root too (a factory in one
  module may build a class from another). Modules of other top-level packages are not followed:
  gpumarket's own code is covered by its version, a library by its distribution's.
* Each module is hashed from its file's bytes (line endings normalised to ``\\n``), never its
  modification time or path, so the fingerprint is the same on every machine that has the same
  files, and a file edited and restored is the same agent again.
* Its **distribution**: ``gpumarket <version>`` for code of the ``agents``, ``market`` and
  ``scenarios`` packages (the built-ins and the LLM, remote, torch and human seats); for a
  plug-in, the distribution that registers its entry point; for a ``py:`` spec, the installed
  distribution that provides its top-level package, if any.

Not covered: data files an agent reads (a ``torch_policy`` checkpoint, prompt templates), the
model behind an LLM seat, and the code of an agent service behind ``remote?url=``.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from collections.abc import Mapping
from functools import cache
from importlib.machinery import PathFinder
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

from agents.registry import parse_spec, plugins
from market.version import __version__

#: the top-level packages of this distribution: their agents carry gpumarket's version
OWN_PACKAGES = ("agents", "market", "scenarios")
HASH_CHARS = 16


def agent_key(spec: str) -> str:
    """The name part of a spec (what identifies the agent; parameters are hashed with the seats)."""
    return parse_spec(spec)[0]


def _source_bytes(path: Path) -> bytes:
    return path.read_bytes().replace(b"\r\n", b"\n")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


#: (source hash, module, is a package) -> the module names its imports name: a file is parsed
#: once per content (keyed by its bytes' hash, so an edited file is parsed again)
_IMPORTS: dict[tuple[str, str, bool], tuple[str, ...]] = {}


def _imports_of(digest: str, text: bytes, module: str, is_package: bool) -> tuple[str, ...]:
    """Every module name a file's import statements name (see :data:`_IMPORTS`)."""
    key = (digest, module, is_package)
    if key not in _IMPORTS:
        _IMPORTS[key] = _parse_imports(text, module, is_package)
    return _IMPORTS[key]


def _parse_imports(text: bytes, module: str, is_package: bool) -> tuple[str, ...]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    package = module if is_package else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                keep = len(parts) - (node.level - 1)
                if keep <= 0:
                    continue
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                found.append(base)
            found += [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
    return tuple(dict.fromkeys(found))


def _module_file(name: str) -> tuple[Path, bool] | None:
    """The file of a module (and whether it is a package), found without importing it."""
    loaded = sys.modules.get(name)
    file = getattr(loaded, "__file__", None)
    if file:
        path = Path(file)
        return (path, path.name == "__init__.py") if path.is_file() else None
    parent, _, _ = name.rpartition(".")
    search: list[str] | None = None
    if parent:
        above = sys.modules.get(parent)
        if above is not None:
            search = list(getattr(above, "__path__", None) or [])
        else:
            found = _module_file(parent)
            search = [str(found[0].parent)] if found is not None and found[1] else None
        if not search:
            return None
    try:
        spec = PathFinder.find_spec(name, search)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    path = Path(spec.origin)
    return (path, spec.submodule_search_locations is not None) if path.is_file() else None


def module_sources(roots: list[str]) -> dict[str, str]:
    """Module name -> hash of its source, for ``roots`` and the modules of their top-level
    packages that they import, transitively (the rule in the module docstring)."""
    out: dict[str, str] = {}
    todo = list(dict.fromkeys(roots))
    tops = {r.partition(".")[0] for r in roots}
    while todo:
        name = todo.pop()
        if name in out:
            continue
        found = _module_file(name)
        if found is None:
            continue
        path, is_package = found
        try:
            text = _source_bytes(path)
        except OSError:
            continue
        digest = _digest(text)
        out[name] = digest
        if path.suffix != ".py":  # an extension module or bytecode: its bytes, no imports
            continue
        for imported in _imports_of(digest, text, name, is_package):
            if imported.partition(".")[0] in tops and imported not in out:
                todo.append(imported)
    return dict(sorted(out.items()))


@cache
def _distributions() -> Mapping[str, list[str]]:
    return packages_distributions()


def _distribution_of(top: str) -> str | None:
    for dist in _distributions().get(top, []):
        try:
            return f"{dist} {version(dist)}"
        except Exception:  # metadata without a version: name it alone
            return dist
    return None


def agent_record(spec: str, agent_type: type[Any]) -> dict[str, Any]:
    """What code ``spec``'s agent (an instance of ``agent_type``) runs: its class, its
    distribution (or None) and its modules' source hashes (see the module docstring)."""
    name = agent_key(spec)
    roots = [agent_type.__module__]
    distribution: str | None = None
    if name.startswith("py:"):
        roots.append(name[3:].partition(":")[0])
    plugin = None if name.startswith(("py:", "llm:")) else plugins().get(name)
    top = agent_type.__module__.partition(".")[0]
    if top in OWN_PACKAGES:
        distribution = f"gpumarket {__version__}"
    elif plugin is not None:
        roots.append(plugin.value.partition(":")[0])
        dist = getattr(plugin, "dist", None)
        distribution = f"{dist.name} {dist.version}" if dist is not None else None
    else:
        distribution = _distribution_of(top)
    return {
        "class": f"{agent_type.__module__}.{agent_type.__qualname__}",
        "distribution": distribution,
        "modules": module_sources(roots),
    }


def agents_code(seats: Mapping[str, str], types: Mapping[str, type[Any]]) -> dict[str, Any]:
    """Agent name -> :func:`agent_record`, for every seat's agent (each name once)."""
    out: dict[str, Any] = {}
    for seat, spec in seats.items():
        key = agent_key(spec)
        if key not in out:
            out[key] = agent_record(spec, types[seat])
    return dict(sorted(out.items()))


def _listed(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def describe_code_change(old: Any, new: Mapping[str, Any]) -> str | None:
    """The first agent whose code differs between a folder's record (``old``) and now, in one
    phrase, or None when the code is the same."""
    if not isinstance(old, Mapping):
        return (
            "that folder does not record its agents' code (it was written by an older gpumarket), "
            "so episodes played now could not be told apart from its own"
        )
    for name, now in new.items():
        was = old.get(name)
        if not isinstance(was, Mapping) or was == now:
            continue
        if was.get("class") != now["class"]:
            return f"agent {name!r} is class {was.get('class')} there but {now['class']} now"
        if was.get("distribution") != now["distribution"]:
            return (
                f"agent {name!r} comes from {was.get('distribution') or 'no distribution'} there "
                f"but {now['distribution'] or 'no distribution'} now"
            )
        recorded = was.get("modules")
        before: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
        after: Mapping[str, Any] = now["modules"]
        changed = [m for m in after if m in before and before[m] != after[m]]
        added = [m for m in after if m not in before]
        removed = [m for m in before if m not in after]
        parts = []
        if len(changed) == 1:
            found = _module_file(changed[0])
            where = f" ({found[0]})" if found else ""
            parts.append(f"module {changed[0]}{where} changed since that run")
        elif changed:
            parts.append(f"modules {_listed(changed)} changed since that run")
        if added:
            parts.append(f"now also imports {_listed(added)}")
        if removed:
            parts.append(f"no longer imports {_listed(removed)}")
        return f"agent {name!r} has other code now: {'; '.join(parts) or 'its record differs'}"
    return None
