"""The forward passes of one batch: a prefill of the left-padded prompts, then one token a step.

:class:`~agents.llm.backends.hf_engine.BatchEngine` picks the tokens; a decoder runs the model.
Both decoders share one interface: ``prefill(ids, mask)`` returns the logits of every row's last
prompt position, ``step(tokens, keep)`` feeds each row its new token and returns the next logits,
and ``rows`` names the batch rows those logits belong to, in order.

- :class:`GrowingDecoder` uses transformers' own growing KV cache and masks. ``keep`` drops the
  rows that have finished from the cache, so a step's cost follows the rows still decoding (on a
  CPU a step's time grows with its rows).
- :class:`StaticDecoder` decodes into a preallocated KV cache whose shape is fixed per
  (rows, length) *slot*: rows are padded to a power of two with idle rows and the length rounded
  up to a multiple of :data:`STATIC_CACHE_STEP`, so few shapes occur and each is reused. It builds
  the attention masks itself (4-D, which transformers takes as they are) in fixed buffers that a
  step updates in place. On CUDA it captures a slot's decode step once as a CUDA graph: a step is
  then one graph replay instead of several hundred kernel launches from Python, which is what
  bounds a small model's step on a GPU. The forward and the greedy pick are two graphs, so the
  host advances the rows and writes the next grammar masks while the GPU computes the forward.
  Capturing costs about one step's time per slot, not a compilation; where a model's forward cannot be captured the decoder says so once in the log
  and runs the same step eagerly.

A padded prompt position attends to itself only (not to nothing): a row of the attention with
every key masked gives NaN, and NaN times a zero weight stays NaN in every later layer.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: a static KV cache's length is a multiple of this (fewer shapes, each reused)
STATIC_CACHE_STEP = 512
#: static slots (KV cache, masks and captured step) kept for reuse, least recently used dropped
STATIC_SLOTS = 8


def positions(mask: Any) -> Any:
    """Each prompt token's position: its index among its row's real tokens (pads get 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def prefill_mask(mask: Any, length: int) -> Any:
    """The boolean attention mask (rows, 1, width, length) of a left-padded prompt batch written
    at cache columns ``0..width-1``: a query sees the real tokens at or before it, and itself."""
    import torch

    rows, width = mask.shape
    real = mask.bool()
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = (causal.unsqueeze(0) & real.unsqueeze(1)) | torch.eye(width, dtype=torch.bool)
    out = torch.zeros(rows, 1, width, length, dtype=torch.bool)
    out[:, 0, :, :width] = allowed
    return out


def bucket(rows: int) -> int:
    """Rows padded up to a power of two: a slot's batch size."""
    return 1 << max(0, rows - 1).bit_length()


#: the name :func:`decode_attention` is registered under with transformers
DECODE_ATTENTION = "gpumarket_decode"


def decode_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention of one new query per row against the whole cache, as two batched products.

    ``query`` is (rows, heads, 1, dim), ``key``/``value`` (rows, kv_heads, length, dim) with
    ``heads = kv_heads · group`` (query head h reads key head h // group), ``attention_mask`` a
    boolean (rows, 1, 1, length), True where the query may look. The rule is softmax(q·kᵀ·s)·v
    over the allowed columns, with s = ``scaling`` (1/√dim when None). The group's queries are
    stacked against their shared key head, so no key is copied per query head; for one query a
    step this keeps every multiprocessor busy where PyTorch's fused kernels run one block per row
    and head. Returns (rows, 1, heads, dim) as transformers' attention functions do.
    """
    import torch

    rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, (heads // kv_heads) * queries, dim)
    scale = dim**-0.5 if scaling is None else scaling
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(rows, heads, queries, dim)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def attention_as(model: Any, name: str | None) -> Iterator[None]:
    """Run ``model`` with the attention implementation ``name`` (None: as it is) meanwhile."""
    if name is None:
        yield
        return
    from transformers import AttentionInterface

    if name == DECODE_ATTENTION and name not in AttentionInterface._global_mapping:
        AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    before = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = before


class GrowingDecoder:
    """Decoding with transformers' growing cache; finished rows are dropped from it."""

    def __init__(self, model: Any, device: Any, cache_arg: str) -> None:
        self.model, self.device, self.cache_arg = model, device, cache_arg
        self.rows: list[int] = []
        self._cache: Any = None
        self._mask: Any = None
        self._pos: Any = None

    def prefill(self, ids: Any, mask: Any, max_new: int) -> Any:
        from transformers import DynamicCache

        self.rows = list(range(ids.shape[0]))
        self._cache = DynamicCache(config=self.model.config)
        self._mask = mask.to(self.device)
        self._pos = mask.sum(-1, keepdim=True).to(self.device)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=self._mask,
            position_ids=positions(mask).to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: self._cache},
        )
        return out.logits[:, -1, :]

    def step(self, tokens: Any, keep: list[int]) -> Any:
        import torch

        if len(keep) < len(self.rows):
            index = torch.tensor(keep, device=self.device)
            self._cache.batch_select_indices(index)
            self._mask, self._pos = self._mask[index], self._pos[index]
            tokens = tokens[index]
            self.rows = [self.rows[k] for k in keep]
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=-1)
        out = self.model(
            input_ids=tokens.view(-1, 1),
            attention_mask=self._mask,
            position_ids=self._pos,
            use_cache=True,
            **{self.cache_arg: self._cache},
        )
        self._pos = self._pos + 1
        return out.logits[:, -1, :]


@dataclass
class _Slot:
    """A static KV cache with the fixed input buffers of its decode step (and its graph)."""

    cache: Any
    ids: Any  # (rows, 1) the tokens fed to the step
    pos: Any  # (rows, 1) their positions
    mask: Any  # (rows, 1, 1, length) which cache columns the step's query sees
    bits_host: Any = None  # (rows, words) int32, pinned: the grammar masks of the next token
    forward_graph: Any = None  # the captured forward: ids -> logits
    pick_graph: Any = None  # the captured pick: logits and bits_host -> greedy
    logits: Any = None  # the last step's logits (the forward graph's output buffer once captured)
    greedy: Any = None  # the pick graph's output: each row's masked arg-max
    width: int = 0  # the current batch's prompt width (its first generated column)
    steps: int = 0


class StaticDecoder:
    """Decoding into reused preallocated caches, on CUDA through captured graphs (see the
    module docstring). ``graphs=False`` runs the same fixed-shape step eagerly."""

    def __init__(
        self, model: Any, device: Any, cache_arg: str, vocab_size: int, *, graphs: bool
    ) -> None:
        self.model, self.device, self.cache_arg = model, device, cache_arg
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)  # int32 words of a grammar bitmask row
        self.graphs = graphs
        #: the attention the captured step uses ("default", "math" or "grouped"; see _capture)
        self.attention = ""
        self.rows: list[int] = []
        self.captured = 0
        self._slots: OrderedDict[tuple[int, int], _Slot] = OrderedDict()
        self._slot: _Slot | None = None
        self._pool: Any = None

    def _take_slot(self, rows: int, length: int) -> _Slot:
        import torch
        from transformers import StaticCache

        length = -(-length // STATIC_CACHE_STEP) * STATIC_CACHE_STEP
        key = (bucket(rows), length)
        slot = self._slots.pop(key, None)
        if slot is None:
            size = key[0]
            slot = _Slot(
                cache=StaticCache(config=self.model.config, max_cache_len=length),
                ids=torch.zeros((size, 1), dtype=torch.long, device=self.device),
                pos=torch.zeros((size, 1), dtype=torch.long, device=self.device),
                mask=torch.zeros((size, 1, 1, length), dtype=torch.bool, device=self.device),
                bits_host=self._bits(size) if self.graphs else None,
            )
        self._slots[key] = slot
        while len(self._slots) > STATIC_SLOTS:
            self._slots.popitem(last=False)
        return slot

    def _bits(self, rows: int) -> Any:
        """A bitmask buffer of ``rows`` rows, all allowed; pinned on CUDA (a graph copies it)."""
        import torch

        bits = torch.full((rows, self.words), -1, dtype=torch.int32)
        return bits.pin_memory() if str(self.device).startswith("cuda") else bits

    def prefill(self, ids: Any, mask: Any, max_new: int) -> Any:
        import torch

        used, width = ids.shape
        slot = self._slot = self._take_slot(used, width + max_new)
        size, length = slot.mask.shape[0], slot.mask.shape[-1]
        if size > used:  # idle rows: one pad token each, attending to itself only
            ids = torch.cat([ids, ids.new_full((size - used, width), int(ids[0, 0]))])
            mask = torch.cat([mask, mask.new_zeros((size - used, width))])
        self._set_length(slot, 0)
        self.rows = list(range(used))
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=prefill_mask(mask, length).to(self.device),
            position_ids=positions(mask).to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: slot.cache},
        )
        slot.width, slot.steps = width, 0
        slot.mask.zero_()
        slot.mask[:, 0, 0, :width] = mask.bool().to(self.device)
        slot.pos.copy_(mask.sum(-1, keepdim=True).to(self.device))
        return out.logits[:used, -1, :]

    @property
    def bits_host(self) -> Any:
        """The current slot's pinned grammar bitmask (rows, words): with ``greedy`` steps the
        caller fills row k with row k's allowed next tokens (-1 everywhere: no constraint)."""
        assert self._slot is not None, "prefill first"
        return self._slot.bits_host

    def step(self, tokens: Any, keep: list[int], greedy: bool = False) -> Any:
        """The next logits; with ``greedy`` instead each row's arg-max over the tokens its
        bitmask row allows (:meth:`launch` then :meth:`pick`)."""
        self.launch(tokens)
        if greedy:
            return self.pick()
        assert self._slot is not None
        return self._slot.logits[: len(self.rows), -1, :]

    def launch(self, tokens: Any) -> None:
        """Feed each row its new token and start the forward pass. On a GPU this only queues
        the captured graph: the caller advances its rows and writes the next grammar masks into
        :attr:`bits_host` while the GPU computes, then calls :meth:`pick`."""
        slot = self._slot
        assert slot is not None, "prefill first"
        slot.ids[: len(self.rows), 0].copy_(tokens)
        slot.mask[:, 0, 0, slot.width + slot.steps] = True  # the new token's own column
        room = slot.mask.shape[-1] - slot.width - slot.steps
        if self.graphs and slot.forward_graph is None and room > 8:  # capturing writes columns
            self._capture(slot)
        if slot.forward_graph is not None:
            slot.forward_graph.replay()
        else:  # no graph (capture failed, or too little room): the same forward, eagerly
            slot.logits = self._forward(slot)
        slot.pos.add_(1)
        slot.steps += 1

    def pick(self) -> Any:
        """Each row's arg-max over the tokens its :attr:`bits_host` row allows, for the forward
        :meth:`launch` started (the pick graph copies the masks when it runs, so they must be
        written before this call)."""
        slot = self._slot
        assert slot is not None, "prefill first"
        if slot.pick_graph is not None:
            slot.pick_graph.replay()
            return slot.greedy[: len(self.rows)]
        return self._pick_in_graph(slot, slot.logits)[: len(self.rows)]

    def _pick_in_graph(self, slot: _Slot, logits: Any) -> Any:
        """Each row's arg-max over the tokens its grammar bitmask allows (bit j of word i is
        token 32·i + j), from a copy of the pinned bitmask made inside the graph."""
        import torch

        bits = slot.bits_host.to(self.device, non_blocking=True)
        shifts = torch.arange(32, dtype=torch.int32, device=self.device)
        allowed = ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)
        last = logits[:, -1, :]
        width = last.shape[-1]
        if allowed.shape[-1] < width:
            pad = allowed.new_zeros((allowed.shape[0], width - allowed.shape[-1]))
            allowed = torch.cat([allowed, pad], dim=-1)
        allowed = allowed[:, :width]
        allowed[:, self.vocab_size :] = False  # logits past the tokenizer's vocabulary: never
        return last.masked_fill(~allowed, float("-inf")).argmax(dim=-1)

    def _forward(self, slot: _Slot) -> Any:
        out = self.model(
            input_ids=slot.ids,
            attention_mask=slot.mask,
            position_ids=slot.pos,
            use_cache=True,
            **{self.cache_arg: slot.cache},
        )
        return out.logits

    def _set_length(self, slot: _Slot, length: int) -> None:
        """Point every layer of the slot's cache at ``length`` written columns."""
        for layer in getattr(slot.cache, "layers", []):
            current: Any = getattr(layer, "cumulative_length", None)
            if hasattr(current, "fill_"):
                current.fill_(length)
            elif current is not None:
                layer.cumulative_length = length

    def _capture(self, slot: _Slot) -> None:
        """Capture the slot's decode step as two CUDA graphs, the forward and the pick (so the
        host can write the grammar masks while the forward runs), three ways: with PyTorch's
        default attention kernels, its plain "math" kernels and :func:`decode_attention`, and
        keep the fastest (for one query a step the memory-efficient kernel runs one block per
        row and head: slow for few rows); a way that fails is left out. Warm-up and timing steps
        write the cache; its length is set back after each."""
        from torch.nn.attention import SDPBackend, sdpa_kernel

        done = slot.width + slot.steps
        best: tuple[float, str, Any, Any, Any, Any] | None = None
        failed = []
        candidates = (
            ("default", None, None),
            ("math", [SDPBackend.MATH], None),
            ("grouped", None, DECODE_ATTENTION),
        )
        for name, backends, implementation in candidates:
            try:  # a candidate that cannot be captured is left out, not the others
                with (
                    sdpa_kernel(backends) if backends else _nothing(),
                    attention_as(self.model, implementation),
                ):
                    graphs, logits, greedy = self._capture_one(slot, done)
                seconds = self._time(graphs, slot, done)
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            finally:
                self._set_length(slot, done)
            if best is None or seconds < best[0]:
                best = (seconds, name, *graphs, logits, greedy)
        if best is None:  # no way to capture this forward: the same step, eagerly
            self.graphs = False
            log.warning("the model's decode step cannot be captured as a CUDA graph (%s)", failed)
            return
        if failed:
            log.info("decode step captured with %s attention; left out: %s", best[1], failed)
        _, self.attention, slot.forward_graph, slot.pick_graph, slot.logits, slot.greedy = best
        self.captured += 1

    def _capture_one(self, slot: _Slot, done: int) -> tuple[tuple[Any, Any], Any, Any]:
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()

        stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call,unused-ignore]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._pick_in_graph(slot, self._forward(slot))
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._set_length(slot, done)
        forward, pick = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(forward, pool=self._pool):
            logits = self._forward(slot)
        with torch.cuda.graph(pick, pool=self._pool):
            greedy = self._pick_in_graph(slot, logits)
        return (forward, pick), logits, greedy

    def _time(self, graphs: tuple[Any, Any], slot: _Slot, done: int, replays: int = 5) -> float:
        import torch

        for graph in graphs:
            graph.replay()
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(replays):
            for graph in graphs:
                graph.replay()
        torch.cuda.synchronize(self.device)
        self._set_length(slot, done)
        return time.perf_counter() - start


@contextmanager
def _nothing() -> Iterator[None]:
    yield
