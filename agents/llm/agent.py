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

import asyncio
import time
from collections.abc import Generator, Mapping
from typing import Any, Literal, Union
from urllib.parse import parse_qsl

from agents.base import BaseAgent
from agents.llm.backends.base import (
    RETRY_REASONS,
    Backend,
    BackendError,
    CallReport,
    Completion,
    ToolCall,
    announced,
    expected_call,
    reporting,
)
from agents.llm.backends.pool import ClientPool, Price, cost_usd, lookup_price
from agents.llm.cache import occurrence_scope
from agents.llm.conversation import first_tool_call, new_exchange, note_completion
from agents.llm.decision_grammar import in_credits, seat_mode, seat_schema
from agents.llm.memory import (
    DEFAULT_CONTEXT,
    DEFAULT_MEMORY,
    Memory,
    TokenCounter,
)
from agents.llm.parsing import extract_json
from agents.llm.prompts import (
    Messages,
    load_templates,
    prompt_budget,
    prompt_messages,
    repair_message,
)
from agents.llm.reasoning import (
    FIELD_RULE,
    effort_value,
    reasoning_mode,
    reasoning_tokens,
    split_think,
)
from agents.llm.spec import (
    agent_arguments,
    describe_error,
    spec_provider,
)
from agents.llm.tools import (
    TOOLS_RULE,
    action_tools,
    aprobe_tools,
    assistant_tool_message,
    call_to_action,
    decision_mode,
    probe_tools,
    tool_choice,
    tool_mode,
    tool_result_message,
)
from agents.scripted import truthful_bid
from market.core.action_checks import choices, validate_for
from market.core.actions import (
    ActionModel,
    ActionParseError,
    Bid,
    Wait,
    parse_action,
)
from market.environment import Observation

Fallback = Literal["safe", "truthful"]
STAT_KEYS: tuple[str, ...] = (
    "decisions",
    "requests",
    "retries",
    "parse_failures",
    "fallbacks",
    "backend_errors",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "cost_usd",
    *(f"retries_{reason}" for reason in RETRY_REASONS),
    "retry_wait_s",
    "queue_wait_s",
    "reasoning_tokens",
    "degraded_features",
    "over_budget",
    "semantic_refusals",
    "repeated_replies",
    "cutoffs",
)
MAX_ECHO_CHARS = 4_000  # a failed reply is echoed back this long in the repair message
#: a repair after a reply that repeated an earlier one samples at least this hot, with a new seed
REPEAT_TEMPERATURE = 0.7


class SemanticError(ActionParseError):
    """A well-formed action the env would refuse (``validate_for``), and the valid choices."""


# ---------------------------------------------------------------------------------------------
# the agent

Outcome = Union[Completion, BaseException]  # noqa: UP007
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
    def _request_params(self) -> dict[str, Any]:
        params = dict(self.params)
        if self.send_seed and self._seed is not None:
            params.setdefault("seed", self._seed)
        if self.reasoning == "native":
            params.setdefault("reasoning_effort", self.reasoning_effort)
        return params

    def _validate_value(self, value: Any, obs: Observation, semantic: bool = True) -> ActionModel:
        if isinstance(value, dict) and "action_type" not in value and "reasoning" in value:
            value = {k: v for k, v in value.items() if k != "reasoning"}  # the flat mechanism form
        action = in_credits(parse_action(value, designer=obs.role == "designer"))
        if action.action_type not in obs.legal_actions:
            raise ActionParseError(
                f"{action.action_type} is not allowed in the {obs.phase} phase; legal now: {', '.join(obs.legal_actions)}"
            )
        if action.agent is not None and action.agent != obs.seat:
            raise ActionParseError(
                f"'agent' is {action.agent!r} but you are {obs.seat}; drop 'agent'"
            )
        if semantic and (reasons := validate_for(action, obs)):  # the env's checks: repair loop
            raise SemanticError(
                f"the market would refuse this {action.action_type}: {reasons[0]}. "
                f"Valid now: {choices(obs, action.action_type)}"
            )
        return action

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
        self.stats["decisions"] += 1
        exchange = new_exchange(obs, self.model, degraded)
        self.last_exchange = exchange
        if not obs.legal_actions:
            action: ActionModel = Wait()
            exchange.update(
                action=action.model_dump(exclude_none=True),
                error="no legal actions: not this seat's turn",
            )
            return action
        tools = (
            action_tools(obs.legal_actions, self.reasoning == "field") if mode == "tools" else None
        )
        schema = None if tools else self._schema(obs)
        params = self._request_params()
        if tools:
            params.update(tools=tools, tool_choice=tool_choice(tools))
            exchange["tools"] = [t["function"]["name"] for t in tools]
        budget = prompt_budget(self.memory.context, self.params.get("max_tokens"))
        base: Messages = prompt_messages(obs, self.templates, max_tokens=budget)
        rules = [FIELD_RULE] if self.reasoning == "field" else []
        rules += [TOOLS_RULE] if tools else []
        if rules:
            base[0] = {"role": "system", "content": "\n".join([base[0]["content"], *rules])}
        memory = self.memory if self.memory.enabled else None
        if memory is not None:
            memory.begin(
                obs, base[0]["content"], base[1]["content"], tools, self.params.get("max_tokens")
            )
            memory.messages()  # resolves the token counter
            failure = memory.counter.failure
            if failure and (memory.counter.kind != "auto" or failure.startswith("count")):
                exchange["degraded"].append(f"token counter: {failure}; counted as characters")
        if exchange["degraded"]:
            self.stats["degraded_features"] += 1
        extra: Messages = []
        reply: dict[str, Any] | None = None
        call: ToolCall | None = None
        repeated = False
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                error = exchange["error"]
                if repeated:  # the same reply again: change the prompt and the sampling
                    error += " Your reply repeated an earlier reply word for word; write another."
                    hot = max(float(params.get("temperature") or 0.0), REPEAT_TEMPERATURE)
                    params = {**params, "temperature": hot}
                    if "seed" in params:
                        params["seed"] = (int(params["seed"]) + attempt) % (2**31)
                fix = repair_message(error, obs, self.templates)
                if call is not None:
                    extra += [assistant_tool_message(call), tool_result_message(call.id, fix)]
                else:
                    echo = (exchange["raw"] or "")[:MAX_ECHO_CHARS]
                    extra += [
                        {"role": "assistant", "content": echo},
                        {"role": "user", "content": fix},
                    ]
            if memory is not None:
                messages, info = memory.messages(extra)
                exchange["memory"] = info
                self.stats["over_budget"] += bool(info["over_budget"])
            else:
                messages = [*base, *extra]
            exchange["messages"] = messages
            exchange["attempts"] = attempt + 1
            outcome = yield messages, schema, params
            if not isinstance(outcome, Completion):
                exchange["error"] = (
                    f"backend error: {outcome}"
                    if str(outcome)
                    else f"backend error: {type(outcome).__name__}"
                )
                exchange["errors"].append(exchange["error"])
                break
            exchange["raw"] = outcome.text
            self.stats["degraded_features"] += note_completion(exchange, outcome.extra)
            repeated = outcome.text in exchange["raw_replies"]
            self.stats["repeated_replies"] += repeated
            exchange["raw_replies"].append(outcome.text)
            text, think = split_think(outcome.text)
            calls = list(getattr(outcome, "tool_calls", None) or []) if tools else []
            call = first_tool_call(calls, obs, int(self.stats["decisions"]), exchange)
            reply = assistant_tool_message(call) if call else {"role": "assistant", "content": text}
            field = None
            try:
                value = call_to_action(call) if call else extract_json(text)
                if isinstance(value, dict) and isinstance(value.get("reasoning"), str):
                    field = value["reasoning"]
                action = self._validate_value(value, obs)
            except ActionParseError as exc:
                kind = "semantic_refusals" if isinstance(exc, SemanticError) else "parse_failures"
                self.stats[kind] += 1
                exchange["error"] = str(exc)
                exchange["errors"].append(str(exc))
                continue
            finally:
                exchange["reasoning"], n = reasoning_tokens(
                    outcome, [outcome.reasoning, think, field], self.memory.counter.count
                )
                self.stats["reasoning_tokens"] += n
            exchange.update(action=action.model_dump(exclude_none=True), error=None)
            if memory is not None:
                memory.remember(reply, exchange["action"], False, call.id if call else None)
            return action
        self.stats["fallbacks"] += 1
        action = self.fallback_action(obs)
        exchange.update(action=action.model_dump(exclude_none=True), fallback=True)
        if memory is not None:
            memory.remember(reply, exchange["action"], True, call.id if call else None)
        return action

    def _account(self, outcome: Outcome, latency: float, report: CallReport | None = None) -> None:
        stats = self.stats
        stats["requests"] += 1
        if report is not None:  # transport retries and the wait for a slot, success or not
            for reason, count in report.retries.items():
                stats[f"retries_{reason}"] = stats.get(f"retries_{reason}", 0) + count
            stats["retry_wait_s"] += report.retry_wait_s
            stats["queue_wait_s"] += report.queued_s
            latency = max(0.0, latency - report.queued_s)  # latency excludes the queue
        stats["latency_s"] += latency
        if not isinstance(outcome, Completion):
            stats["backend_errors"] += 1
            return
        stats["prompt_tokens"] += outcome.prompt_tokens
        stats["cutoffs"] += outcome.extra.get("finish_reason") == "length"  # the token limit
        stats["completion_tokens"] += outcome.completion_tokens
        if outcome.cached:
            stats["cache_hits"] += 1
            return
        price = self.price_of(outcome.model)
        if self.budget is not None:  # charged at the seat's price, so the run total is their sum
            self.budget.charge(
                outcome.model or self.model, outcome.prompt_tokens, outcome.completion_tokens, price
            )
        if price is not None:
            stats["cost_usd"] += cost_usd(price, outcome.prompt_tokens, outcome.completion_tokens)

    def price_of(self, model: str | None = None) -> Price | None:
        """USD per million prompt and completion tokens of a completion by ``model`` (the name
        the server reported) of this seat: the seat's own ``prices`` first, then the run
        budget's table (``--price``); each looked up by the reported name, then by the seat's
        model name. None when neither prices it."""
        names = [n for n in (model, self.model) if n]
        tables = [self.prices, self.budget.prices if self.budget is not None else {}]
        for table in tables:
            for name in names:
                price = lookup_price(table, name)
                if price is not None:
                    return price
        return None

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
                outcome: Outcome
                with reporting() as report:
                    try:
                        with occurrence_scope(self._occurrences):
                            outcome = self.backend.complete(messages, schema, params)
                    except Exception as exc:  # a backend failure never escapes a seat
                        outcome = (
                            exc
                            if isinstance(exc, BackendError)
                            else BackendError(describe_error(exc))
                        )
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
                        outcome, latency = await self._acall(messages, schema, params)
                    self._account(outcome, latency, report)
                    messages, schema, params = decision.send(outcome)
            except StopIteration as stop:
                action: ActionModel = stop.value
                return action

    async def _acall(
        self, messages: Messages, schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> tuple[Outcome, float]:
        start = time.perf_counter()
        try:
            if isinstance(self.limiter, ClientPool):  # the backend takes the pool's slots itself
                with self.limiter.active():
                    return await self._arequest(
                        messages, schema, params
                    ), time.perf_counter() - start
            if self.limiter is not None:
                if self.limiter.full() and (ticket := expected_call()) is not None:
                    ticket.settle()  # a batch must not wait for a call that waits for a slot
                async with self.limiter:
                    start = time.perf_counter()  # latency excludes the wait for a slot
                    return await self._arequest(
                        messages, schema, params
                    ), time.perf_counter() - start
            return await self._arequest(messages, schema, params), time.perf_counter() - start
        except Exception as exc:
            outcome = exc if isinstance(exc, BackendError) else BackendError(describe_error(exc))
            return outcome, time.perf_counter() - start

    async def _arequest(
        self, messages: Messages, schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        with occurrence_scope(self._occurrences):  # wait_for's task copies this context
            call = self.backend.acomplete(messages, schema, params)
            if self.call_timeout is None:
                return await call
            try:
                return await asyncio.wait_for(call, self.call_timeout)
            except TimeoutError:
                pass
        raise BackendError(
            f"model {self.model}: no reply within call_timeout={self.call_timeout:g}s"
        )

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
