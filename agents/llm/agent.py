"""LLM seats: a chat model behind a :class:`~agents.llm.backends.base.Backend` fills any seat.

Each decision sends a short system message (the seat's role, the reply rules and the action types
legal now) and a user message (``Observation.to_prompt()`` plus the JSON schema of the legal
actions only); with memory (:mod:`agents.llm.memory`, ``memory=window:6`` by default) the seat's
earlier turns come between them and a later turn says what changed instead of repeating the
observation. ``reasoning`` (:mod:`agents.llm.reasoning`) asks for reasoning first or passes the
server's reasoning control; ``mode=tools`` (:mod:`agents.llm.tools`) offers the legal actions as
function tools. The schema also goes to the backend for structured output where the server supports
it. The reply is parsed leniently (:func:`agents.llm.parsing.extract_json`), validated with
:func:`market.core.actions.parse_action` and checked against the phase's legal action types. A reply
that fails is *repaired*: the model is asked again with the error (at most ``retries`` times);
after that, or on any backend error or timeout, the agent plays a safe fallback action.

Everything is counted in ``agent.stats`` (see :data:`STAT_KEYS`); ``agent.last_exchange`` keeps
the last decision's messages, raw replies, parsed action and error for transcripts.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any, Literal, Union
from urllib.parse import parse_qsl

from agents.base import BaseAgent
from agents.llm.backends.base import Backend, CallReport, Completion, announced, reporting
from agents.llm.backends.pool import Price, cost_usd
from agents.llm.calls import STAT_KEYS as STAT_KEYS  # named here by docs and tests
from agents.llm.calls import Outcome, acomplete, complete, count_call, find_price
from agents.llm.conversation import Conversation, new_exchange, note_backend_error
from agents.llm.decision_grammar import seat_mode, seat_schema
from agents.llm.memory import DEFAULT_CONTEXT, DEFAULT_MEMORY, Memory, TokenCounter
from agents.llm.parsing import extract_json
from agents.llm.prompts import Messages, load_templates
from agents.llm.prompts import prompt_messages as prompt_messages  # training data imports it here
from agents.llm.reasoning import effort_value, reasoning_mode, split_think
from agents.llm.reply_reader import Reading, read_reply, validate_value
from agents.llm.reply_reader import SemanticError as SemanticError  # its old home
from agents.llm.spec import agent_arguments, spec_provider
from agents.llm.tools import (
    action_tools,
    aprobe_tools,
    decision_mode,
    probe_tools,
    tool_choice,
    tool_mode,
)
from agents.scripted import truthful_bid
from market.core.actions import ActionModel, Bid, Wait
from market.environment import Observation

Fallback = Literal["safe", "truthful"]

# ---------------------------------------------------------------------------------------------
# the agent

Request = tuple[Messages, Union[dict[str, Any], None], dict[str, Any]]  # noqa: UP007


class LLMAgent(BaseAgent):
    """A seat played by a chat model (any :class:`Backend`); fills designer and bidder seats.

    Args:
        backend: the model (``OpenAIBackend``, a transformers backend, a ``CachedBackend``...).
        retries: repair re-asks after an unusable reply, per decision.
        fallback: ``"safe"`` (wait; in bidding an empty bid) or ``"truthful"`` (in bidding the
            truthful bid of ``agents.scripted``).
        temperature, max_tokens: sampling parameters sent with every request (None: omit).
        params: further sampling parameters (top_p, stop, ...).
        send_seed: send the seat's seed (from ``reset``) as the request ``seed``.
        structured: pass the legal-action schema to the backend for structured output.
        prices: ``{model: (USD per million prompt tokens, USD per million completion tokens)}``,
            the unit providers publish and ``--price`` takes; a key also matches model names it
            prefixes. Cache hits cost nothing.
        prompt: the seat's prompt templates: a folder with ``system.j2``/``user.j2``/``repair.j2``
            (missing ones are the built-ins) or one file for the system prompt
            (:mod:`agents.llm.prompt_templates`); a bad template raises ``PromptTemplateError``.
        persona: a persona paragraph for the system prompt, as text or a file's path.
        call_timeout: hard limit in seconds on one async request (``aact``), on top of the
            backend's own timeout.
        limiter: a shared :class:`~agents.llm.backends.base.RequestLimiter`, or a
            :class:`~agents.llm.backends.pool.ClientPool` whose shared clients and per-endpoint limits
            the backend then uses (the runner sets it).
        budget: a :class:`~agents.llm.backends.pool.Budget` charged with every completion's tokens
            (the runner sets it; cache hits are free). Its price table prices this seat's
            completions when ``prices`` does not.
        memory: ``none`` (a fresh prompt per decision), ``window:N`` (the last N earlier turns),
            ``full`` or ``summary[:N]``; see :mod:`agents.llm.memory`.
        context: the model's context in tokens: a request (messages and tools) never exceeds
            ``context - max_tokens``; None: no limit.
        counter: how prompt tokens are counted: ``auto`` (the backend's ``count_tokens`` hook,
            else tiktoken offline for OpenAI models, else 3 characters a token), ``model``,
            ``tiktoken`` or ``chars``. Pin ``chars`` for a replay on a machine without the model.
        reasoning: ``none``, ``field`` (a ``reasoning`` string first in the reply) or ``native``
            (``reasoning_effort`` sent to the server); see :mod:`agents.llm.reasoning`.
        reasoning_effort: the effort ``native`` sends (minimal, low, medium, high).
        mode: ``json``, ``tools`` (legal actions as function tools) or ``auto`` (tools where the
            backend says it supports them, else JSON, recorded as degraded).
    """

    name = "llm"
    roles = frozenset({"designer", "bidder"})

    def __init__(
        self,
        backend: Backend,
        *,
        retries: int = 2,
        fallback: Fallback = "safe",
        temperature: float | None = 0.0,
        max_tokens: int | None = 512,
        params: Mapping[str, Any] | None = None,
        send_seed: bool = True,
        structured: bool = True,
        prices: Mapping[str, Price] | None = None,
        call_timeout: float | None = None,
        limiter: Any = None,
        budget: Any = None,
        spec: str | None = None,
        memory: str = DEFAULT_MEMORY,
        context: int | None = DEFAULT_CONTEXT,
        counter: str = "auto",
        reasoning: str = "none",
        reasoning_effort: str = "low",
        mode: str = "json",
        prompt: str | None = None,
        persona: str | None = None,
    ) -> None:
        super().__init__()
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if fallback not in ("safe", "truthful"):
            raise ValueError(f"fallback must be 'safe' or 'truthful', got {fallback!r}")
        self.backend = backend
        self.retries = int(retries)
        self.fallback: Fallback = fallback
        self.params: dict[str, Any] = {
            k: v
            for k, v in {
                "temperature": temperature,
                "max_tokens": max_tokens,
                **(params or {}),
            }.items()
            if v is not None
        }
        self.send_seed = send_seed
        self.structured = structured
        self.prices = {str(k): (float(v[0]), float(v[1])) for k, v in (prices or {}).items()}
        self.call_timeout = call_timeout
        if limiter is not None:
            self.limiter = limiter
        if budget is not None:
            self.budget = budget
        self.spec = spec or f"llm?model={getattr(backend, 'model', '?')}"
        self.memory = Memory(
            memory, context, TokenCounter(backend, str(getattr(backend, "model", "")), counter)
        )
        self.reasoning = reasoning_mode(reasoning)
        self.reasoning_effort = effort_value(reasoning_effort)
        self.mode = seat_mode(tool_mode(mode), backend)  # llm:hf refuses tools
        # the seat's prompt templates and persona, checked now (PromptTemplateError, one line)
        self.templates = load_templates(prompt, persona)
        self._seed: int | None = None
        self._occurrences: dict[str, int] = {}  # repeated identical requests, for the cache
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)
        self.last_exchange: dict[str, Any] | None = None

    @property
    def model(self) -> str:
        return str(getattr(self.backend, "model", "?"))

    def reset(self, seed: int | None = None) -> None:
        """Reseed and zero the per-episode accounting."""
        super().reset(seed)
        self._seed = None if seed is None else int(seed) % (2**31)
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        self.last_exchange = None
        self._occurrences = {}
        self.memory.reset()

    # --- one decision, as a coroutine-free generator: yields requests, receives outcomes -------
    def _validate_value(self, value: Any, obs: Observation, semantic: bool = True) -> ActionModel:
        return validate_value(value, obs, semantic)  # a subclass may skip the semantic check

    def parse_reply(self, raw: str, obs: Observation, semantic: bool = True) -> ActionModel:
        """A reply as this seat turns it into an action: extracted, validated, its type legal now
        and addressed to this seat, and (``semantic``) one the env would accept. Raises
        :class:`ActionParseError` (the repair message). A GRPO reward passes ``semantic=False``:
        the env itself refuses the action and charges its penalty."""
        return self._validate_value(extract_json(split_think(raw)[0]), obs, semantic)

    def fallback_action(self, obs: Observation) -> ActionModel:
        """The action played when the model gives nothing usable."""
        legal = obs.legal_actions
        if obs.phase == "bidding" and "bid" in legal:
            if self.fallback == "truthful" and obs.role == "bidder":
                return truthful_bid(obs)
            return Bid(bids=[])
        return Wait()

    def _decide(
        self, obs: Observation, mode: str = "json", degraded: tuple[str, ...] = ()
    ) -> Generator[Request, Outcome, ActionModel]:
        """One decision: yields each attempt's request, is sent its outcome (a completion or the
        backend's exception) and returns the action. An unusable reply is repaired up to
        ``retries`` times, then (or after a backend error) the fallback is played. The messages
        are a :class:`Conversation`'s, the replies are read by :func:`read_reply`."""
        self.stats["decisions"] += 1
        exchange = self.last_exchange = new_exchange(obs, self.model, degraded)
        if not obs.legal_actions:
            return self._no_turn(exchange)
        tools, schema, params = self._request(obs, mode, exchange)
        talk = self._conversation(obs, tools, exchange)
        last: Reading | None = None  # the latest completion's reading
        for attempt in range(self.retries + 1):
            if last is not None:  # the previous attempt's reply was unusable
                self.stats["retries"] += 1
                params = talk.repair(last, params, attempt)
            messages, info = talk.messages()
            if info is not None:
                exchange["memory"] = info
                self.stats["over_budget"] += bool(info["over_budget"])
            exchange.update(messages=messages, attempts=attempt + 1)
            outcome = yield messages, schema, params
            if not isinstance(outcome, Completion):
                note_backend_error(exchange, outcome)
                break
            last = self._read(outcome, obs, exchange, bool(tools))
            if last.action is not None:
                talk.remember(last, exchange["action"], fallback=False)
                return last.action
        self.stats["fallbacks"] += 1
        action = self.fallback_action(obs)
        exchange.update(action=action.model_dump(exclude_none=True), fallback=True)
        talk.remember(last, exchange["action"], fallback=True)
        return action

    @staticmethod
    def _no_turn(exchange: dict[str, Any]) -> ActionModel:
        """An observation with no legal action: wait, asking the model nothing."""
        action = Wait()
        error = "no legal actions: not this seat's turn"
        exchange.update(action=action.model_dump(exclude_none=True), error=error)
        return action

    def _request(
        self, obs: Observation, mode: str, exchange: dict[str, Any]
    ) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None, dict[str, Any]]:
        """A decision's function tools (``mode == "tools"``, else None), schema and parameters."""
        field = self.reasoning == "field"
        tools = action_tools(obs.legal_actions, field) if mode == "tools" else None
        schema = None if tools else self._schema(obs)
        params = dict(self.params)
        if self.send_seed and self._seed is not None:
            params.setdefault("seed", self._seed)
        if self.reasoning == "native":
            params.setdefault("reasoning_effort", self.reasoning_effort)
        if tools:
            params.update(tools=tools, tool_choice=tool_choice(tools))
            exchange["tools"] = [t["function"]["name"] for t in tools]
        return tools, schema, params

    def _conversation(
        self, obs: Observation, tools: list[dict[str, Any]] | None, exchange: dict[str, Any]
    ) -> Conversation:
        """The decision's conversation; a decision with a degraded feature is counted once."""
        talk = Conversation(
            obs,
            self.templates,
            self.memory,
            tools,
            reply_tokens=self.params.get("max_tokens"),
            field_rule=self.reasoning == "field",
        )
        if talk.degraded:
            exchange["degraded"].append(talk.degraded)
        self.stats["degraded_features"] += bool(exchange["degraded"])
        return talk

    def _read(
        self, outcome: Completion, obs: Observation, exchange: dict[str, Any], tools: bool
    ) -> Reading:
        """Read one completion (:func:`read_reply`, with this seat's ``_validate_value``) and
        count it in ``stats``."""
        reading = read_reply(
            outcome,
            obs,
            exchange,
            tools=tools,
            decision=int(self.stats["decisions"]),  # names a tool call that has no id
            validate=self._validate_value,
            count=self.memory.counter.count,
        )
        self.stats["degraded_features"] += reading.degraded
        self.stats["repeated_replies"] += reading.repeated
        self.stats["reasoning_tokens"] += reading.reasoning_tokens
        if reading.error is not None:
            self.stats["semantic_refusals" if reading.semantic else "parse_failures"] += 1
        return reading

    def _account(self, outcome: Outcome, latency: float, report: CallReport | None = None) -> None:
        paid = count_call(self.stats, outcome, latency, report)
        if paid is None:  # a backend error or a cache hit: nothing to pay
            return
        tokens = paid.prompt_tokens, paid.completion_tokens
        price = self.price_of(paid.model)
        if self.budget is not None:  # charged at the seat's price, so the run total is their sum
            self.budget.charge(paid.model or self.model, *tokens, price)
        if price is not None:
            self.stats["cost_usd"] += cost_usd(price, *tokens)

    def price_of(self, model: str | None = None) -> Price | None:
        """USD per million prompt and completion tokens of a completion by ``model`` (the name
        the server reported) of this seat: the seat's own ``prices`` first, then the run
        budget's table (``--price``); each looked up by the reported name, then by the seat's
        model name. None when neither prices it."""
        names = [n for n in (model, self.model) if n]
        run_prices = self.budget.prices if self.budget is not None else {}
        return find_price([self.prices, run_prices], names)

    def _schema(self, obs: Observation) -> dict[str, Any] | None:
        reasoning = self.reasoning == "field"  # the hf backend: this decision's own grammar
        return seat_schema(
            obs, self.backend, self.params, structured=self.structured, reasoning=reasoning
        )

    # --- drivers ----------------------------------------------------------------------------
    def act(self, observation: Observation) -> ActionModel:
        probe = self.mode == "auto" and bool(observation.legal_actions)
        decision = self._decide(
            observation,
            *decision_mode(self.mode, self.backend, probe_tools(self.backend) if probe else None),
        )
        try:
            messages, schema, params = next(decision)
            while True:
                start = time.perf_counter()
                with reporting() as report:
                    outcome = complete(self.backend, messages, schema, params, self._occurrences)
                self._account(outcome, time.perf_counter() - start, report)
                messages, schema, params = decision.send(outcome)
        except StopIteration as stop:
            action: ActionModel = stop.value
            return action

    async def aact(self, observation: Observation) -> ActionModel:
        probe = self.mode == "auto" and bool(observation.legal_actions)
        async with announced(self.backend if observation.legal_actions else None):
            decision = self._decide(
                observation,
                *decision_mode(
                    self.mode, self.backend, await aprobe_tools(self.backend) if probe else None
                ),
            )
            try:
                messages, schema, params = next(decision)
                while True:
                    with reporting() as report:
                        outcome, latency = await acomplete(
                            self.backend,
                            messages,
                            schema,
                            params,
                            occurrences=self._occurrences,
                            limiter=self.limiter,
                            timeout=self.call_timeout,
                        )
                    self._account(outcome, latency, report)
                    messages, schema, params = decision.send(outcome)
            except StopIteration as stop:
                action: ActionModel = stop.value
                return action

    # --- construction from a spec --------------------------------------------------------------
    @classmethod
    def from_params(cls, provider: str = "openai", **params: Any) -> LLMAgent:
        """Build from spec parameters (strings are converted), e.g. for
        ``llm:openai?model=gpt-4o-mini&base_url=...&retries=1&cache=runs/llm.sqlite``.

        Agent parameters (:data:`AGENT_PARAMS`): ``retries``, ``fallback``, ``temperature``,
        ``max_tokens``, ``send_seed``, ``structured``, ``call_timeout``, ``prompt``, ``persona``, ``price_prompt`` and
        ``price_completion`` (USD per million tokens), ``cache`` (a SQLite path) and
        ``cache_mode``. Everything else goes to the provider's backend (``openai``:
        :class:`~agents.llm.backends.openai_backend.OpenAIBackend`). An unknown parameter raises
        ``TypeError`` naming every parameter the spec takes, with the nearest as a suggestion.
        """
        spec, backend, agent_kw = agent_arguments(provider, params)
        return cls(backend, spec=spec, **agent_kw)

    @classmethod
    def from_spec(cls, spec: str) -> LLMAgent:
        """``llm:PROVIDER?key=value&...`` (``llm?...`` means the openai provider)."""
        head, _, query = spec.partition("?")
        name, _, provider = head.partition(":")
        if name.strip() != "llm":
            raise ValueError(f"not an llm spec: {spec!r}")
        provider, params = spec_provider(provider.strip() or "openai", dict(parse_qsl(query)))
        return cls.from_params(provider, **params)

    def __repr__(self) -> str:
        return f"<LLMAgent model={self.model!r} backend={self.backend!r}>"


def make_llm_agent(provider: str = "openai", params: Mapping[str, Any] | None = None) -> LLMAgent:
    """The registry's entry point for ``llm:PROVIDER?params`` (values may be strings or already
    coerced). Raises ``TypeError``/``ValueError`` for bad parameters (including a missing API key)."""
    provider, kwargs = spec_provider(provider or "openai", dict(params or {}))
    return LLMAgent.from_params(provider, **kwargs)
