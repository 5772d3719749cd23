"""LLM seats' prompts: Jinja2 templates (built-in, per-seat overrides, personas, clear errors),
rules taught from the observation, examples from the seat's own state (no anchoring), and the
first-turn prompt fitting a 2,048-token context for every built-in scenario, role and phase."""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import require_gguf, require_modules

from agents.llm.agent import LLMAgent
from agents.llm.compact import compact_observation
from agents.llm.prompt_templates import (
    TEMPLATE_NAMES,
    TEMPLATE_VARIABLES,
    PromptTemplateError,
    builtin_source,
)
from agents.llm.prompts import (
    PROMPT_TOKEN_BUDGET,
    estimate_tokens,
    load_templates,
    prompt_budget,
    prompt_messages,
    repair_message,
    sample_observations,
)
from agents.llm.rules import AUCTION_RULES, bid_example
from agents.registry import make_agent
from market.environment import (
    UNTRUSTED_RULE,
    JobView,
    Observation,
    affordable,
    marginal_values,
)
from market.run.rollout import default_seats, run_episode
from scenarios import builtin_names, load_scenario

ROOT = Path(__file__).resolve().parents[2]
CONTEXT, REPLY = 2048, 384


class Recorder:
    """Plays a scripted agent and keeps every observation it was shown."""

    def __init__(self, inner: Any, store: list[Observation]) -> None:
        self.inner, self.store = inner, store
        self.name, self.roles, self.stats = inner.name, inner.roles, {}

    def reset(self, seed: int | None = None) -> None:
        self.inner.reset(seed)

    def act(self, obs: Observation) -> Any:
        self.store.append(obs)
        return self.inner.act(obs)

    async def aact(self, obs: Observation) -> Any:
        return self.act(obs)


@cache
def observations(name: str) -> tuple[Observation, ...]:
    """Every observation a seat was asked to act on in one seed-0 episode with the scenario's own
    seats."""
    store: list[Observation] = []
    seats = {
        s: Recorder(make_agent(spec), store)
        for s, spec in default_seats(load_scenario(name)).items()
    }
    run_episode(name, 0, seats)
    return tuple(o for o in store if o.legal_actions)


def _bidder(phase: str = "bidding") -> Observation:
    return next(o for o in sample_observations() if o.role == "bidder" and o.phase == phase)


def _designer() -> Observation:
    return next(o for o in sample_observations() if o.role == "designer")


# ---------------------------------------------------------------------------------------------
# templates


def test_builtin_templates_ship_with_the_package() -> None:
    """The wheel carries the templates: they are package data and readable via importlib."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "templates/*.j2" in data["tool"]["setuptools"]["package-data"]["agents.llm"]
    assert any(d.startswith("jinja2") for d in data["project"]["dependencies"])
    for name in TEMPLATE_NAMES:
        assert builtin_source(name) == (ROOT / "agents/llm/templates" / name).read_text()


@pytest.mark.parametrize("name", [n for n in builtin_names() if n != "large_market"])
def test_templates_render_for_every_scenario_role_and_phase(name: str) -> None:
    seen = set()
    for obs in observations(name):
        system, user = prompt_messages(obs)
        seen.add((obs.role, obs.phase))
        assert system["role"] == "system" and user["role"] == "user"
        assert system["content"].startswith(f"You play seat {obs.seat} ({obs.role})")
        assert UNTRUSTED_RULE in system["content"]
        assert "{{" not in system["content"] + user["content"]
        assert user["content"].startswith(compact_observation(obs, None)[0].to_prompt()[:80])
        for kind in obs.legal_actions:
            assert f"\n{kind}: {{" in user["content"]
        repair = repair_message("bad reply", obs)
        assert repair.startswith("That reply could not be used: bad reply")
        assert ", ".join(obs.legal_actions) in repair
    assert ("bidder", "bidding") in seen
    if load_scenario(name).negotiation_turns > 0:  # the daedalus family has sealed bids only
        assert ("bidder", "negotiation") in seen


def test_small_observation_is_shown_whole() -> None:
    obs = _bidder()
    obs = obs.model_copy(update={"jobs": (obs.jobs or [])[:1], "holdings": [1]})
    user = prompt_messages(obs)[1]["content"]
    assert user.startswith(obs.to_prompt())
    assert "Not shown to fit" not in user


def test_persona_and_prompt_overrides(tmp_path: Path) -> None:
    persona_file = tmp_path / "persona.txt"
    persona_file.write_text("You are Ada, a frugal lab.\n")
    folder = tmp_path / "tpl"
    folder.mkdir()
    (folder / "system.j2").write_text(
        "{% include 'builtin/system.j2' %}\nExtra: {{ seat }} has budget {{ obs.budget }}.\n"
    )
    (folder / "user.j2").write_text(
        "OBS\n{{ observation }}\nACTIONS {{ legal_actions | join('/') }}"
    )
    obs = _bidder()
    templates = load_templates(str(folder), str(persona_file))
    system, user = prompt_messages(obs, templates)
    assert "Persona: You are Ada, a frugal lab." in system["content"]
    assert f"Extra: {obs.seat} has budget {obs.budget}." in system["content"]
    assert UNTRUSTED_RULE in system["content"]  # the built-in system prompt is included
    assert user["content"] == f"OBS\n{obs.to_prompt()}\nACTIONS {'/'.join(obs.legal_actions)}"
    # repair.j2 is not in the folder: the built-in one
    assert repair_message("x", obs, templates) == repair_message("x", obs)

    single = tmp_path / "one.j2"
    single.write_text("I am {{ seat }}. {{ persona }}")
    templates = load_templates(str(single), "Be brief.")
    system, user = prompt_messages(obs, templates)
    assert system["content"] == f"I am {obs.seat}. Be brief."
    # the built-in user template; the short system prompt leaves room for the whole observation
    assert user == prompt_messages(obs, max_tokens=None)[1]

    # through the spec string, as a seat gets them
    spec = (
        f"llm:openai?model=m&base_url=http://127.0.0.1:9/v1&prompt={single}&persona=Cautious%20lab"
    )
    agent = make_agent(spec)
    assert isinstance(agent, LLMAgent)
    assert agent.templates.persona == "Cautious lab"
    assert prompt_messages(obs, agent.templates)[0]["content"] == f"I am {obs.seat}. Cautious lab"
    default = make_agent("llm:openai?model=m&base_url=http://127.0.0.1:9/v1")
    assert prompt_messages(obs, default.templates) == prompt_messages(obs)


def _error(tmp_path: Path, text: str, persona: str | None = None) -> str:
    path = tmp_path / "bad.j2"
    path.write_text(text)
    with pytest.raises(PromptTemplateError) as info:
        load_templates(str(path), persona)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_bad_templates_give_one_line_errors_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.j2"
    msg = _error(tmp_path, "line one\n{% if seat %}\nno endif\n")
    assert f"{path}:" in msg and "syntax error" in msg
    msg = _error(tmp_path, "ok\nok\n{{ budget }}\n")
    assert f"{path}:3: undefined variable 'budget'" in msg and "persona" in msg
    msg = _error(tmp_path, "ok\n{{ obs.no_such_field }}\n")
    assert f"{path}:2:" in msg and "no_such_field" in msg
    msg = _error(tmp_path, "{% include 'nowhere.j2' %}")
    assert f"{path}:1: it includes 'nowhere.j2', which is neither" in msg
    with pytest.raises(PromptTemplateError, match="no such file or folder"):
        load_templates(str(tmp_path / "missing"))
    with pytest.raises(PromptTemplateError, match="looks like a file name"):
        load_templates(None, str(tmp_path / "missing_persona.txt"))
    # the same errors stop a seat from being built, as one line
    with pytest.raises(ValueError, match=r"prompt template .*bad.j2:1: undefined variable 'x'"):
        path.write_text("{{ x }}")
        make_agent(f"llm:openai?model=m&base_url=http://127.0.0.1:9/v1&prompt={path}")


def test_sandbox_blocks_unsafe_attributes(tmp_path: Path) -> None:
    msg = _error(tmp_path, "{{ obs.__class__.__mro__ }}")
    assert "bad.j2:1" in msg and "unsafe" in msg.lower()


def test_template_variables_are_documented() -> None:
    doc = (ROOT / "docs/llm-seats.md").read_text()
    for name in TEMPLATE_VARIABLES:
        assert f"`{name}`" in doc, name


# ---------------------------------------------------------------------------------------------
# rules taught from the observation


def _with_mechanism(obs: Observation, **fields: Any) -> Observation:
    return obs.model_copy(update={"mechanism": obs.mechanism.model_copy(update=fields)})


@pytest.mark.parametrize("auction", sorted(AUCTION_RULES))
def test_rules_explain_only_the_auction_in_force(auction: str) -> None:
    obs = _with_mechanism(_bidder(), auction_type=auction)
    system = prompt_messages(obs)[0]["content"]
    assert "Auction in force: " + AUCTION_RULES[auction] in system
    for other, sentence in AUCTION_RULES.items():
        if other != auction:
            assert sentence not in system


def test_reserve_rule_follows_the_mechanism() -> None:
    obs = _bidder()
    shown = _with_mechanism(obs, reserve_price=7.5)
    assert (
        "Reserve: bids below 7.5 credits a block are ignored."
        in prompt_messages(shown)[0]["content"]
    )
    hidden = _with_mechanism(obs, reserve_price=None, reveal_reserve=False)
    assert "The reserve is hidden" in prompt_messages(hidden)[0]["content"]
    floor = shown.model_copy(update={"energy_floor": 12.0})
    text = prompt_messages(floor)[0]["content"]
    assert (
        "bids below 12 credits a block are ignored (the operator floor 12 is above the reserve 7.5)"
        in text
    )


def test_rules_state_values_jobs_and_penalties_from_the_observation() -> None:
    obs = _bidder()
    obs = _with_mechanism(obs, withdrawal_penalty=13.0, shill_penalty=4.0)
    system = prompt_messages(obs)[0]["content"]
    first = marginal_values(obs)[0]
    assert f"What each extra block is worth to you this round: {round(first, 2):g}" in system
    for job in obs.jobs or []:
        if job.status == "active":
            assert (
                f"- {job.job_id}: {job.size - job.progress}/{job.size} blocks left, due round {job.deadline}"
                in system
            )
    assert "pays 13 a block short" in system and "before its term: 13 and 0.1 reputation" in system
    assert "4 per shill block" in system
    assert f"your budget ({round(obs.budget or 0, 2):g})" in system


def test_designer_is_taught_the_fields_and_that_wait_keeps_the_mechanism() -> None:
    obs = _designer()
    system = prompt_messages(obs)[0]["content"]
    for field in obs.mechanism.model_dump():
        assert f"- {field} (now " in system
    assert "wait keeps it" in system
    changed = _with_mechanism(obs, auction_type="vcg", reserve_price=9.0)
    text = prompt_messages(changed)[0]["content"]
    assert "- reserve_price (now 9.0)" in text and "Auction in force: vcg" in text
    assert "empty" not in text.lower()


# ---------------------------------------------------------------------------------------------
# no anchoring


def _job(value: float) -> JobView:
    return JobView(
        job_id="job0", size=2, progress=0, deadline=9, value=value, partial_credit=True,
        min_reliability=0.0, status="active",
    )  # fmt: skip


def test_bid_examples_come_from_each_seats_own_values() -> None:
    base = _bidder().model_copy(update={"holdings": [0], "budget": 1000.0})
    low = base.model_copy(update={"jobs": [_job(20.0)]})
    high = base.model_copy(update={"jobs": [_job(90.0)]})
    ex_low, ex_high = bid_example(low), bid_example(high)
    assert ex_low != ex_high
    for obs, example in ((low, ex_low), (high, ex_high)):
        bids = [round(v, 2) for v in affordable(marginal_values(obs), 1000.0, 6)]
        assert (
            example
            == '{"action_type":"bid","bids":['
            + ",".join(f"{b:g}" if b != int(b) else f"{b:.1f}" for b in bids)
            + "]}"
        )
        assert example in prompt_messages(obs)[1]["content"]
    assert bid_example(_bidder("negotiation")) == ""


def test_no_fixed_example_numbers_in_any_prompt() -> None:
    texts = [builtin_source(n) for n in TEMPLATE_NAMES]
    for name in ("market_round", "coalition_market", "single_trade"):
        for obs in observations(name):
            texts += [m["content"] for m in prompt_messages(obs)]
    for text in texts:
        assert "[30, 25]" not in text and "[30,25]" not in text
        assert '"bids": [30' not in text


# ---------------------------------------------------------------------------------------------
# small contexts


def _smollm_tokens() -> Any:
    require_modules(("llama_cpp",), "pip install llama-cpp-python")
    import llama_cpp  # noqa: PLC0415  (optional heavy dependency)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: PLC0415

    llm = llama_cpp.Llama(str(require_gguf()), vocab_only=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    eos = llm.detokenize([llm.token_eos()]).decode()
    bos = llm.detokenize([llm.token_bos()]).decode()
    formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

    def count(messages: list[dict[str, str]]) -> int:
        text = formatter(messages=messages).prompt
        return len(llm.tokenize(text.encode(), add_bos=False, special=True))

    return count


@pytest.mark.slow
def test_first_turn_prompt_fits_2048_with_a_512_token_reply_in_every_scenario() -> None:
    count = _smollm_tokens()
    worst: dict[str, tuple[int, str]] = {}
    for name in builtin_names():
        for obs in observations(name):
            messages = prompt_messages(obs)
            tokens = count(messages)
            key = f"{obs.role}/{obs.phase}"
            if tokens > worst.get(name + ":" + key, (0, ""))[0]:
                worst[name + ":" + key] = (tokens, obs.seat)
            assert tokens + REPLY <= CONTEXT, (name, key, obs.seat, obs.round, tokens)
            # the estimate the budget uses is not far below the real count
            assert tokens <= 1.1 * sum(estimate_tokens(m["content"]) for m in messages)
    assert any(k.startswith("large_market:bidder/negotiation") for k in worst)
    print({k: v[0] for k, v in sorted(worst.items())})


@pytest.mark.slow
def test_large_market_lists_are_cut_with_a_more_marker() -> None:
    obs = max(
        (o for o in observations("large_market") if o.role == "bidder"),
        key=lambda o: len(o.to_prompt()),
    )
    user = prompt_messages(obs)[1]["content"]
    assert len(obs.active_labs) > 100
    match = re.search(r"\.\.\. (\d+) more active labs", user)
    assert match is not None
    shown = user.split("Active labs: ")[1].split(".")[0].split(", ")
    assert len(shown) + int(match.group(1)) == len(obs.active_labs)
    assert shown[0] == obs.seat
    uncut = prompt_messages(obs, max_tokens=None)[1]["content"]
    assert "Not shown to fit" not in uncut and len(uncut) > 3 * len(user)


def test_a_system_template_that_shows_the_observation_gets_it_cut_too(tmp_path: Path) -> None:
    single = tmp_path / "obs_in_system.j2"
    single.write_text("{{ observation }}\nCUT: {{ omitted }}")
    templates = load_templates(str(single))
    assert "observation" in templates.variables["system.j2"]
    obs = _bidder()
    system, user = prompt_messages(obs, templates, max_tokens=900)
    assert "more" in system["content"].split("CUT: ")[1]
    shown = system["content"].split("\nCUT: ")[0]
    assert user["content"].startswith(shown) and shown != obs.to_prompt()
    whole = prompt_messages(obs, templates, max_tokens=None)[0]["content"]
    assert whole == obs.to_prompt() + "\nCUT:"


# ---------------------------------------------------------------------------------------------
# what compaction keeps, and the budget a seat's context leaves


def _addressed(obs: Observation) -> list[str]:
    return [m.text for m in obs.messages[-10:] if m.to == obs.seat or obs.seat in list(m.to)]


@pytest.mark.parametrize("name", ["coalition_market", "shock_storm", "market_round_hard"])
def test_compaction_never_cuts_counterparties_live_jobs_or_messages_to_the_seat(
    name: str,
) -> None:
    for obs in observations(name):
        system, user = (m["content"] for m in prompt_messages(obs))
        text = system + "\n" + user
        parties = {o.sender for o in obs.offers_received or ()}
        parties |= {c.buyer for c in obs.contracts or ()} | {c.seller for c in obs.contracts or ()}
        for co in obs.coalitions or ():
            parties |= {co.leader, *co.members}
        for seat in parties & set(obs.active_labs):
            assert seat in user.split("Active labs: ")[1].split("\n")[0], (obs.seat, seat)
        for job in obs.jobs or ():
            if job.status == "active":
                assert f'"{job.job_id}"' in user or f"- {job.job_id}: " in system, job.job_id
        for said in _addressed(obs):
            assert said.splitlines()[0] in text
        # a few other labs are always named
        others = [s for s in obs.active_labs if s != obs.seat]
        shown = user.split("Active labs: ")[1].split(".")[0].split(", ")
        assert len(set(shown) - {obs.seat}) >= min(len(others), 7)


def test_the_fixed_text_is_shortened_before_the_lists_are_cut_far() -> None:
    obs = max(
        (o for o in observations("coalition_market") if o.phase == "negotiation"),
        key=lambda o: len(o.to_prompt()),
    )
    whole = prompt_messages(obs, max_tokens=None)[1]["content"]
    short = prompt_messages(obs, max_tokens=900)[1]["content"]
    assert "Legal action types now:" in whole and "Legal action types now:" not in short
    assert '"auction_type"' in whole.split("Mechanism in force")[1].split("\n")[0]
    assert "Mechanism in force, besides the rules:" in short
    assert "optional fields of the action formats" in short
    for kind in obs.legal_actions:  # every legal type keeps its format line
        assert f"\n{kind}: {{" in short


def test_the_budget_comes_from_the_seats_context_and_reply() -> None:
    assert prompt_budget(2048, 384) == PROMPT_TOKEN_BUDGET
    assert prompt_budget(None, 384) is None
    assert prompt_budget(8192, 512) > prompt_budget(4096, 512) > prompt_budget(4096, 2048)
    obs = max(observations("coalition_market"), key=lambda o: len(o.to_prompt()))
    sizes = [
        sum(estimate_tokens(m["content"]) for m in prompt_messages(obs, max_tokens=b))
        for b in (prompt_budget(2048, 384), prompt_budget(4096, 512), prompt_budget(32768, 512))
    ]
    assert sizes[0] <= sizes[1] <= sizes[2]
    assert sizes[2] == sum(
        estimate_tokens(m["content"]) for m in prompt_messages(obs, max_tokens=None)
    )

    class Fake:
        model = "fake"
        calls: list[Any] = []

        def complete(self, messages: Any, schema: Any, params: Any) -> Any:
            from agents.llm.backends.base import Completion  # noqa: PLC0415

            self.calls.append(messages)
            return Completion(text='{"action_type": "wait"}', model="fake")

    for context, reply in ((2048, 384), (4096, 256)):
        fake = Fake()
        fake.calls = []
        agent = LLMAgent(fake, memory="none", context=context, max_tokens=reply)  # type: ignore[arg-type]
        agent.act(obs)
        assert fake.calls[0] == prompt_messages(obs, max_tokens=prompt_budget(context, reply))
