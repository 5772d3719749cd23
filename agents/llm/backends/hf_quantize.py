"""Int8 weights on the CPU: a local model's linear layers as dynamically quantised int8 products.

On a CPU a decode step is bound by memory bandwidth: every token reads every weight once, and
SmolLM2-135M dequantised from its GGUF holds 540 MB of float32. Stored as int8 the same layers
read a quarter of that, and torch's int8 kernels (fbgemm) compute each product as

    y = s_x · s_w · (q_x · q_wᵀ) + b,   q_w = round(W / s_w),   q_x = round(x / s_x) + z_x

with one weight scale ``s_w`` per layer (per tensor), fixed when the model loads, and the
activation scale ``s_x`` (and zero point ``z_x``) measured on each input as it arrives (hence
"dynamic"). Only ``nn.Linear`` layers change: embeddings, norms and attention stay float32.
On the 2-core development machine a step of that model went from 43–55 ms to 16 ms and a
1,200-token prefill from 2.1 s to 0.8 s (docs/benchmarks.md).

**It costs fidelity, so it is opt-in.** The activations are rounded to 8 bits (in fact 7, as
fbgemm halves the range) with one scale per input row, and small language models carry a few
very large activation values that set that scale: on SmolLM2-135M the int8 model's most likely
next token agreed with the float32 model's at 47% and 38% of the positions of two prompts (700
tokens each; logits' cosine similarity 0.87 and 0.91 on average), 63–72% when the MLPs' down
projections (and the head) stay float32. bfloat16 weights on the same prompts agreed at 100% and
97%. So ``quantize=int8`` is for runs that need many decisions more than the model's best play
(smoke tests of a tournament, load tests); the model's own dtype is the default.

``quantize`` modes: ``"none"`` (the default: the model's own dtype) and ``"int8"`` (CPU only,
float32 weights).

torch's ``quantize_dynamic`` is deprecated in favour of torchao, whose CPU int8 paths measured
2–5× slower than float32 on the same machine (as did torch's weight-only int8 product), so this
module uses torch's own and silences that one warning; if a torch release drops it, asking for
int8 is an error that says so.
"""

from __future__ import annotations

import warnings
from typing import Any

from market.core.summation import ordered_sum

#: the ``quantize`` values a backend takes (None means "none")
QUANTIZE_MODES: tuple[str, ...] = ("none", "int8")


class QuantizeError(ValueError):
    """A ``quantize`` setting this device or torch build cannot honour (the message says why)."""


def int8_unavailable() -> str | None:
    """Why int8 dynamic quantisation cannot run in this torch, or None when it can."""
    import torch

    engines = set(torch.backends.quantized.supported_engines)
    if not engines & {"x86", "fbgemm", "qnnpack"}:
        return f"this torch build has no quantised CPU engine (it has {sorted(engines)})"
    try:
        from torch.ao.quantization import quantize_dynamic  # noqa: F401
    except ImportError:
        return "this torch release no longer has torch.ao.quantization.quantize_dynamic"
    return None


def _on_cpu(device: str) -> bool:
    return str(device).split(":")[0] == "cpu"


def check_quantize(mode: str | None, device: str) -> str:
    """``mode`` by its name (None is ``"none"``), checked before anything loads: raises
    :class:`QuantizeError` for an unknown mode or int8 asked for on a device other than the CPU."""
    name = "none" if mode is None else str(mode).strip().lower()
    if name not in QUANTIZE_MODES:
        raise QuantizeError(
            f"quantize={mode!r} is not a mode; use one of {', '.join(QUANTIZE_MODES)}"
        )
    if name == "int8" and not _on_cpu(device):
        raise QuantizeError(
            f"quantize=int8 runs on the CPU only, not on {device}; on a GPU use "
            "dtype=bfloat16 (or quantize=none)"
        )
    return name


def apply_quantize(model: Any, mode: str, device: str) -> str:
    """Quantise a loaded ``model`` as ``mode`` (checked by :func:`check_quantize`) asks; returns
    the mode it runs with. Raises :class:`QuantizeError` where int8 cannot run."""
    import torch

    if mode == "none":
        return "none"
    why = int8_unavailable()
    if why is None and not _on_cpu(device):
        why = f"it runs on the CPU only, not on {device}"
    dtypes = {p.dtype for p in model.parameters()}
    if why is None and dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        why = f"int8 products take float32 weights and this model's are {names}"
    if why is not None:
        raise QuantizeError(f"quantize=int8 cannot run: {why}; use quantize=none")
    quantize_int8(model)
    return "int8"


def quantize_int8(model: Any) -> int:
    """Replace ``model``'s ``nn.Linear`` layers, in place, by int8 dynamically quantised ones
    (per-tensor weight scales); returns how many layers were replaced."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    before = ordered_sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    with warnings.catch_warnings():
        # the deprecation of quantised tensors in favour of torchao (see the module docstring)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)  # type: ignore[no-untyped-call,unused-ignore]
    after = ordered_sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    return before - after


def is_quantized(model: Any) -> bool:
    """Whether ``model`` holds dynamically quantised linear layers."""
    try:
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    except ImportError:  # a torch without them (see the module docstring) quantised nothing
        return False

    return any(isinstance(m, DynamicLinear) for m in model.modules())
