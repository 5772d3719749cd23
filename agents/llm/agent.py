"""LLM seats: a chat model behind a :class:`~agents.llm.backends.base.Backend` fills any seat.

Each decision sends a short system message (the seat's role, the reply rules and the action types
legal now) and a user message (``Observation.to_prompt()`` plus the JSON schema of the legal
actions only). The schema also goes to the backend for structured output where the server supports
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
    reporting,
)
from agents.llm.backends.pool import ClientPool, Price, cost_usd, lookup_price
from agents.llm.cache import CachedBackend, occurrence_scope
from agents.llm.parsing import extract_json
from agents.llm.prompts import (
    Messages,
    legal_action_schema,
    load_templates,
    prompt_messages,
    repair_message,
)
from agents.llm.spec import (
    AGENT_PARAM_TYPES,
    backend_class,
    check_names,
    coerce_params,
    describe_error,
    model_name,
    price_value,
)
from agents.scripted import truthful_bid
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
)
MAX_ECHO_CHARS = 4_000  # a failed reply is echoed back this long in the repair message

# ---------------------------------------------------------------------------------------------
# the agent

Outcome = Union[Completion, BaseException]  # noqa: UP007


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

    # --- one decision, as a coroutine-free generator: yields requests, receives outcomes -------
    def _request_params(self) -> dict[str, Any]:
        params = dict(self.params)
        if self.send_seed and self._seed is not None:
            params.setdefault("seed", self._seed)
        return params

    def _validate(self, raw: str, obs: Observation) -> ActionModel:
        action = parse_action(extract_json(raw), designer=obs.role == "designer")
        if action.action_type not in obs.legal_actions:
            raise ActionParseError(
                f"{action.action_type} is not allowed in the {obs.phase} phase; legal now: {', '.join(obs.legal_actions)}"
            )
        if action.agent is not None and action.agent != obs.seat:
            raise ActionParseError(
                f"'agent' is {action.agent!r} but you are {obs.seat}; drop 'agent'"
            )
        return action

    def parse_reply(self, raw: str, obs: Observation) -> ActionModel:
        """A reply as this seat turns it into an action: extracted, validated, its type legal now
        and addressed to this seat. Raises :class:`ActionParseError` (the repair message)."""
        return self._validate(raw, obs)

    def fallback_action(self, obs: Observation) -> ActionModel:
        """The action played when the model gives nothing usable."""
        legal = obs.legal_actions
        if obs.phase == "bidding" and "bid" in legal:
            if self.fallback == "truthful" and obs.role == "bidder":
                return truthful_bid(obs)
            return Bid(bids=[])
        return Wait()

    def _decide(self, obs: Observation) -> Generator[Messages, Outcome, ActionModel]:
        self.stats["decisions"] += 1
        exchange: dict[str, Any] = {
            "seat": obs.seat,
            "round": obs.round,
            "phase": obs.phase,
            "model": self.model,
            "messages": [],
            "raw": None,
            "raw_replies": [],
            "action": None,
            "error": None,
            "errors": [],
            "attempts": 0,
            "fallback": False,
        }
        self.last_exchange = exchange
        if not obs.legal_actions:
            action: ActionModel = Wait()
            exchange.update(
                action=action.model_dump(exclude_none=True),
                error="no legal actions: not this seat's turn",
            )
            return action
        messages: Messages = prompt_messages(obs, self.templates)
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                messages = [
                    *messages,
                    {"role": "assistant", "content": (exchange["raw"] or "")[:MAX_ECHO_CHARS]},
                    {
                        "role": "user",
                        "content": repair_message(exchange["error"], obs, self.templates),
                    },
                ]
            exchange["messages"] = messages
            exchange["attempts"] = attempt + 1
            outcome = yield messages
            if not isinstance(outcome, Completion):
                exchange["error"] = (
                    f"backend error: {outcome}"
                    if str(outcome)
                    else f"backend error: {type(outcome).__name__}"
                )
                exchange["errors"].append(exchange["error"])
                break
            exchange["raw"] = outcome.text
            exchange["raw_replies"].append(outcome.text)
            try:
                action = self._validate(outcome.text, obs)
            except ActionParseError as exc:
                self.stats["parse_failures"] += 1
                exchange["error"] = str(exc)
                exchange["errors"].append(str(exc))
                continue
            exchange.update(action=action.model_dump(exclude_none=True), error=None)
            return action
        self.stats["fallbacks"] += 1
        action = self.fallback_action(obs)
        exchange.update(action=action.model_dump(exclude_none=True), fallback=True)
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
        return (
            legal_action_schema(obs.legal_actions, obs.role == "designer")
            if self.structured
            else None
        )

    # --- drivers ----------------------------------------------------------------------------
    def act(self, observation: Observation) -> ActionModel:
        decision = self._decide(observation)
        schema = self._schema(observation) if observation.legal_actions else None
        try:
            messages = next(decision)
            while True:
                start = time.perf_counter()
                outcome: Outcome
                with reporting() as report:
                    try:
                        with occurrence_scope(self._occurrences):
                            outcome = self.backend.complete(
                                messages, schema, self._request_params()
                            )
                    except Exception as exc:  # a backend failure never escapes a seat
                        outcome = (
                            exc
                            if isinstance(exc, BackendError)
                            else BackendError(describe_error(exc))
                        )
                self._account(outcome, time.perf_counter() - start, report)
                messages = decision.send(outcome)
        except StopIteration as stop:
            return stop.value

    async def aact(self, observation: Observation) -> ActionModel:
        decision = self._decide(observation)
        schema = self._schema(observation) if observation.legal_actions else None
        try:
            messages = next(decision)
            while True:
                with reporting() as report:
                    outcome, latency = await self._acall(messages, schema)
                self._account(outcome, latency, report)
                messages = decision.send(outcome)
        except StopIteration as stop:
            return stop.value

    async def _acall(
        self, messages: Messages, schema: dict[str, Any] | None
    ) -> tuple[Outcome, float]:
        start = time.perf_counter()
        try:
            if isinstance(self.limiter, ClientPool):  # the backend takes the pool's slots itself
                with self.limiter.active():
                    return await self._arequest(messages, schema), time.perf_counter() - start
            if self.limiter is not None:
                async with self.limiter:
                    start = time.perf_counter()  # latency excludes the wait for a slot
                    return await self._arequest(messages, schema), time.perf_counter() - start
            return await self._arequest(messages, schema), time.perf_counter() - start
        except Exception as exc:
            outcome = exc if isinstance(exc, BackendError) else BackendError(describe_error(exc))
            return outcome, time.perf_counter() - start

    async def _arequest(self, messages: Messages, schema: dict[str, Any] | None) -> Completion:
        with occurrence_scope(self._occurrences):  # wait_for's task copies this context
            call = self.backend.acomplete(messages, schema, self._request_params())
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
        spec = (
            "llm:"
            + provider
            + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
        )
        backend_cls = backend_class(provider)
        check_names(backend_cls, params)
        agent_kw: dict[str, Any] = {}
        for key, conv in AGENT_PARAM_TYPES.items():
            if key in params:
                agent_kw[key] = conv(params.pop(key))
        cache = params.pop("cache", None)
        cache_mode = str(params.pop("cache_mode", "readwrite"))
        if cache is None and cache_mode != "readwrite":
            raise TypeError("cache_mode needs cache=PATH (the SQLite file)")
        price_prompt = params.pop("price_prompt", None)
        price_completion = params.pop("price_completion", None)
        backend: Any
        if cache is not None and cache_mode == "read":
            # offline: the model is never contacted; the backend (if it can be built here) only
            # names the model, which is part of the cache key
            try:
                backend = backend_cls(**coerce_params(backend_cls, params))
                model = backend.model
            except Exception:
                backend, model = None, model_name(params)
        else:
            backend = backend_cls(**coerce_params(backend_cls, params))
            model = backend.model
        if cache is not None:
            backend = CachedBackend(backend, str(cache), mode=cache_mode, model=str(model))  # type: ignore[arg-type]
        if price_prompt is not None or price_completion is not None:
            agent_kw["prices"] = {
                str(model): (
                    price_value("price_prompt", price_prompt),
                    price_value("price_completion", price_completion),
                )
            }
        return cls(backend, spec=spec, **agent_kw)

    @classmethod
    def from_spec(cls, spec: str) -> LLMAgent:
        """``llm:PROVIDER?key=value&...`` (``llm?...`` means the openai provider)."""
        head, _, query = spec.partition("?")
        name, _, provider = head.partition(":")
        if name.strip() != "llm":
            raise ValueError(f"not an llm spec: {spec!r}")
        return cls.from_params(provider.strip() or "openai", **dict(parse_qsl(query)))

    def __repr__(self) -> str:
        return f"<LLMAgent model={self.model!r} backend={self.backend!r}>"


def make_llm_agent(provider: str = "openai", params: Mapping[str, Any] | None = None) -> LLMAgent:
    """The registry's entry point for ``llm:PROVIDER?params`` (values may be strings or already
    coerced). Raises ``TypeError``/``ValueError`` for bad parameters (including a missing API key)."""
    return LLMAgent.from_params(provider or "openai", **dict(params or {}))
