"""The parts of an LLM seat's decision as units: the reply reader (a completion read into an
action or an error, recorded in the exchange) and the conversation (each attempt's messages and
the repair turns), without an agent or a backend."""

from __future__ import annotations

from typing import Any

import pytest

import market
from agents.llm.backends.base import Completion, ToolCall
from agents.llm.conversation import REPEAT_TEMPERATURE, Conversation, new_exchange
from agents.llm.memory import Memory
from agents.llm.prompts import load_templates, prompt_budget, prompt_messages
from agents.llm.reasoning import FIELD_RULE
from agents.llm.reply_reader import Reading, read_reply
from market.core.actions import SendMessage, Wait
from market.environment.observations import Observation


def negotiation_obs() -> Observation:
    """bidder_0's first negotiation turn in market_round (seed 3)."""
    env = market.raw_env("market_round")
    env.reset(seed=3)
    for _seat in env.agent_iter():
        obs, *_ = env.last()
        if obs.phase == "negotiation" and obs.role == "bidder":
            return obs
        env.step({"action_type": "wait"})
    raise AssertionError("no negotiation turn")


OBS = negotiation_obs()


def read(text: str, exchange: dict[str, Any], *, tools: bool = False, **completion: Any) -> Reading:
    outcome = Completion(text=text, model="m", **completion)
    return read_reply(outcome, OBS, exchange, tools=tools, decision=4, count=len)


def test_a_usable_reply_becomes_the_action_and_the_exchange_records_it() -> None:
    exchange = new_exchange(OBS, "m")
    reading = read('<think>hm</think>{"action_type": "wait"}', exchange)
    assert reading.action == Wait() and reading.error is None and not reading.repeated
    assert reading.reply == {"role": "assistant", "content": '{"action_type": "wait"}'}
    assert reading.reasoning_tokens == len("hm")  # counted: the server reported none
    assert exchange["action"] == {"action_type": "wait"} and exchange["reasoning"] == "hm"
    assert exchange["raw_replies"] == ['<think>hm</think>{"action_type": "wait"}']


def test_a_reply_that_repeats_an_earlier_one_is_flagged() -> None:
    exchange = new_exchange(OBS, "m")
    first, second = read("no idea", exchange), read("no idea", exchange)
    assert not first.repeated and second.repeated
    assert exchange["raw_replies"] == ["no idea", "no idea"] and len(exchange["errors"]) == 2
    assert not read("still no idea", exchange).repeated


def test_a_semantic_refusal_is_told_apart_from_a_parse_failure() -> None:
    exchange = new_exchange(OBS, "m")
    parse = read("I think I will wait.", exchange)
    assert parse.action is None and parse.error and not parse.semantic
    assert parse.error.startswith("no JSON object found")
    to_nobody = '{"action_type": "send_message", "to": "nobody_9", "text": "x"}'
    semantic = read(to_nobody, exchange)
    assert semantic.action is None and semantic.semantic
    assert semantic.error and semantic.error.startswith("the market would refuse this send_message")
    assert exchange["errors"] == [parse.error, semantic.error]
    assert exchange["error"] == semantic.error and exchange["action"] is None


def test_a_tool_call_is_read_only_when_tools_were_offered() -> None:
    call = ToolCall("", "send_message", '{"to": "all", "text": "hi"}')
    exchange = new_exchange(OBS, "m")
    reading = read("", exchange, tools=True, tool_calls=[call])
    assert reading.action == SendMessage(to="all", text="hi")
    named = ToolCall(f"call_{OBS.round}_4", call.name, call.arguments)  # a deterministic id
    assert reading.call == named and reading.reply["tool_calls"][0]["id"] == named.id
    assert exchange["tool_calls"] == [
        {"id": named.id, "name": call.name, "arguments": call.arguments}
    ]
    # in JSON mode the same completion's tool call is ignored: the (empty) text is the reply
    plain = new_exchange(OBS, "m")
    text = read("", plain, tools=False, tool_calls=[call])
    assert text.call is None and text.action is None and not text.semantic
    assert "tool_calls" not in plain


def test_the_repair_turns_echo_the_reply_and_a_repeat_samples_hotter() -> None:
    templates = load_templates()
    talk = Conversation(OBS, templates, Memory("none"), None, reply_tokens=512, field_rule=False)
    messages, info = talk.messages()
    budget = prompt_budget(Memory("none").context, 512)
    assert info is None and messages == prompt_messages(OBS, templates, max_tokens=budget)
    exchange = new_exchange(OBS, "m")
    read("nonsense", exchange)
    failed = read("nonsense", exchange)
    params = talk.repair(failed, {"temperature": 0.0, "seed": 5}, attempt=2)
    assert params == {"temperature": REPEAT_TEMPERATURE, "seed": 7}
    messages, _ = talk.messages()
    assert messages[-2] == {"role": "assistant", "content": "nonsense"}
    assert "repeated an earlier reply word for word" in messages[-1]["content"]
    # a failed tool call is answered by a tool message naming its id
    call = ToolCall("c1", "wait", "{oops")
    failed = read("", exchange, tools=True, tool_calls=[call])
    assert failed.error and failed.call == call
    assert talk.repair(failed, params, attempt=3) == params  # not a repeat: unchanged
    messages, _ = talk.messages()
    assert messages[-2]["tool_calls"][0]["id"] == "c1"
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == "c1"


@pytest.mark.parametrize("memory", ["window:2", "none"])
def test_the_conversation_remembers_only_with_memory(memory: str) -> None:
    seat = Memory(memory)
    talk = Conversation(OBS, load_templates(), seat, None, reply_tokens=512, field_rule=True)
    assert talk.base[0]["content"].endswith(FIELD_RULE)
    _, info = talk.messages()
    assert (info is not None) is seat.enabled
    reading = read('{"action_type": "wait"}', new_exchange(OBS, "m"))
    talk.remember(reading, {"action_type": "wait"}, fallback=False)
    assert len(seat.turns) == (1 if seat.enabled else 0)
