"""The batched, grammar-constrained transformers backend with the real SmolLM2-135M model (CPU).

What must hold: a constrained reply is valid JSON of a legal action unless the token limit cut it
off; concurrent calls share batches; greedy and seeded calls repeat for the same batch
composition; one row's cancellation, deadline or stop string does not disturb the others; a
prompt longer than the context is a clear error.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules

from agents.llm.backends.base import BackendError
from agents.llm.backends.hf_backend import engine_of
from agents.llm.backends.hf_engine import EngineCancelled, GenerationRequest, bounded
from agents.llm.prompts import legal_action_schema
from market.bench.llm import bench_observations
from market.core.actions import ACTION_CLASSES

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def gguf() -> Path:
    return require_gguf()


@pytest.fixture(scope="module")
def backend(gguf: Path) -> Any:
    require_modules(HF_MODULES, HF_INSTALL)
    from agents.llm.backends.hf_backend import HFBackend

    # a wide window: calls made together below always land in one batch
    return HFBackend(path=gguf, max_new_tokens=48, max_batch=16, batch_window_ms=200).load()


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _parse_action(text: str, legal: list[str]) -> Any:
    """The reply as an action of one of the ``legal`` types (raises if it is not one)."""
    data = json.loads(text)
    assert data["action_type"] in legal
    return TypeAdapter(ACTION_CLASSES[data["action_type"]]).validate_python(data)


def test_constrained_replies_are_legal_actions_unless_cut_off(backend: Any) -> None:
    """Over the bench's market observations (every phase, designer and labs), each reply is a
    valid action of that phase's legal types, or a reply the token limit cut off."""
    observations = bench_observations(24)

    async def ask_all() -> list[Any]:
        calls = [
            backend.acomplete(
                _ask(obs.to_prompt() + "\nAnswer with one action as JSON."),
                legal_action_schema(obs.legal_actions, obs.seat.startswith("designer")),
                {"max_tokens": 96},
            )
            for obs in observations
        ]
        return await asyncio.gather(*calls)

    replies = asyncio.run(ask_all())
    parsed = cut = 0
    for obs, reply in zip(observations, replies, strict=True):
        if reply.extra["finish_reason"] == "length":
            cut += 1
            with pytest.raises(json.JSONDecodeError):  # cut off: incomplete, never wrong
                json.loads(reply.text)
            continue
        assert reply.extra["stopped_by"] == "json"
        if obs.seat.startswith("designer") and "action_type" not in json.loads(reply.text):
            continue  # the designer's flat mechanism form
        try:
            _parse_action(reply.text, list(obs.legal_actions))
        except (ValidationError, AssertionError) as exc:
            raise AssertionError(f"{obs.seat} {obs.phase}: {reply.text!r}: {exc}") from None
        parsed += 1
    # every reply the limit did not cut is a legal action (checked above); a 135M model fills
    # strings up to their bound often enough that some are cut, but not all
    assert parsed >= 4 and cut < len(observations), (parsed, cut)
    assert max(r.extra["batch"] for r in replies) >= 8  # they were decoded together


def test_the_same_batch_gives_the_same_tokens_and_seeds_repeat(backend: Any) -> None:
    schema = legal_action_schema(["bid", "wait", "finish"])
    prompts = [f"Lab {i}: you need {i + 2} GPU blocks. Reply with an action." for i in range(4)]

    async def batch(params: dict[str, Any], schema: dict[str, Any] | None) -> list[str]:
        replies = await asyncio.gather(
            *(backend.acomplete(_ask(p), schema, params) for p in prompts)
        )
        assert {r.extra["batch"] for r in replies} == {4}
        return [r.text for r in replies]

    greedy = {"max_tokens": 40}
    assert asyncio.run(batch(greedy, schema)) == asyncio.run(batch(greedy, schema))
    seeded = {"max_tokens": 40, "temperature": 1.0, "seed": 11}
    constrained = asyncio.run(batch(seeded, schema))
    assert constrained == asyncio.run(batch(seeded, schema))
    for text in constrained:  # sampled rows are constrained too
        if text.endswith("}"):
            _parse_action(text, ["bid", "wait", "finish"])
    free = asyncio.run(batch({**seeded, "max_tokens": 16}, None))
    assert free == asyncio.run(batch({**seeded, "max_tokens": 16}, None))
    other = asyncio.run(batch({**seeded, "max_tokens": 16, "seed": 12}, None))
    assert other != free  # the seed really drives the draws


def test_one_rows_stop_string_cancel_and_deadline_leave_the_others_alone(backend: Any) -> None:
    loaded = backend._get_loaded()
    engine = engine_of(loaded, backend.max_batch, backend.batch_window_ms / 1000)
    ids = loaded.tokenizer("Write a long story about GPUs.", add_special_tokens=False)
    prompt = list(ids["input_ids"])
    eos = sorted(loaded.eos_ids)
    # a JSON string of at least 1,000 characters: no end token can come before the row's limit
    endless = {"type": "string", "minLength": 1000, "maxLength": 1200}
    keep_going = GenerationRequest(prompt_ids=prompt, max_new=40, schema=endless)
    cancelled = GenerationRequest(prompt_ids=prompt, max_new=400, schema=endless)
    late = GenerationRequest(prompt_ids=prompt, max_new=400, timeout=0.05, schema=endless)
    # "ababab...": the stop string "ba" must come at the third character
    abab = {"type": "string", "pattern": "(ab){50}"}
    stopped = GenerationRequest(prompt_ids=prompt, max_new=400, stop=["ba"], schema=abab)
    futures = [engine.submit(r) for r in (keep_going, cancelled, late, stopped)]
    time.sleep(0.5)
    cancelled.cancel.set()
    done = futures[0].result(timeout=600)
    assert done.batch == 4 and len(done.token_ids) == 40 and done.finish == "length"
    assert not set(done.token_ids) & set(eos) and done.text.startswith('"')
    with pytest.raises(EngineCancelled):
        futures[1].result(timeout=600)
    with pytest.raises(TimeoutError, match="timed out after 0.05s"):
        futures[2].result(timeout=600)
    cut = futures[3].result(timeout=600)
    assert cut.stopped_by == "stop_sequence" and cut.text == '"a' and cut.batch == 4


def test_length_cut_off_and_errors_are_reported(backend: Any) -> None:
    schema = legal_action_schema(["bid", "wait"])
    short = backend.complete(_ask("Reply with an action."), schema, {"max_tokens": 3})
    assert short.extra["finish_reason"] == "length" and short.completion_tokens == 3
    assert short.text.startswith("{")
    with pytest.raises(BackendError, match="timed out after"):
        backend.complete(_ask("Tell me a story."), None, {"max_tokens": 400, "timeout": 0.01})
    context = backend._get_loaded().max_positions
    with pytest.raises(BackendError, match=f"the model's context is {context}"):
        backend.complete(_ask("GPU " * (context + 10)), None, {"max_tokens": 4})
    free = backend.complete(_ask("Say hello."), None, {"max_tokens": 6})
    assert 0 < free.completion_tokens <= 6 and free.prompt_tokens > 0


def test_cancelling_an_awaiting_task_stops_its_row(backend: Any) -> None:
    async def main() -> tuple[Any, bool]:
        task = asyncio.create_task(
            backend.acomplete(_ask("Write a long story."), None, {"max_tokens": 400})
        )
        other = asyncio.create_task(backend.acomplete(_ask("Say hello."), None, {"max_tokens": 8}))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await other, task.cancelled()

    other, cancelled = asyncio.run(main())
    assert cancelled and 0 < other.completion_tokens <= 8


def test_masks_written_on_threads_are_the_row_by_row_masks(backend: Any) -> None:
    """The batch matcher's threads write, for every row, exactly the bits that row's own matcher
    writes alone, at every step of replies to the bench's observations (rows at different
    points of different grammars; the rows advance by their lowest allowed token)."""
    torch = pytest.importorskip("torch")
    from agents.llm.backends.hf_engine import BatchEngine, _Picker

    engine = backend.loaded.state.get("engine") or _engine_of(backend)
    threaded = BatchEngine(
        backend.loaded.model,
        backend.loaded.tokenizer,
        backend.loaded.device,
        backend.loaded.eos_ids,
        backend.loaded.vocab_size,
        threads=3,
    )
    assert threaded.mask_threads == 3
    observations = bench_observations(12)
    grammars = [
        engine.grammar(legal_action_schema(o.legal_actions, o.seat.startswith("designer")))
        for o in observations
    ]
    matchers = [engine.xgr.GrammarMatcher(g, terminate_without_stop_token=True) for g in grammars]
    picker = _Picker(threaded, len(matchers))
    alone = engine.xgr.allocate_token_bitmask(len(matchers), engine.vocab_size)
    together = engine.xgr.allocate_token_bitmask(len(matchers), engine.vocab_size)
    for step in range(24):
        live = [(k, m) for k, m in enumerate(matchers) if not m.is_terminated()]
        assert len(live) >= 2, step
        for k, m in live:
            m.fill_next_token_bitmask(alone, k)
        together.fill_(0)
        picker._write(together, live)
        rows = [k for k, _ in live]
        assert torch.equal(together[rows], alone[rows]), step
        assert 3 in threaded._batch_matchers  # written on three threads, not row by row
        for k, m in live:
            allowed = torch.nonzero(_unpack(alone[k])[: engine.vocab_size]).flatten()
            assert m.accept_token(int(allowed[0]))


def _unpack(row: Any) -> Any:
    """A bitmask row (int32 words, bit i of word w: token 32·w + i) as one bool per token."""
    import torch

    words = row.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, dtype=torch.int64)
    return ((words.unsqueeze(-1) >> shifts) & 1).flatten().bool()


def _engine_of(backend: Any) -> Any:
    asyncio.run(backend.acomplete(_ask("Say hi."), None, {"max_tokens": 1}))
    return backend.loaded.state["engine"]


def test_mask_threads_are_checked_and_default_to_the_cores() -> None:
    from agents.llm.backends.hf_engine import MASK_THREADS, mask_threads

    assert mask_threads(1) == 1 and mask_threads(5) == 5
    assert 1 <= mask_threads() <= MASK_THREADS
    with pytest.raises(ValueError, match="mask_threads must be at least 1, got 0"):
        mask_threads(0)


def test_bounded_gives_unbounded_strings_and_arrays_a_limit_and_leaves_fixed_ones() -> None:
    schema = {
        "type": "object",
        "properties": {
            "offer_id": {"type": "string"},
            "to": {"type": "array", "items": {"type": "string"}},
            "text": {"type": "string"},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "code": {"type": "string", "pattern": "[a-z]+"},
            "short": {"type": "string", "maxLength": 5},
            "few": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        },
        "$defs": {"Inner": {"type": "object", "properties": {"job_id": {"type": "string"}}}},
    }
    out = bounded(schema)
    props = out["properties"]
    ids = "^[A-Za-z0-9_.:-]{1,24}$"
    assert props["offer_id"]["pattern"] == ids and props["text"]["maxLength"] == 300
    assert props["to"]["maxItems"] == 64 and props["to"]["items"]["pattern"] == ids
    assert "maxLength" not in props["kind"] and props["code"] == {
        "type": "string",
        "pattern": "[a-z]+",
    }
    assert props["short"] == {"type": "string", "maxLength": 5} and props["few"]["maxItems"] == 3
    assert out["$defs"]["Inner"]["properties"]["job_id"]["pattern"] == ids
    assert schema["properties"]["offer_id"] == {"type": "string"}  # the caller's is untouched


def test_an_id_bound_takes_the_markets_ids_and_nothing_longer(backend: Any) -> None:
    """Under the id pattern a model can write every id the market makes (offers, coalitions,
    jobs, seats) and close the string; a 25-character id, an empty one or one with a space or a
    quote cannot be written."""
    engine = backend.loaded.state.get("engine") or _engine_of(backend)
    schema = bounded(
        {
            "type": "object",
            "properties": {"offer_id": {"type": "string"}},
            "required": ["offer_id"],
            "additionalProperties": False,
        }
    )
    grammar = engine.grammar(schema)

    def writes(value: str) -> bool:
        matcher = engine.xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
        return bool(matcher.accept_string('{"offer_id": "' + value + '"}'))

    for good in ("o12", "c3", "job7", "bidder_3", "designer_0", "a" * 24, "x-1.2:3"):
        assert writes(good), good
    for bad in ("a" * 25, "", "o 12", 'o"1', "ö1"):
        assert not writes(bad), bad


def test_a_static_kv_cache_decodes_the_same_replies_and_is_reused(gguf: Path) -> None:
    """``static_cache``: a preallocated KV cache (its step captured as a CUDA graph on a GPU;
    run eagerly on the CPU) decodes the same constrained replies as the growing cache, and a
    second batch of the same shape reuses the cache."""
    require_modules(HF_MODULES, HF_INSTALL)
    from agents.llm.backends.hf_backend import HFBackend

    schema = legal_action_schema(["bid", "wait", "finish"])
    asks = [_ask(f"Lab {i}: you need {i + 2} GPU blocks. Reply with an action.") for i in range(2)]
    replies = {}
    for static in (False, True):
        backend = HFBackend(path=gguf, max_new_tokens=32, static_cache=static, share_model=False)
        replies[static] = [backend.complete(m, schema, {}).text for m in asks]
        again = backend.complete(asks[0], schema, {}).text
        engine = engine_of(backend._get_loaded(), 32, 0.005)
        assert engine.static_batches == (3 if static else 0) and again == replies[static][0]
        if static:
            assert list(engine._static._slots) == [(1, 512)]  # one shape (1 row), reused
    assert replies[True] == replies[False]
    for text in replies[True]:
        _parse_action(text, ["bid", "wait", "finish"])


def test_a_padded_static_batch_decodes_what_the_growing_cache_decodes(backend: Any) -> None:
    """Three prompts of different lengths in one batch: the static decoder pads them to a slot of
    4 rows (an idle row) and writes its own masks and positions; the growing decoder drops rows
    as they finish. Both give every row the same tokens. So does the GPU's loop (forward
    launched first, rows advanced and grammar masks written meanwhile, then the masked pick),
    run here eagerly as on a GPU where capture failed."""
    from agents.llm.backends.hf_engine import BatchEngine

    loaded = backend._get_loaded()
    schema = legal_action_schema(["bid", "wait", "finish"])
    prompts = [
        _ask("Reply with an action."),
        _ask(
            "Lab 2 needs 5 GPU blocks at a price of at most 3 credits each. Reply with an action."
        ),
        _ask("You are lab 3. " * 12 + "Reply with an action as JSON."),
    ]
    ids = [loaded.tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in prompts]
    ids = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in ids]
    assert len({len(x) for x in ids}) == 3
    tokens = {}
    for mode in ("growing", "static", "launch_pick"):
        engine = BatchEngine(
            loaded.model,
            loaded.tokenizer,
            loaded.device,
            loaded.eos_ids,
            loaded.vocab_size,
            static_cache=mode != "growing",
        )
        if mode == "launch_pick":
            engine._static.graphs = True  # as on a GPU: its capture fails here, so runs eagerly
        batch = [
            GenerationRequest(prompt_ids=x, max_new=24 + 4 * i, schema=schema)
            for i, x in enumerate(ids)
        ]
        for request in batch:
            request.grammar = engine.grammar(schema)
        results = engine.decode(batch)
        tokens[mode] = [r.token_ids for r in results]
        assert all(r.batch == 3 for r in results)
    assert tokens["static"] == tokens["growing"] == tokens["launch_pick"]
    assert engine._static.graphs is False  # it tried to capture, and fell back to eager steps
    lengths = {len(t) for t in tokens["growing"]}
    assert len(lengths) > 1 or any(len(t) < 24 for t in tokens["growing"])


def test_prompt_masks_and_positions_by_hand() -> None:
    """Left padding: a pad position sees only itself; a real token sees the real tokens up to
    it; positions count real tokens only; slots hold a power of two of rows."""
    torch = pytest.importorskip("torch")
    from agents.llm.backends.hf_decode import bucket, positions, prefill_mask

    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert positions(mask).tolist() == [[0, 0, 1], [0, 1, 2]]
    full = prefill_mask(mask, 5)
    assert full.shape == (2, 1, 3, 5)
    assert full[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
    assert full[1, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 32)] == [1, 2, 4, 8, 8, 16, 32]


def test_the_in_graph_pick_takes_the_best_token_its_bitmask_allows() -> None:
    """The greedy pick a captured step runs on the GPU, run here on the CPU: bit j of word i
    allows token 32·i + j; tokens past the vocabulary (40 here) are never picked."""
    torch = pytest.importorskip("torch")
    from agents.llm.backends.hf_decode import StaticDecoder, _Slot

    decoder = StaticDecoder(None, "cpu", "cache", vocab_size=40, graphs=False)
    assert decoder.words == 2
    logits = torch.arange(70, dtype=torch.float32).repeat(3, 1).unsqueeze(1)  # best: the last
    bits = torch.zeros((3, 2), dtype=torch.int32)
    bits[0, 0] = 1 << 5  # token 5 only
    bits[1, 0], bits[1, 1] = (1 << 3) | (1 << 30), 1 << 2  # tokens 3, 30 and 34: 34 is best
    bits[2] = -1  # every token of the bitmask (0..63), but only 0..39 exist
    slot = _Slot(cache=None, ids=None, pos=None, mask=None, bits_host=bits)
    assert decoder._pick_in_graph(slot, logits).tolist() == [5, 34, 39]


def test_decode_attention_matches_pytorch_attention_with_repeated_key_heads() -> None:
    """One query per row, 6 query heads over 2 key heads, some columns masked: the grouped
    products give what PyTorch's own attention gives with every key head repeated per query
    head."""
    torch = pytest.importorskip("torch")
    from agents.llm.backends.hf_decode import decode_attention

    gen = torch.Generator().manual_seed(7)
    query = torch.randn(3, 6, 1, 8, generator=gen)
    key, value = torch.randn(3, 2, 10, 8, generator=gen), torch.randn(3, 2, 10, 8, generator=gen)
    mask = torch.rand(3, 1, 1, 10, generator=gen) > 0.3
    mask[:, :, :, 0] = True
    out, weights = decode_attention(None, query, key, value, mask, scaling=0.5)
    reference = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(3, dim=1),
        value.repeat_interleave(3, dim=1),
        attn_mask=mask,
        scale=0.5,
    )
    assert weights is None and out.shape == (3, 1, 6, 8)
    assert torch.allclose(out, reference.transpose(1, 2), atol=1e-5)


def test_seats_deciding_together_are_one_batch_however_spread_their_calls(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight LLM seats decide one step together: each announces its call before building its
    prompt (milliseconds of the event loop each, so the calls arrive spread out), and the engine
    waits for every announced call: one batch of 8, not a first batch of whoever came within the
    window and a second of the rest. Afterwards no call is still expected."""
    from agents.llm.agent import LLMAgent
    from agents.llm.backends.hf_engine import GenerationResult

    backend.complete(_ask("Say hello."), None, {"max_tokens": 2})  # the engine exists
    engine = engine_of(backend._get_loaded(), backend.max_batch, 0.005)
    sizes: list[int] = []

    def decode(batch: list[GenerationRequest]) -> list[GenerationResult]:
        sizes.append(len(batch))
        time.sleep(0.1)  # the model's time, during which late calls would queue
        reply = '{"action_type": "wait"}'
        return [GenerationResult([1], reply, "stop", "json", len(batch), 0.0, 0.1) for _ in batch]

    monkeypatch.setattr(engine, "decode", decode)
    monkeypatch.setattr(engine, "window_s", 0.0)  # nothing but the announcements gathers them
    # the bound on waiting for them is not what this test is about (a busy machine builds the
    # eight prompts slowly)
    monkeypatch.setattr("agents.llm.backends.hf_engine.EXPECT_WAIT_S", 30.0)
    observations = [o for o in bench_observations() if o.legal_actions][:8]
    agents = [LLMAgent(backend, retries=0, memory="none") for _ in observations]

    async def step() -> list[Any]:
        return await asyncio.gather(*(a.aact(o) for a, o in zip(agents, observations, strict=True)))

    actions = asyncio.run(step())
    assert sizes == [8] and engine.expected == 0
    assert all(a.action_type == "wait" for a in actions)


def test_an_announced_call_that_never_comes_does_not_hold_batches_and_settles_once(
    backend: Any,
) -> None:
    backend.complete(_ask("Say hello."), None, {"max_tokens": 2})
    engine = engine_of(backend._get_loaded(), backend.max_batch, 0.005)
    ticket = engine.expect()
    assert engine.expected == 1
    reply = backend.complete(_ask("Say hello."), None, {"max_tokens": 3})  # not held forever
    assert 0 < reply.completion_tokens <= 3 and engine.expected == 1
    ticket.settle()
    ticket.settle()
    assert engine.expected == 0


def test_a_call_that_must_wait_for_a_request_slot_withdraws_its_announcement() -> None:
    """With the limiter full, a seat's call would hold the next batch for nothing: it settles
    its announcement before it waits for a slot."""
    from agents.llm.agent import LLMAgent
    from agents.llm.backends.base import Completion, RequestLimiter

    settled: list[str] = []

    class Ticket:
        def settle(self) -> None:
            settled.append("settled")

    class Batching:
        model = "batching"

        def expect(self) -> Ticket:
            return Ticket()

        async def acomplete(self, messages: Any, schema: Any, params: Any) -> Completion:
            return Completion(text='{"action_type": "wait"}', model="batching")

    limiter = RequestLimiter(1)
    agent = LLMAgent(Batching(), limiter=limiter, retries=0, memory="none")
    observation = next(o for o in bench_observations() if o.legal_actions)

    async def main() -> Any:
        async with limiter:  # another seat holds the only slot
            task = asyncio.create_task(agent.aact(observation))
            for _ in range(50):
                await asyncio.sleep(0)
                if settled:
                    break
            before_slot = list(settled)
        return before_slot, await task

    before_slot, action = asyncio.run(main())
    assert before_slot == ["settled"] and action.action_type == "wait"
