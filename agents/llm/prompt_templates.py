"""Jinja2 prompt templates of an LLM seat: the built-in ones shipped in ``agents/llm/templates``,
overridable per seat, and a persona paragraph.

Rules:

- **Files.** A seat's prompt has three templates: ``system.j2`` (the system message),
  ``user.j2`` (the first user message) and ``repair.j2`` (the message after an unusable reply).
  ``prompt=DIR`` takes each of them from the folder ``DIR`` when it is there, else the built-in one;
  ``prompt=FILE`` (any other path) is the system template alone. A template may ``include`` or
  ``extend`` the built-ins by the names ``builtin/system.j2``, ``builtin/user.j2`` and
  ``builtin/repair.j2``.
- **Sandbox.** Templates render in Jinja's sandbox with ``StrictUndefined`` (an undefined variable is
  an error, never an empty string), no autoescaping (prompts are plain text), and a loader that
  reads only the given folder or file and the built-ins.
- **Errors.** A missing file, a syntax error or a variable no template gets is a
  :class:`PromptTemplateError` at construction, one line naming the file and line.
  :func:`agents.llm.prompts.load_templates` also renders custom templates once on sample
  observations, so an error inside an expression (``obs.no_such_field``) shows up when the seat
  is built, not in the middle of an episode.
- **Persona.** ``persona=TEXT`` or ``persona=PATH``: an existing file's text, otherwise the text
  itself; a value ending in ``.txt``, ``.md`` or ``.j2`` that is no file is an error. It is placed
  in the system prompt as written (control characters dropped, cut at 2,000 characters).

The variables a template gets are :data:`TEMPLATE_VARIABLES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import SandboxedEnvironment

TEMPLATE_NAMES = ("system.j2", "user.j2", "repair.j2")
BUILTIN_PREFIX = "builtin/"
MAX_PERSONA_CHARS = 2_000
PERSONA_SUFFIXES = (".txt", ".md", ".j2")

#: every variable a template gets, and what it holds
TEMPLATE_VARIABLES: dict[str, str] = {
    "obs": "the Observation itself (read-only; e.g. obs.budget, obs.mechanism.auction_type)",
    "seat": "the seat's name, e.g. bidder_0",
    "role": "'bidder' or 'designer'",
    "phase": "'design', 'negotiation' or 'bidding'",
    "round": "the round number (0-based)",
    "rounds_total": "the number of rounds",
    "legal_actions": "the action types legal now (list of str)",
    "persona": "the seat's persona paragraph ('' when none)",
    "goal": "what the seat is, e.g. 'an AI lab that needs GPU blocks for its jobs'",
    "rules": "the rule lines taught from the observation (list of str; agents.llm.rules)",
    "trust_rule": "the trust boundary rule (market.environment.trust.UNTRUSTED_RULE)",
    "example": "an example action built from the seat's own state ('' when none)",
    "observation": "Observation.to_prompt() of the (compacted) observation",
    "omitted": "what was cut to fit the context, e.g. '... 280 more active labs' ('' when nothing)",
    "action_formats": "one compact line per legal action type (list of str)",
    "error": "repair.j2 only: why the last reply could not be used ('' elsewhere)",
}

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


class PromptTemplateError(ValueError):
    """A prompt template or persona that cannot be used; the message is one line."""


def builtin_source(name: str) -> str:
    """The text of a built-in template (read through importlib.resources, so it works from a
    wheel)."""
    return resources.files("agents.llm").joinpath("templates", name).read_text(encoding="utf-8")


def _builtin_loader() -> Callable[[str], tuple[str, str, Callable[[], bool]] | None]:
    def load(name: str) -> tuple[str, str, Callable[[], bool]] | None:
        base = name.removeprefix(BUILTIN_PREFIX)
        if base not in TEMPLATE_NAMES:
            return None
        return builtin_source(base), f"agents/llm/templates/{base}", lambda: True

    return load


def _file_loader(
    folder: Path | None, single: Path | None
) -> Callable[[str], tuple[str, str, Callable[[], bool]] | None]:
    """Serves only ``single`` (as system.j2) or the files directly inside ``folder``."""

    def load(name: str) -> tuple[str, str, Callable[[], bool]] | None:
        path: Path | None = None
        if single is not None and name == "system.j2":
            path = single
        elif (
            folder is not None
            and "/" not in name
            and "\\" not in name
            and name not in ("", ".", "..")
        ):
            candidate = folder / name
            path = candidate if candidate.is_file() else None
        if path is None:
            return None
        try:
            return path.read_text(encoding="utf-8"), str(path), lambda: True
        except (OSError, UnicodeDecodeError) as exc:
            raise PromptTemplateError(f"prompt template {path}: cannot read it ({exc})") from None

    return load


def _where(exc: BaseException, fallback: str) -> str:
    """``file:line`` of the template frame an error was raised in (Jinja maps its frames)."""
    tb = exc.__traceback__
    where = fallback
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2") or filename == fallback:
            where = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def read_persona(persona: str | None) -> str:
    """The persona paragraph: a file's text when ``persona`` names one, else ``persona`` itself."""
    if persona is None:
        return ""
    text = str(persona)
    path = Path(text).expanduser()
    try:
        is_file = len(text) < 1024 and "\n" not in text and path.is_file()
    except OSError:
        is_file = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PromptTemplateError(f"persona file {path}: cannot read it ({exc})") from None
    elif text.strip().lower().endswith(PERSONA_SUFFIXES):
        raise PromptTemplateError(
            f"persona={text!r} looks like a file name but there is no such file; give an existing "
            "file or the persona text itself"
        )
    text = _CONTROL.sub("", text.replace("\r\n", "\n")).strip()
    return text[:MAX_PERSONA_CHARS]


class PromptTemplates:
    """The three templates of a seat's prompt and its persona (see the module docstring)."""

    def __init__(self, prompt: str | Path | None = None, persona: str | None = None) -> None:
        self.source = None if prompt is None else str(prompt)
        self.persona = read_persona(persona)
        folder: Path | None = None
        single: Path | None = None
        if prompt is not None:
            path = Path(prompt).expanduser()
            if path.is_dir():
                folder = path
            elif path.is_file():
                single = path
            else:
                raise PromptTemplateError(
                    f"prompt={prompt}: no such file or folder; give a folder with system.j2, "
                    "user.j2 and/or repair.j2, or one file for the system prompt"
                )
        loaders: list[jinja2.BaseLoader] = [
            jinja2.PrefixLoader(
                {"builtin": jinja2.FunctionLoader(_builtin_loader())}, delimiter="/"
            ),
        ]
        if folder is not None or single is not None:
            loaders.append(jinja2.FunctionLoader(_file_loader(folder, single)))
        loaders.append(jinja2.FunctionLoader(_builtin_loader()))
        self.env = SandboxedEnvironment(
            loader=jinja2.ChoiceLoader(loaders),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=False,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates: dict[str, jinja2.Template] = {}
        #: the variables each template reads (its includes' too, as far as Jinja can tell)
        self.variables: dict[str, set[str]] = {}
        for name in TEMPLATE_NAMES:
            self.templates[name] = self._load(name)

    def _load(self, name: str) -> jinja2.Template:
        try:
            source, filename, _ = self.env.loader.get_source(self.env, name)  # type: ignore[union-attr]
            template = self.env.get_template(name)
        except jinja2.TemplateSyntaxError as exc:
            raise PromptTemplateError(
                f"prompt template {exc.filename or name}:{exc.lineno}: syntax error: {exc.message}"
            ) from None
        except jinja2.TemplateNotFound as exc:
            raise PromptTemplateError(
                f"prompt template {name}: it includes {exc.name!r}, which is neither in the "
                "template's folder nor a built-in (builtin/system.j2, builtin/user.j2, builtin/repair.j2)"
            ) from None
        self.variables[name] = self._check_names(source, filename or name)
        return template

    def _check_names(self, source: str, filename: str) -> set[str]:
        """Every variable the template reads must be one of :data:`TEMPLATE_VARIABLES`; returns
        the variables it reads (an ``include`` counts as reading them all)."""
        ast = self.env.parse(source)
        used = meta.find_undeclared_variables(ast)
        unknown = used - set(TEMPLATE_VARIABLES)
        if not unknown:
            if any(True for _ in ast.find_all((nodes.Include, nodes.Extends))):
                return set(TEMPLATE_VARIABLES)
            return used
        name = sorted(unknown)[0]
        line = next((n.lineno for n in ast.find_all(nodes.Name) if n.name == name), 1)
        raise PromptTemplateError(
            f"prompt template {filename}:{line}: undefined variable {name!r}; a template gets "
            f"{', '.join(TEMPLATE_VARIABLES)}"
        )

    def render(self, name: str, context: Mapping[str, Any]) -> str:
        """Render one template; any error is a one-line :class:`PromptTemplateError`."""
        template = self.templates[name]
        try:
            return template.render(**context).strip()
        except jinja2.TemplateNotFound as exc:
            where = _where(exc, template.filename or name)
            raise PromptTemplateError(
                f"prompt template {where}: it includes {exc.name!r}, which is neither in the "
                "template's folder nor a built-in (builtin/system.j2, builtin/user.j2, builtin/repair.j2)"
            ) from None
        except jinja2.TemplateError as exc:
            where = _where(exc, template.filename or name)
            raise PromptTemplateError(f"prompt template {where}: {exc}".splitlines()[0]) from None
        except Exception as exc:  # an error inside a template expression (e.g. 1/0)
            where = _where(exc, template.filename or name)
            raise PromptTemplateError(
                f"prompt template {where}: {type(exc).__name__}: {exc}".splitlines()[0]
            ) from None

    def __repr__(self) -> str:
        return f"<PromptTemplates prompt={self.source!r} persona={len(self.persona)} chars>"


@lru_cache(maxsize=1)
def default_templates() -> PromptTemplates:
    """The built-in templates without a persona (shared; templates are immutable)."""
    return PromptTemplates()
