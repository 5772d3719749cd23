"""The ``human`` agent: a person plays a seat from a terminal.

Each decision shows the seat's observation (its own state, the public market state and the
legal actions, drawn with ``rich``), then asks for the action in one of two ways:

- **guided**: pick an action type from the legal ones (by number or name), then enter the
  action's fields one at a time, read from the action's pydantic model: its type, bounds,
  description and default. A blank answer keeps the default (or leaves an optional field out).
  Each value is checked on its own as it is typed; a bad one is asked again with the reason, and
  the fields already entered are kept. The whole action is checked at the end (rules across
  fields, such as non-increasing bids); a failure there re-asks only the fields it names.
- **raw JSON**: paste the whole action, e.g. ``{"action_type": "wait"}``, at the action-type
  prompt. A malformed or illegal one is refused with the reason and asked again.

The agent returns only actions that parse and are legal in the phase, so a person's game is a
transcript like any other (replayable, exportable as SFT data). End of input (EOF) or Ctrl-C
raises :class:`HumanQuit` (a ``KeyboardInterrupt``): the runner ends the transcript with its
``aborted`` footer, every complete step kept.

All text another seat or a model wrote (messages, pitches, offers' notes, seat names) is shown as
plain text: ``rich`` markup is not interpreted and control characters (terminal escapes) are
replaced, so a message cannot restyle or take over the terminal.

``input_fn`` and ``console`` can be injected: tests and the docs play whole episodes with a
scripted list of answers. A person has no time limit, so run the seat without one
(``gpumarket play`` does; elsewhere pass ``agent_timeout=0``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agents.base import BaseAgent
from market.core.actions import (
    ACTION_CLASSES,
    ActionModel,
    ActionParseError,
    parse_action,
)
from market.core.ledger import ActionError
from market.core.phases import check_turn
from market.core.seats import DESIGNER
from market.environment import Observation

#: fields every action has that a person never needs to type
SKIPPED_FIELDS = frozenset({"action_type", "agent"})


class HumanQuit(KeyboardInterrupt):
    """The person ended the game (EOF or Ctrl-C at a prompt)."""


def clean(value: Any, limit: int = 2000) -> str:
    """``value`` as one safe line of terminal text: control characters (ANSI escapes, bells,
    carriage returns) become ``?``; cut to ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    out = "".join(ch if ch.isprintable() or ch == " " else "?" for ch in text[:limit])
    return out if len(text) <= limit else out + "..."


def schema_type(prop: dict[str, Any]) -> str:
    """A short description of a JSON-schema property: its type and bounds, e.g. ``int >= 1``."""
    if "anyOf" in prop:
        kinds = [schema_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(kinds) or "null"
    if "enum" in prop:
        return "one of " + ", ".join(str(v) for v in prop["enum"])
    if "$ref" in prop:
        return "object"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {schema_type(prop.get('items', {}))}"
    name = {"integer": "int", "number": "number", "string": "text", "boolean": "true/false"}.get(
        kind, kind
    )
    bounds = [
        f"{sign} {prop[key]:g}"
        for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="))
        if isinstance(prop.get(key), (int, float)) and abs(prop[key]) < 1e5
    ]
    return " ".join([name, *bounds])


def field_order(cls: type[BaseModel]) -> list[str]:
    """The fields a person fills in: required ones first, then optional ones, ``reasoning`` last."""
    names = [n for n in cls.model_fields if n not in SKIPPED_FIELDS]
    return sorted(names, key=lambda n: (n == "reasoning", not cls.model_fields[n].is_required()))


def schema_kinds(prop: dict[str, Any]) -> set[str]:
    """The JSON types a property admits, ``null`` left out."""
    options = prop.get("anyOf", [prop])
    return {str(p.get("type", "object")) for p in options} - {"null"}


def coerce(text: str, prop: dict[str, Any]) -> Any:
    """What a typed answer means for a field of schema ``prop``: a text field takes the answer
    as typed; others read it as JSON (numbers, true/false, lists, objects), and a list field also
    takes comma-separated items (``30, 20``) or one item."""
    kinds = schema_kinds(prop)
    if kinds == {"string"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        if "array" in kinds and ("," in text or "string" not in kinds):
            items = [p.strip() for p in text.split(",") if p.strip()]
            return [coerce(p, prop.get("items", {})) for p in items]
        return text
    if "array" in kinds and not isinstance(value, list) and "string" not in kinds:
        return [value]
    if "string" in kinds and not isinstance(value, (list, dict)) and "array" not in kinds:
        return text if isinstance(value, str) or not kinds & {"integer", "number"} else value
    return value


def check_field(value: Any, info: FieldInfo) -> Any:
    """``value`` validated as the field alone (its type, bounds and validators); raises
    :class:`pydantic.ValidationError`."""
    ann: Any = info.annotation
    if info.metadata:
        ann = Annotated[(ann, *info.metadata)]
    return TypeAdapter(ann).validate_python(value)


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return clean(str(err.get("msg", "invalid")), 300)


class HumanAgent(BaseAgent):
    """A seat played by a person at a terminal (see the module docstring)."""

    name = "human"
    roles = frozenset({"bidder", "designer"})

    def __init__(
        self,
        input_fn: Callable[[str], str] | None = None,
        console: Console | None = None,
    ) -> None:
        super().__init__()
        self.input_fn = input_fn if input_fn is not None else input
        self.console = console if console is not None else Console(highlight=False)
        self.stats = {"decisions": 0.0, "re_asked": 0.0, "raw_json": 0.0}

    # -- input -------------------------------------------------------------------------------

    def ask(self, prompt: str) -> str:
        """One answer; EOF or Ctrl-C end the game (:class:`HumanQuit`)."""
        try:
            return self.input_fn(prompt).strip()
        except (EOFError, KeyboardInterrupt):
            raise HumanQuit("the person left the game (end of input)") from None

    def say(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style))

    def refuse(self, text: str) -> None:
        self.stats["re_asked"] += 1
        self.say(f"  ! {clean(text, 500)}", "bold red")

    # -- the view ----------------------------------------------------------------------------

    def show(self, obs: Observation) -> None:
        """The seat's observation: the market, its own state, the legal actions."""
        c = self.console
        head = (
            f"{clean(obs.seat)} ({obs.role}) - round {obs.round} of 0..{obs.rounds_total - 1}, "
            f"phase {obs.phase}"
        )
        c.rule(Text(head, style="bold"))
        market = Table.grid(padding=(0, 2))
        market.add_row("mechanism", Text(clean(obs.mechanism.model_dump(mode="json"))))
        market.add_row("capacity", Text(f"{obs.capacity} blocks, reliability {obs.reliability:g}"))
        market.add_row("active labs", Text(clean(", ".join(obs.active_labs))))
        market.add_row("reputations", Text(clean(obs.reputations)))
        if obs.price_history:
            market.add_row("prices", Text(clean(obs.price_history[-5:])))
        if obs.last_result is not None:
            market.add_row("last round", Text(clean(obs.last_result)))
        c.print(Panel(market, title="market", title_align="left"))
        own = Table.grid(padding=(0, 2))
        if obs.role == "bidder":
            own.add_row("budget", Text(f"{obs.budget:.2f} credits, reputation {obs.reputation:g}"))
            own.add_row("blocks owned", Text(clean(obs.holdings)))
            for label, items in (
                ("jobs", obs.jobs),
                ("offers to you", obs.offers_received),
                ("your offers", obs.offers_sent),
                ("contracts", obs.contracts),
                ("coalitions", obs.coalitions),
            ):
                rows = [clean(i.model_dump(mode="json")) for i in items or []] or ["-"]
                own.add_row(label, Text("\n".join(rows)))
        elif obs.designer_stats is not None:
            own.add_row("designer", Text(clean(obs.designer_stats.model_dump(mode="json"))))
        c.print(Panel(own, title="you", title_align="left"))
        talk = [*obs.messages[-8:], *obs.pitches[-8:]]
        if talk:
            said = Table.grid(padding=(0, 2))
            for item in talk:
                data = item.model_dump(mode="json")
                who = data.get("sender") or data.get("lab") or "?"
                body = data.get("text") or clean(data)
                said.add_row(Text(clean(who)), Text(clean(body)))
            c.print(Panel(said, title="messages and pitches (written by others)"))
        menu = "  ".join(f"{k}) {a}" for k, a in enumerate(obs.legal_actions, 1))
        c.print(Text(f"legal actions: {menu}", style="cyan"))

    # -- the decision ------------------------------------------------------------------------

    def act(self, observation: Observation) -> ActionModel:
        """Show ``observation`` and ask until the person gives a legal action."""
        self.stats["decisions"] += 1
        self.show(observation)
        designer = observation.seat == DESIGNER
        while True:
            choice = self.ask(f"action (1-{len(observation.legal_actions)}, a name, or JSON) > ")
            if choice.startswith("{"):
                action = self.raw(choice, observation, designer)
            else:
                kind = self.pick(choice, observation.legal_actions)
                action = None if kind is None else self.guided(kind, observation, designer)
            if action is not None:
                self.say(
                    f"  -> {clean(action.model_dump(mode='json', exclude_none=True))}", "green"
                )
                return action

    def pick(self, choice: str, legal: Iterable[str]) -> str | None:
        options = list(legal)
        if choice.isdigit() and 1 <= int(choice) <= len(options):
            return options[int(choice) - 1]
        if choice in options:
            return choice
        self.refuse(
            f"{choice!r} is not a legal action now: give a number 1-{len(options)}, "
            "an action name from the list, or a whole action as a JSON object"
        )
        return None

    def raw(self, text: str, obs: Observation, designer: bool) -> ActionModel | None:
        try:
            action = parse_action(text, designer=designer)
            check_turn(action, obs.seat, obs.phase)
        except (ActionParseError, ActionError) as exc:
            self.refuse(str(exc))
            return None
        self.stats["raw_json"] += 1
        return action

    def guided(self, kind: str, obs: Observation, designer: bool) -> ActionModel:
        """Field-by-field entry of a ``kind`` action, re-asking only what is wrong."""
        cls = ACTION_CLASSES[kind]
        doc = (cls.__doc__ or "").strip().splitlines()
        if doc and cls.__doc__ != ActionModel.__doc__:
            self.say(f"  {kind}: {doc[0]}", "dim")
        fields = {n: cls.model_fields[n] for n in field_order(cls)}
        props = cls.model_json_schema()["properties"]
        values = self.fields(fields, props, list(fields))
        while True:
            try:
                action = parse_action({"action_type": kind, **values}, designer=designer)
                check_turn(action, obs.seat, obs.phase)
                return action
            except (ActionParseError, ActionError) as exc:
                self.refuse(str(exc))
                named = [n for n in fields if n in str(exc)] or list(fields)
                for n in named:
                    values.pop(n, None)
                values.update(self.fields(fields, props, named))

    def fields(
        self, fields: dict[str, FieldInfo], props: dict[str, Any], names: list[str]
    ) -> dict[str, Any]:
        """Ask each of ``names``; the answers that set a value (blank keeps the default)."""
        out: dict[str, Any] = {}
        for name in names:
            value = self.field(name, fields[name], props.get(name, {}))
            if value is not _UNSET:
                out[name] = value
        return out

    def field(self, name: str, info: FieldInfo, prop: dict[str, Any]) -> Any:
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):  # a nested object: its fields
            self.say(f"  {name}: {ann.__name__} (blank answers keep each default)", "dim")
            sub = {n: ann.model_fields[n] for n in field_order(ann)}
            return self.fields(sub, ann.model_json_schema()["properties"], list(sub))
        required = info.is_required()
        given = None if required else info.get_default(call_default_factory=True)
        default = (
            ""
            if required
            else ", blank = leave out"
            if given is None
            else f", blank = {clean(given, 60)}"
        )
        desc = f" - {clean(info.description, 160)}" if info.description else ""
        kind = schema_type(prop) if prop else "any"
        prompt = f"  {name} ({kind}{default}){desc}: "
        while True:
            text = self.ask(prompt)
            if not text:
                if not required:
                    return _UNSET
                self.refuse(f"{name} is required")
                continue
            value = coerce(text, prop)
            try:
                check_field(value, info)
            except ValidationError as exc:
                self.refuse(f"{name}: {first_error(exc)}; try again")
                continue
            return value


_UNSET: Any = object()
