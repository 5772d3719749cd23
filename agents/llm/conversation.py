"""The conversation of one LLM decision (``LLMAgent._decide``), kept out of the agent: the
exchange record a decision fills (``LLMAgent.last_exchange``; each completion's
``finish_reason``, ``"length"`` when cut off by the token limit, and the backend's degraded
features) and the messages of each attempt: the prompt, through the seat's memory when it keeps
one, then a repair turn after every unusable reply (:mod:`agents.llm.reply_reader` reads them).

The messages are the response cache's key, so a replay hits only while they stay the same."""

from __future__ import annotations

from typing import Any

from agents.llm.memory import Memory
from agents.llm.prompt_templates import PromptTemplates
from agents.llm.prompts import Messages, prompt_budget, prompt_messages, repair_message
from agents.llm.reasoning import FIELD_RULE
from agents.llm.reply_reader import Reading
from agents.llm.reply_reader import note_completion as note_completion  # its old home
from agents.llm.tools import TOOLS_RULE, assistant_tool_message, tool_result_message
from market.environment import Observation

MAX_ECHO_CHARS = 4_000  # a failed reply is echoed back this long in the repair message
#: a repair after a reply that repeated an earlier one samples at least this hot, with a new seed
REPEAT_TEMPERATURE = 0.7
REPEAT_NUDGE = " Your reply repeated an earlier reply word for word; write another."


def new_exchange(obs: Observation, model: str, degraded: tuple[str, ...] = ()) -> dict[str, Any]:
    """The empty record of one decision (``LLMAgent.last_exchange``)."""
    return {
        "seat": obs.seat,
        "round": obs.round,
        "phase": obs.phase,
        "model": model,
        "messages": [],
        "raw": None,
        "raw_replies": [],
        "action": None,
        "error": None,
        "errors": [],
        "attempts": 0,
        "fallback": False,
        "reasoning": None,
        "degraded": list(degraded),
    }


def note_backend_error(exchange: dict[str, Any], error: BaseException) -> None:
    """Record an attempt that got no completion (the backend's error or timeout)."""
    exchange["error"] = (
        f"backend error: {error}" if str(error) else f"backend error: {type(error).__name__}"
    )
    exchange["errors"].append(exchange["error"])


class Conversation:
    """The messages of one decision's attempts: the base prompt (``prompt_messages`` within the
    prompt budget, plus the reasoning-field and tools rules), or the seat's memory built on it,
    followed by the repair turns so far.

    Args:
        obs: the decision's observation.
        templates: the seat's prompt templates.
        memory: the seat's memory; one that keeps nothing (``memory=none``) is not used.
        tools: the function tools offered (``mode=tools``), else None.
        reply_tokens: the reply's ``max_tokens`` (the prompt gets the rest of the context).
        field_rule: the reply starts with a ``reasoning`` field (``reasoning=field``).
    """

    def __init__(
        self,
        obs: Observation,
        templates: PromptTemplates,
        memory: Memory,
        tools: list[dict[str, Any]] | None,
        *,
        reply_tokens: int | None,
        field_rule: bool,
    ) -> None:
        self.obs, self.templates = obs, templates
        base = prompt_messages(
            obs, templates, max_tokens=prompt_budget(memory.context, reply_tokens)
        )
        rules = [FIELD_RULE] if field_rule else []
        rules += [TOOLS_RULE] if tools else []
        if rules:
            base[0] = {"role": "system", "content": "\n".join([base[0]["content"], *rules])}
        self.base: Messages = base
        self.repairs: Messages = []
        self.memory = memory if memory.enabled else None
        #: the degraded note of a token counter that fell back to counting characters
        self.degraded: str | None = None
        if self.memory is not None:
            system, user = base[0]["content"], base[1]["content"]
            self.memory.begin(obs, system, user, tools, reply_tokens)
            self.memory.messages()  # resolves the token counter
            counter = self.memory.counter
            failure = counter.failure
            if failure and (counter.kind != "auto" or failure.startswith("count")):
                self.degraded = f"token counter: {failure}; counted as characters"

    def messages(self) -> tuple[Messages, dict[str, Any] | None]:
        """This attempt's request messages, and the memory's record of how it built them
        (turns kept and dropped, tokens, ``over_budget``; None without memory)."""
        if self.memory is not None:
            return self.memory.messages(self.repairs)
        return [*self.base, *self.repairs], None

    def repair(self, failed: Reading, params: dict[str, Any], attempt: int) -> dict[str, Any]:
        """Ask again after the unusable reply ``failed``: add its echo (or its tool call) and the
        repair message. A reply that repeated an earlier one is told so, and the next requests
        sample at least :data:`REPEAT_TEMPERATURE` hot with a new seed (a deterministic model
        would repeat itself again). Returns the sampling parameters from this attempt on."""
        error = failed.error or ""
        if failed.repeated:
            error += REPEAT_NUDGE
            hot = max(float(params.get("temperature") or 0.0), REPEAT_TEMPERATURE)
            params = {**params, "temperature": hot}
            if "seed" in params:
                params["seed"] = (int(params["seed"]) + attempt) % (2**31)
        fix = repair_message(error, self.obs, self.templates)
        if failed.call is not None:
            call = failed.call
            self.repairs += [assistant_tool_message(call), tool_result_message(call.id, fix)]
        else:
            echo = (failed.raw or "")[:MAX_ECHO_CHARS]
            self.repairs += [
                {"role": "assistant", "content": echo},
                {"role": "user", "content": fix},
            ]
        return params

    def remember(self, last: Reading | None, action: dict[str, Any] | None, fallback: bool) -> None:
        """Keep the decision in the seat's memory (when it keeps one): the last reply (None: the
        model never answered) and the action played."""
        if self.memory is not None:
            call_id = last.call.id if last is not None and last.call else None
            reply = last.reply if last is not None else None
            self.memory.remember(reply, action, fallback, call_id)
