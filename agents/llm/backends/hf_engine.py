"""Batched, grammar-constrained decoding for one loaded transformers model.

:class:`BatchEngine` owns a worker thread per loaded model. Callers (any thread, any event loop)
:meth:`~BatchEngine.submit` a :class:`GenerationRequest` and get a ``concurrent.futures.Future``.
The worker gathers requests into a *batch*: it takes the first waiting request, then waits at most
``window_s`` for more, up to ``max_batch``, and longer (at most :data:`EXPECT_WAIT_S`) while
calls announced with :meth:`~BatchEngine.expect` have not arrived (an LLM seat announces its call
before it builds its prompt, see ``agents.llm.backends.base.announced``); requests arriving while
a batch decodes wait for the next one. A batch is decoded by a decoder of
:mod:`~agents.llm.backends.hf_decode` (the model's
forward with a KV cache and left padding: transformers' growing cache, or with ``static_cache`` a
preallocated one whose step is captured as a CUDA graph on a GPU); this module picks the tokens,
row by row (on a GPU the model first gets the fused norm, rotary and MLP kernels of
:mod:`~agents.llm.backends.hf_fused`):

- :class:`_Picker` applies the row's repetition penalty, masks every token its JSON-schema grammar
  forbids (an ``xgrammar`` matcher per row) and takes the arg-max, or for a sampled row draws the
  token from the row's own ``torch.Generator`` (never torch's global RNG). The rows' masks are
  written by xgrammar's batch matcher on ``mask_threads`` threads: a row's mask costs from a few
  microseconds to milliseconds of CPU a step (most in a long bounded string), which at 32 rows can
  be more than a GPU's whole step (docs/benchmarks.md);
- :meth:`BatchEngine._advance` feeds each new token to the row's matcher and ends the row when
  its JSON object is complete, a stop string appears, its own token limit is reached, its caller
  cancelled it or its deadline passed. The other rows go on; a finished row leaves the growing
  cache at the next step.

Constrained rows therefore always produce valid JSON of the schema unless they are cut off by the
length limit. Greedy rows (temperature 0) are deterministic for a given device and batch
composition; a different batch size or padding can change the last bits of the logits and so,
rarely, a near-tie between two tokens (see docs/llm-seats.md).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agents.llm.backends.hf_decode import GrowingDecoder, StaticDecoder
from agents.llm.backends.hf_fused import Fused, fuse, using_fused_rotary
from agents.llm.backends.hf_quantize import is_quantized

log = logging.getLogger(__name__)

#: how long the worker waits for more requests after the first one of a batch (seconds)
DEFAULT_WINDOW_S = 0.005
#: most requests decoded together
DEFAULT_MAX_BATCH = 32
#: compiled grammars kept per model (one per distinct schema: a phase's legal actions)
GRAMMAR_CACHE = 256
#: the most threads that write the rows' token masks by default (see :func:`mask_threads`)
MASK_THREADS = 16


def mask_threads(asked: int | None = None) -> int:
    """The most threads writing a step's token masks: ``asked``, or the machine's cores up to
    :data:`MASK_THREADS`. A step uses at most one thread per row (one: row by row)."""
    if asked is not None:
        if int(asked) < 1:
            raise ValueError(f"mask_threads must be at least 1, got {asked}")
        return int(asked)
    return max(1, min(MASK_THREADS, os.cpu_count() or 1))


#: how long a batch waits at most for calls announced but not yet submitted (seconds): longer
#: than eight seats take to build their prompts on a busy 2-core machine, short against a decode
EXPECT_WAIT_S = 0.25


#: longest string the grammar lets a model write where the schema sets no bound: ids and seat
#: names (a property named ``*_id``, ``to``, ``target``, ``members``) and other text
MAX_ID_CHARS = 24
MAX_TEXT_CHARS = 300
#: what an id may be: the market's ids and seat names ("o12", "c3", "job7", "bidder_3") in the
#: characters ids are made of. A pattern, not ``maxLength``: xgrammar 0.2.8 writes the mask of a
#: ``maxLength`` string slowly (0.05–2.5 ms a token, against 0.003 ms for this pattern, measured
#: with SmolLM2's tokenizer; a known xgrammar issue)
ID_PATTERN = f"^[A-Za-z0-9_.:-]{{1,{MAX_ID_CHARS}}}$"
#: most items of an array the schema does not bound
MAX_ITEMS = 64
_ID_NAMES = frozenset({"to", "target", "members"})


def bounded(schema: Any, name: str = "") -> Any:
    """``schema`` with a length bound on every string and array that has none.

    A small model under a grammar otherwise fills an id with digits until the token limit cuts
    the reply off (``"offer_id": "123456789012..."``): the reply is valid so far but never ends.
    Real ids and seat names are short, and free text past a few hundred characters is noise in a
    negotiation, so id-like strings get :data:`ID_PATTERN` (1 to :data:`MAX_ID_CHARS` id
    characters), other strings :data:`MAX_TEXT_CHARS`, arrays :data:`MAX_ITEMS`. Strings fixed by
    ``enum``, ``const`` or ``pattern`` are left alone. An LLM seat's own decision grammar
    (:func:`agents.llm.decision_grammar.decision_schema`: ids as enums, text patterns sized to
    the reply's ``max_tokens``) bounds everything itself and passes through unchanged.
    """
    if isinstance(schema, list):
        return [bounded(item, name) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {prop: bounded(sub, prop) for prop, sub in value.items()}
        elif key in ("$defs", "definitions") and isinstance(value, dict):
            out[key] = {ref: bounded(sub) for ref, sub in value.items()}
        else:
            out[key] = bounded(value, name)
    fixed = any(k in out for k in ("enum", "const", "pattern"))
    if out.get("type") == "string" and "maxLength" not in out and not fixed:
        if name.endswith("_id") or name in _ID_NAMES:
            out["pattern"] = ID_PATTERN
        else:
            out["maxLength"] = MAX_TEXT_CHARS
    if out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = MAX_ITEMS
    return out


class EngineCancelled(Exception):
    """The caller cancelled the request; its row stopped at its next token."""


@dataclass
class GenerationRequest:
    """One prompt to continue: token ids, limits and sampling for this row only."""

    prompt_ids: list[int]
    max_new: int
    schema: dict[str, Any] | None = None
    grammar: Any = None  # the schema's compiled grammar, set by BatchEngine.submit
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    generator: Any = None  # a torch.Generator for sampled rows
    stop: list[str] = field(default_factory=list)
    timeout: float | None = None  # seconds of decoding, counted from the batch's start
    expectation: Any = None  # the announcement this request fulfils (:meth:`BatchEngine.expect`)
    cancel: threading.Event = field(default_factory=threading.Event)
    future: concurrent.futures.Future[GenerationResult] = field(
        default_factory=concurrent.futures.Future
    )
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class GenerationResult:
    """What one row produced: its tokens (end token excluded), text and why it stopped."""

    token_ids: list[int]
    text: str
    finish: str  # "stop" (end token, JSON complete or stop string) | "length"
    stopped_by: str | None  # "eos" | "json" | "stop_sequence" | None
    batch: int  # rows decoded together with this one (itself included)
    queue_s: float
    decode_s: float


def _settle(future: concurrent.futures.Future[Any], outcome: Any) -> None:
    """Resolve a caller's future unless the caller cancelled it already (then nobody waits)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except concurrent.futures.InvalidStateError:
        pass


class Expectation:
    """A call announced to an engine (:meth:`BatchEngine.expect`); settled once, when the call
    is submitted or the caller gives up on it."""

    __slots__ = ("engine", "settled")

    def __init__(self, engine: BatchEngine) -> None:
        self.engine, self.settled = engine, False

    def settle(self) -> None:
        self.engine._settle_expected(self)


class _Row:
    """A request's decoding state inside a batch."""

    def __init__(self, request: GenerationRequest, matcher: Any, deadline: float | None) -> None:
        self.request = request
        self.matcher = matcher
        self.deadline = deadline
        self.tokens: list[int] = []
        self.done = False
        self.finish = "length"
        self.stopped_by: str | None = None
        self.failure: BaseException | None = None
        self.text_cache: str | None = None


class BatchEngine:
    """The batching worker of one loaded model (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: Any,
        eos_ids: frozenset[int],
        vocab_size: int,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        window_s: float = DEFAULT_WINDOW_S,
        static_cache: bool = False,
        fused: bool | None = None,
        threads: int | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.eos_ids = eos_ids
        self.vocab_size = int(vocab_size)
        self.max_batch = int(max_batch)
        self.window_s = max(0.0, float(window_s))
        self.static_cache = bool(static_cache)
        # transformers 5.2x renamed the forward's KV-cache argument from past_key_values to cache
        forward = inspect.signature(model.forward).parameters
        cache_arg = "cache" if "cache" in forward else "past_key_values"
        self.pad_id = self._pad_id()
        import xgrammar as xgr

        self.xgr = xgr
        #: the most threads writing the rows' token masks (:func:`mask_threads`)
        self.mask_threads = mask_threads(threads)
        self._batch_matchers: dict[int, Any] = {}  # xgrammar's batch matcher per thread count
        on_cuda = str(device).startswith("cuda")
        # fused kernels pay on a GPU, where a step is bound by kernel launches; on a CPU they
        # measured neither faster nor slower, so the model's own code runs there by default
        #: what :func:`~agents.llm.backends.hf_fused.fuse` rewrote (None: not fused)
        want_fused = on_cuda if fused is None else fused
        if want_fused and is_quantized(model):
            # the MLP rewrite stacks float weights; int8 layers keep their own products
            log.warning("fused kernels are off: the model runs int8 weights (hf_quantize)")
            want_fused = False
        self.fused: Fused | None = fuse(model) if want_fused else None
        self._growing = GrowingDecoder(model, device, cache_arg)
        self._static = (
            StaticDecoder(model, device, cache_arg, self.vocab_size, graphs=on_cuda)
            if self.static_cache
            else None
        )
        self._queue: list[GenerationRequest] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._compiler: Any = None
        self._grammars: OrderedDict[str, Any] = OrderedDict()
        self._grammar_lock = threading.Lock()
        #: batches decoded and rows in them (for benchmarks and tests)
        self.batches = 0
        self.rows = 0
        self.largest_batch = 0
        #: batches decoded with a static KV cache
        self.static_batches = 0
        #: whether xgrammar's own GPU kernel masks logits (False after it failed once)
        self.gpu_kernel = True
        #: calls announced (:meth:`expect`) and not yet submitted
        self.expected = 0

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else min(self.eos_ids, default=0)

    # --- grammars --------------------------------------------------------------------------
    def grammar(self, schema: dict[str, Any]) -> Any:
        """The compiled xgrammar grammar of a JSON schema (:func:`bounded`; cached per schema)."""
        key = json.dumps(bounded(schema), sort_keys=True, separators=(",", ":"))
        with self._grammar_lock:
            hit = self._grammars.get(key)
            if hit is not None:
                self._grammars.move_to_end(key)
                return hit
            if self._compiler is None:
                xgr = self.xgr
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=sorted(self.eos_ids)
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=2)
            compiled = self._compiler.compile_json_schema(key, any_whitespace=False)
            self._grammars[key] = compiled
            if len(self._grammars) > GRAMMAR_CACHE:
                self._grammars.popitem(last=False)
            return compiled

    # --- submission ------------------------------------------------------------------------
    def expect(self) -> Expectation:
        """Announce a call that is about to be submitted: until it is (or its expectation is
        settled, or :data:`EXPECT_WAIT_S` passed), the next batch waits for it."""
        with self._wake:
            self.expected += 1
        return Expectation(self)

    def _settle_expected(self, expectation: Expectation) -> None:
        with self._wake:
            if not expectation.settled:
                expectation.settled = True
                self.expected -= 1
                self._wake.notify()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[GenerationResult]:
        """Queue a request; its future resolves to a :class:`GenerationResult` or raises."""
        if request.schema is not None:
            # compiled here, once: compile errors belong to the caller, not the batch
            request.grammar = self.grammar(request.schema)
        expectation = request.expectation
        with self._wake:
            self._queue.append(request)
            # settled with the request already queued: a batch taken at the notification has it
            if expectation is not None and expectation.engine is self:
                expectation.settle()  # the condition's lock is re-entrant
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="gpumarket-hf-engine", daemon=True
                )
                self._thread.start()
            self._wake.notify()
        if expectation is not None and expectation.engine is not self:
            expectation.settle()  # another engine's announcement: settled outside this lock
        return request.future

    def _take_batch(self) -> list[GenerationRequest]:
        with self._wake:
            while not self._queue:
                self._wake.wait()
            first_seen = time.perf_counter()
            while len(self._queue) < self.max_batch:
                # announced calls are waited for (their seats are building their prompts)
                limit = EXPECT_WAIT_S if self.expected > 0 else self.window_s
                left = limit - (time.perf_counter() - first_seen)
                if left <= 0:
                    break
                self._wake.wait(left)
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
        live = []
        for request in batch:
            if request.cancel.is_set() or request.future.cancelled():
                _settle(request.future, EngineCancelled())
            else:
                live.append(request)
        return live

    def _serve(self) -> None:
        while True:
            try:
                self._serve_one()
            except BaseException:  # never let the worker die: every later call would hang
                log.exception("the hf engine's batch loop failed; it goes on with the next batch")

    def _serve_one(self) -> None:
        batch = self._take_batch()
        if not batch:
            return
        try:
            results: list[GenerationResult | BaseException] = list(self.decode(batch))
        except Exception as exc:  # out of memory, a torch error: every row of the batch fails
            results = [exc] * len(batch)
        for request, outcome in zip(batch, results, strict=True):
            _settle(request.future, outcome)

    # --- decoding --------------------------------------------------------------------------
    def decode(self, batch: list[GenerationRequest]) -> list[GenerationResult | BaseException]:
        """Decode ``batch`` together: one prefill, then a token per live row per step."""
        import torch

        start = time.perf_counter()
        rows = [
            _Row(r, self._matcher(r), None if r.timeout is None else start + float(r.timeout))
            for r in batch
        ]
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row's last token is at the same column
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids) :] = 1
        max_new = max(r.max_new for r in batch)
        static = self._static
        decoder = static if static is not None else self._growing
        # greedy rows without a penalty: the captured graph masks and picks on the GPU
        in_graph = (
            static is not None
            and static.graphs
            and all(r.temperature == 0.0 and r.repetition_penalty == 1.0 for r in batch)
        )
        picker = _Picker(self, len(batch))
        with torch.inference_mode(), using_fused_rotary(self.model):
            logits = decoder.prefill(ids, mask, max_new)
            tokens, fed = picker.pick(logits, rows)
            for _ in range(max_new):
                live = decoder.rows
                if in_graph and static is not None:
                    # the GPU runs the next forward while the host advances the rows; a row
                    # that ends here only wastes its slot's (padded) row of that forward
                    static.launch(fed)
                now = time.perf_counter()
                for i, token in zip(live, tokens, strict=True):
                    if not rows[i].done:
                        self._advance(rows[i], token, now)
                keep = [k for k, i in enumerate(live) if not rows[i].done]
                if not keep:
                    break
                if in_graph and static is not None:
                    picker.fill(static.bits_host, [rows[i] for i in live])
                    fed = static.pick()
                    tokens = fed.tolist()  # the one device sync of the step
                else:
                    logits = decoder.step(fed, keep)
                    tokens, fed = picker.pick(logits, [rows[i] for i in decoder.rows])
        if self._static is not None:
            self.static_batches += 1
        decode_s = time.perf_counter() - start
        self.batches += 1
        self.rows += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        out: list[GenerationResult | BaseException] = []
        for row in rows:
            if row.failure is not None:
                out.append(row.failure)
                continue
            out.append(
                GenerationResult(
                    token_ids=row.tokens,
                    text=self.text(row),
                    finish=row.finish,
                    stopped_by=row.stopped_by,
                    batch=len(batch),
                    queue_s=start - row.request.queued_at,
                    decode_s=decode_s,
                )
            )
        return out

    def _advance(self, row: _Row, token: int, now: float) -> None:
        """Take a row's new token: end the row on the end token, a complete JSON object, a stop
        string, its token limit, its caller's cancellation or its deadline."""
        request = row.request
        if token in self.eos_ids:
            row.done, row.finish, row.stopped_by = True, "stop", "eos"
            return
        row.tokens.append(token)
        if row.matcher is not None:
            if not row.matcher.accept_token(token):  # the mask forbids this: a bug, say so
                row.failure = RuntimeError(f"the grammar rejected token {token} after masking")
                row.done = True
                return
            if row.matcher.is_terminated():
                row.done, row.finish, row.stopped_by = True, "stop", "json"
                return
        if request.stop:
            text = str(self.tokenizer.decode(row.tokens, skip_special_tokens=True))
            hit = min((i for i in (text.find(s) for s in request.stop) if i >= 0), default=-1)
            if hit >= 0:
                row.text_cache = text[:hit]
                row.done, row.finish, row.stopped_by = True, "stop", "stop_sequence"
                return
        if len(row.tokens) >= request.max_new:
            row.done = True  # finish stays "length"
        elif request.cancel.is_set() or request.future.cancelled():
            row.failure, row.done = EngineCancelled(), True
        elif row.deadline is not None and now > row.deadline:
            row.failure = TimeoutError(
                f"timed out after {float(request.timeout or 0):g}s "
                f"({len(row.tokens)} tokens generated)"
            )
            row.done = True

    def _matcher(self, request: GenerationRequest) -> Any:
        if request.schema is None:
            return None
        grammar = request.grammar if request.grammar is not None else self.grammar(request.schema)
        return self.xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)

    def text(self, row: _Row) -> str:
        if row.text_cache is None:
            row.text_cache = str(self.tokenizer.decode(row.tokens, skip_special_tokens=True))
        return row.text_cache


class _Picker:
    """Chooses each live row's next token: its repetition penalty, its grammar's mask, then the
    arg-max, or for a sampled row a draw from its own generator."""

    def __init__(self, engine: BatchEngine, size: int) -> None:
        self.engine = engine
        self.bitmask = engine.xgr.allocate_token_bitmask(size, engine.vocab_size)
        self.on_cpu = str(engine.device).startswith("cpu")

    def pick(self, logits: Any, rows: list[_Row]) -> tuple[list[int], Any]:
        """The tokens of ``rows`` (one per logits row; finished rows get a token nobody reads)
        as a list and as the device tensor to feed the next step."""
        import torch

        constrained = []
        for k, row in enumerate(rows):
            if row.done:
                continue
            penalty = row.request.repetition_penalty
            if penalty != 1.0 and row.tokens:
                seen = torch.tensor(sorted(set(row.tokens)), device=logits.device)
                picked = logits[k, seen]
                logits[k, seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
            if row.matcher is not None:
                constrained.append(k)
        if constrained:
            self._write(self.bitmask, [(k, rows[k].matcher) for k in constrained])
            self._mask(logits, constrained)
        fed = logits.argmax(dim=-1)
        tokens = fed.tolist()  # the one device sync of the step
        drawn = False
        for k, row in enumerate(rows):
            if not row.done and row.request.temperature > 0.0:
                tokens[k], drawn = _sample(logits[k], row.request), True
        if drawn:
            fed = torch.tensor(tokens, dtype=torch.long, device=logits.device)
        return tokens, fed

    def fill(self, bits: Any, rows: list[_Row]) -> None:
        """Write each row's allowed next tokens into row k of ``bits`` (all allowed: -1)."""
        constrained = []
        for k, row in enumerate(rows):
            if row.done or row.matcher is None:
                bits[k].fill_(-1)
            else:
                constrained.append((k, row.matcher))
        self._write(bits, constrained)

    def _write(self, bits: Any, rows: list[tuple[int, Any]]) -> None:
        """Each (k, matcher)'s allowed next tokens into row k of ``bits``: on the engine's mask
        threads when there are several rows (each row's mask is its own, so the same bits)."""
        threads = min(self.engine.mask_threads, len(rows))
        if threads < 2:
            for k, matcher in rows:
                matcher.fill_next_token_bitmask(bits, k)
            return
        batch = self.engine._batch_matchers.get(threads)
        if batch is None:
            batch = self.engine.xgr.BatchGrammarMatcher(max_threads=threads)
            self.engine._batch_matchers[threads] = batch
        batch.batch_fill_next_token_bitmask(
            [matcher for _, matcher in rows], bits, indices=[k for k, _ in rows]
        )

    def _mask(self, logits: Any, rows: list[int]) -> None:
        """Set the logits each row's grammar forbids to -inf: xgrammar's own kernel for the
        device (CUDA or Triton on a GPU), its portable torch version where that kernel fails."""
        xgr, vocab = self.engine.xgr, self.engine.vocab_size
        if self.on_cpu:
            bitmask = self.bitmask[: logits.shape[0]]
            xgr.apply_token_bitmask_inplace(
                logits, bitmask, vocab_size=vocab, indices=rows, backend="cpu"
            )
            return
        bitmask = self.bitmask[: logits.shape[0]].to(logits.device, non_blocking=True)
        if self.engine.gpu_kernel:
            try:
                xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=rows)
                return
            except Exception as exc:  # e.g. no compiler for the kernel: the portable one, once
                self.engine.gpu_kernel = False
                log.warning("xgrammar's GPU mask kernel failed (%s); using its torch version", exc)
        xgr.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=vocab, indices=rows, backend="torch_native"
        )


def _sample(logits: Any, request: GenerationRequest) -> int:
    """One draw from ``softmax(logits / temperature)`` after top-k and top-p, on the CPU with
    the request's generator (the same draws on any device for the same logits)."""
    import torch

    scores = logits.float().cpu() / request.temperature
    if 0 < request.top_k < scores.numel():
        kth = torch.topk(scores, request.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if request.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs > request.top_p  # keeps the first
        scores = scores.index_fill(0, order[drop], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=request.generator).item())
