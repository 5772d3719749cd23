"""The ``human`` agent: a person plays a seat from a terminal.

Each turn shows, in plain sentences from :mod:`market.environment.seat_guide` (the browser seat
says the same):

1. what happened since the seat's last turn: the market's verdict on its last action (accepted,
   or the exact refusal and its penalty), the auction's result, offers, messages, trades,
   coalition changes, its budget, blocks and jobs, and its rewards by component when the runner
   passes them (:meth:`HumanAgent.note_rewards`);
2. the screen: the market, the seat's budget, blocks by round, jobs, offers, contracts and
   coalitions;
3. a numbered menu of the actions valid now, each with its meaning.

The person picks an action by number or name, then answers only the fields it needs, with the
valid choices listed (other labs, its offers, coalitions, jobs, rounds); a blank answer keeps
the shown default. Adding ``+`` to the pick (``3+``) also asks the optional fields (message,
conditions, reasoning, ...). Each value is checked as it is typed (type, bounds, choices) and a
bad one is asked again with the reason; the whole action is checked at the end (rules across
fields, such as non-increasing bids), and a failure re-asks only the fields it names. A whole
action can be pasted as JSON instead; it is checked only for form and phase, so the market itself
judges it. Right after the action, the runner may show the market's verdict
(:meth:`HumanAgent.note_verdict`; ``gpumarket play`` does), else it opens the next turn's story.

The agent returns only actions that parse and are legal in the phase, so a person's game is a
transcript like any other (replayable, exportable as SFT data). End of input (EOF) or Ctrl-C
raises :class:`HumanQuit` (a ``KeyboardInterrupt``): the runner ends the transcript with its
``aborted`` footer, every complete step kept.

All text another seat or a model wrote is shown as plain text: ``rich`` markup is not
interpreted and control characters (terminal escapes) are replaced, so a message cannot restyle
or take over the terminal.

``input_fn`` and ``console`` can be injected: tests and the docs play whole episodes with a
scripted list of answers. A person has no time limit, so run the seat without one
(``gpumarket play`` does; elsewhere pass ``agent_timeout=0``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from agents.base import BaseAgent
from market.core.actions import (
    ACTION_CLASSES,
    ActionModel,
    ActionParseError,
    MechanismUpdate,
    parse_action,
)
from market.core.ledger import ActionError
from market.core.phases import check_turn
from market.core.seats import DESIGNER
from market.environment import (
    ActionChoice,
    FieldChoice,
    LastActionView,
    Observation,
    sections,
    story,
    valid_actions,
    verdict,
)

#: fields every action has that a person never needs to type
SKIPPED_FIELDS = frozenset({"action_type", "agent"})
YES, NO = frozenset({"y", "yes", "true", "1"}), frozenset({"n", "no", "false", "0"})


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


def model_field(kind: str, name: str) -> tuple[FieldInfo, dict[str, Any]] | None:
    """The pydantic field behind ``name`` of a ``kind`` action (``mechanism.x`` for a field of
    the designer's mechanism) and its JSON schema; None if the action has no such field."""
    cls: type[BaseModel] = ACTION_CLASSES[kind]
    if name.startswith("mechanism."):
        cls, name = MechanismUpdate, name.removeprefix("mechanism.")
    info = cls.model_fields.get(name)
    if info is None:
        return None
    return info, cls.model_json_schema()["properties"].get(name, {})


def read(text: str, f: FieldChoice) -> Any:
    """A typed answer as the value of field ``f``; ValueError (the fix, one line) if it is not
    one. Choices are taken by number or by value."""
    if f.choices:
        values = [c.value for c in f.choices]
        picked = []
        for item in [p.strip() for p in text.split(",")] if f.kind == "choices" else [text]:
            if item.isdigit() and 1 <= int(item) <= len(values) and not numbered(f):
                item = values[int(item) - 1]
            if item not in values:
                raise ValueError(f"pick a number 1-{len(values)} or one of: {', '.join(values)}")
            picked.append(item)
        if f.kind == "choices":
            return "all" if picked == ["all"] else picked
        return picked[0] == "true" if f.kind == "bool" else picked[0]
    try:
        if f.kind == "int":
            return int(text)
        if f.kind == "number":
            return float(text)
        if f.kind == "numbers":
            return [float(p) for p in text.strip("[] ").replace(",", " ").split()]
        if f.kind == "json":
            return json.loads(text)
    except ValueError:
        raise ValueError(_HOW[f.kind]) from None
    if f.kind == "bool":
        if text.lower() not in YES | NO:
            raise ValueError("answer yes or no")
        return text.lower() in YES
    return text


def numbered(f: FieldChoice) -> bool:
    """Whether ``f``'s choices are numbers themselves (rounds): then a typed number is the
    value, never a position in the list."""
    return bool(f.choices) and all(c.value.isdigit() for c in f.choices)


_HOW = {
    "int": "give a whole number, e.g. 2",
    "number": "give a number, e.g. 30 or 12.5",
    "numbers": "give numbers separated by commas, highest first, e.g. 40, 30",
    "json": 'give JSON, e.g. {"note": "net 30"}',
}


def plain(action: ActionModel) -> str:
    """An action in words for the echo line: ``send_offer: to bidder_1, blocks 2, price 30``."""
    data = action.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data.pop("action_type", None)
    if isinstance(data.get("mechanism"), dict):
        data.update({f"mechanism.{k}": v for k, v in data.pop("mechanism").items()})

    def show(v: Any) -> str:
        if isinstance(v, list):
            return ", ".join(show(x) for x in v) or "none"
        return f"{v:g}" if isinstance(v, float) else str(v)

    parts = "; ".join(f"{k.replace('_', ' ')} {show(v)}" for k, v in data.items())
    return f"{action.action_type}" + (f": {parts}" if parts else "")


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
        self.previous: Observation | None = None  # the seat's observation at its last turn
        self.rewards: dict[str, float] | None = None  # since the last turn (note_rewards)
        self.told: str | None = None  # the verdict already shown right after the action

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.previous, self.rewards, self.told = None, None, None

    # -- what the runner tells the seat ------------------------------------------------------

    def note_rewards(self, components: Mapping[str, float]) -> None:
        """The seat's rewards by component since its last turn, told at the next turn."""
        self.rewards = dict(components)

    def note_verdict(self, last: LastActionView | None) -> None:
        """Show the market's verdict on the action just played (the runner calls this right
        after the env's step); the next turn's story does not repeat it."""
        if last is None:
            return
        self.told = verdict(last)
        self.say(self.told, "bold green" if last.accepted else "bold red")

    def farewell(self, final: Observation) -> None:
        """The end of the game: what happened after the seat's last turn."""
        self.news(final, "The episode is over. Since your last turn:")

    # -- input and output --------------------------------------------------------------------

    def ask(self, prompt: str) -> str:
        """One answer; EOF or Ctrl-C end the game (:class:`HumanQuit`)."""
        try:
            return self.input_fn(prompt).strip()
        except (EOFError, KeyboardInterrupt):
            raise HumanQuit("the person left the game (end of input)") from None

    def say(self, text: str, style: str = "", indent: int = 0) -> None:
        """One line of plain text (never markup); wrapped lines keep the indent."""
        self.console.print(Padding(Text(clean(text), style=style), (0, 0, 0, indent), expand=False))

    def refuse(self, text: str) -> None:
        self.stats["re_asked"] += 1
        self.say(f"! {clean(text, 500)}", "bold red", 2)

    def news(self, obs: Observation, heading: str) -> None:
        """The story since the last turn (the verdict shown right after the action left out)."""
        lines = [s for s in story(self.previous, obs, self.rewards) if s != self.told]
        self.previous, self.rewards, self.told = obs, None, None
        if not lines:
            return
        self.say(heading, "bold")
        last = obs.last_action
        refusal = verdict(last) if last is not None and not last.accepted else None
        for line in lines:
            self.say(f"* {line}", "bold red" if line == refusal else "", 2)

    def show(self, obs: Observation, menu: list[ActionChoice]) -> None:
        """The screen: the seat's state in sentences, then the actions valid now."""
        for k, (heading, body) in enumerate(sections(obs)):
            self.say(heading, "bold" if k else "bold reverse")
            for line in body:
                self.say(line, "", 2)
        self.say("What you can do now:", "bold cyan")
        grid = Table.grid(padding=(0, 2))
        for k, c in enumerate(menu, 1):
            grid.add_row(Text(f"{k:>2})"), Text(c.action_type, "cyan"), Text(clean(c.meaning)))
        self.console.print(Padding(grid, (0, 0, 0, 1), expand=False))

    # -- the decision ------------------------------------------------------------------------

    def act(self, observation: Observation) -> ActionModel:
        """Tell the story, show the screen and ask until the person gives a legal action."""
        self.stats["decisions"] += 1
        self.console.rule(Text(f"{clean(observation.seat)}: your turn", style="bold"))
        self.news(observation, "Since your last turn:")
        menu = valid_actions(observation)
        self.show(observation, menu)
        designer = observation.seat == DESIGNER
        while True:
            answer = self.ask(
                f"Your choice (1-{len(menu)} or a name; add + for optional fields; "
                "or paste an action as JSON) > "
            )
            if answer.startswith("{"):
                action = self.raw(answer, observation, designer)
            else:
                picked = self.pick(answer, menu)
                action = None if picked is None else self.guided(*picked, observation, designer)
            if action is not None:
                self.say(f"You play {clean(plain(action), 400)}", "green", 2)
                return action

    def pick(self, answer: str, menu: list[ActionChoice]) -> tuple[ActionChoice, bool] | None:
        """The menu entry ``answer`` names (by number or name) and whether it ends with ``+``."""
        more = answer.endswith("+")
        key = answer.rstrip("+").strip()
        names = [c.action_type for c in menu]
        if key.isdigit() and 1 <= int(key) <= len(menu):
            return menu[int(key) - 1], more
        if key in names:
            return menu[names.index(key)], more
        self.refuse(
            f"{answer!r} is not one of the actions you can take now: give a number "
            f"1-{len(menu)} or a name from the list (or a whole action as JSON)"
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

    def guided(
        self, choice: ActionChoice, more: bool, obs: Observation, designer: bool
    ) -> ActionModel:
        """The fields ``choice`` needs (its optional ones too with ``more``), re-asking only
        what is wrong."""
        kind = choice.action_type
        asked = [f.name for f in choice.fields] + (list(choice.extra) if more else [])
        values = self.answers(choice, asked)
        while True:
            try:
                action = parse_action({"action_type": kind, **nest(values)}, designer=designer)
                check_turn(action, obs.seat, obs.phase)
                return action
            except (ActionParseError, ActionError) as exc:
                self.refuse(str(exc))
                named = [n for n in asked if n.rpartition(".")[2] in str(exc)] or asked
                for n in named:
                    values.pop(n, None)
                values.update(self.answers(choice, named))

    def answers(self, choice: ActionChoice, names: list[str]) -> dict[str, Any]:
        """Ask each of ``names`` of ``choice``; the answers that set a value."""
        given = {f.name: f for f in choice.fields}
        out: dict[str, Any] = {}
        for name in names:
            f = given.get(name) or extra_field(choice.action_type, name)
            value = self.field(choice.action_type, f)
            if value is not _UNSET:
                out[name] = value
        return out

    def field(self, kind: str, f: FieldChoice) -> Any:
        """One field's answer: its choices listed, checked on its own, asked until it is good."""
        self.say(f"{f.name}: {f.prompt}", "bold", 2)
        if numbered(f):  # rounds: typed as their number, so no list numbers beside them
            self.say("   ".join(c.label for c in f.choices), "", 4)
        elif f.choices and all(c.label == c.value for c in f.choices):
            self.say("   ".join(f"{k}) {c.value}" for k, c in enumerate(f.choices, 1)), "", 4)
        else:
            for k, c in enumerate(f.choices, 1):
                self.say(f"{k}) {c.label}", "", 4)
        several = " (several: 1, 3)" if f.kind == "choices" else ""
        blank = (
            f"blank = {f.default}"
            if f.default not in (None, "")
            else "blank = none"
            if f.default == ""
            else "blank = skip"
            if not f.required
            else "required"
        )
        behind = model_field(kind, f.name)
        while True:
            text = self.ask(f"  {f.name} ({blank}){several} > ")
            if not text:
                if f.default is not None:
                    text = f.default
                elif not f.required:
                    return _UNSET
                else:
                    self.refuse(f"{f.name} is required")
                    continue
            try:
                value = read(text, f)
                if behind is not None:
                    check_field(value, behind[0])
            except ValidationError as exc:
                self.refuse(f"{f.name}: {first_error(exc)}; try again")
                continue
            except ValueError as exc:
                self.refuse(f"{f.name}: {exc}; try again")
                continue
            return value


def extra_field(kind: str, name: str) -> FieldChoice:
    """An optional field not asked by default, described from the action's model."""
    behind = model_field(kind, name)
    info, prop = behind if behind is not None else (None, {})
    desc = (
        clean(info.description.replace("`", ""), 160)
        if info is not None and info.description
        else ""
    )
    kinds = schema_kinds(prop)
    how = {"integer": "int", "number": "number", "boolean": "bool"}.get(
        min(kinds, default=""), "text"
    )
    if kinds - {"integer", "number", "boolean", "string"}:  # lists and objects: typed as JSON
        return FieldChoice(name, desc or f"{name} as JSON", False, kind="json")
    return FieldChoice(
        name, desc or f"{name.replace('_', ' ')} ({schema_type(prop)})", False, kind=how
    )


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """The answers as an action's fields: ``{"mechanism.x": v}`` -> ``{"mechanism": {"x": v}}``."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        head, _, rest = name.partition(".")
        if rest:
            out.setdefault(head, {})[rest] = value
        else:
            out[name] = value
    return out


_UNSET: Any = object()
