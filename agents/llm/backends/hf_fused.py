"""Fewer kernels a step: fused forms of a model's RMSNorm, rotary embedding and MLP.

A small model's decode step on a GPU costs kernel launches more than arithmetic (see
docs/benchmarks.md): SmolLM2-135M runs about 40 small kernels a layer. Three rewrites cut that,
each computing the same rule as the code it replaces:

- **RMSNorm** ``w · x / sqrt(mean(x²) + ε)``, in float32 as transformers computes it: torch's
  ``rms_norm`` in one kernel instead of six;
- **rotary embedding** ``x·cos + rotate_half(x)·sin`` of the queries and the keys: one chain of
  element-wise products over both at once instead of one chain each (element by element the same
  operations, so the same bits);
- **MLP** ``down(act(gate·x) ⊙ (up·x))``: the gate and up projections as one matrix product
  over their stacked weights (the two weights become views of the stacked one: no memory added).

:func:`fuse` rewrites a loaded model in place and first checks each rewrite against the original
on random input: one that does not agree (to the dtype's rounding; the rotary one exactly) is
left out, so a model family with another norm, rotary or MLP rule keeps its own code. The rotary
rule is a function of the model's transformers module, not a layer, so that rewrite applies only
inside :func:`using_fused_rotary`: the engine wraps its forward passes (and CUDA graph captures) in
it, and outside them transformers is untouched.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: the attribute of a fused model that holds its :class:`Fused` record
FUSED_ATTR = "_gpumarket_fused"


@dataclass
class Fused:
    """What :func:`fuse` rewrote in one model, and what it left out (with the reason)."""

    norms: int = 0
    mlps: int = 0
    rotary: Callable[..., Any] | None = None  # the fused rotary function, when it checked out
    module: Any = None  # the transformers module whose rotary function it replaces
    left_out: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{self.norms} norms",
            f"{self.mlps} MLPs",
            f"rotary {'on' if self.rotary else 'off'}",
        ]
        return ", ".join(parts) + (
            f" (left out: {'; '.join(self.left_out)})" if self.left_out else ""
        )


def fused_rms_norm(self: Any, hidden: Any) -> Any:
    """``weight · x / sqrt(mean(x²) + ε)`` with the mean in float32, in one kernel."""
    import torch.nn.functional as F

    normed = F.rms_norm(hidden.float(), (hidden.shape[-1],), None, self.variance_epsilon)
    return self.weight * normed.to(hidden.dtype)


def fused_mlp(self: Any, hidden: Any) -> Any:
    """``down(act(gate·x) ⊙ (up·x))`` with gate and up as one product over stacked weights."""
    import torch.nn.functional as F

    gate, up = F.linear(hidden, self._gpumarket_stacked).chunk(2, dim=-1)
    return self.down_proj(self.act_fn(gate) * up)


def rotary_embedding(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
    """Queries and keys rotated together: ``x·cos + rotate_half(x)·sin`` where
    ``rotate_half(x) = (-x₂, x₁)`` for the halves x₁, x₂ of the head dimension."""
    import torch

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    both = torch.cat([q, k], dim=1)
    half = both.shape[-1] // 2
    rotated = torch.cat([-both[..., half:], both[..., :half]], dim=-1)
    out = both * cos + rotated * sin
    return out[:, : q.shape[1]], out[:, q.shape[1] :]


def fuse(model: Any) -> Fused:
    """Rewrite ``model``'s norms and MLPs in place and find its rotary rewrite (see the module
    docstring); each only where it agrees with the original. Idempotent: a model already fused
    returns its record."""
    done: Fused | None = getattr(model, FUSED_ATTR, None)
    if done is not None:
        return done
    import torch

    record = Fused()
    param = next(model.parameters())
    for module in model.modules():
        name = type(module).__name__
        if getattr(module, "_hf_hook", None) is not None:  # accelerate owns its forward
            continue
        if name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            if _agrees(module, fused_rms_norm, (1, 3, module.weight.shape[-1]), param, record):
                module.forward = types.MethodType(fused_rms_norm, module)
                record.norms += 1
        elif name.endswith("MLP") and all(
            hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")
        ):
            if module.gate_proj.bias is not None or module.up_proj.bias is not None:
                continue
            stacked = torch.cat([module.gate_proj.weight, module.up_proj.weight]).contiguous()
            module._gpumarket_stacked = stacked
            if _agrees(module, fused_mlp, (1, 3, module.gate_proj.in_features), param, record):
                rows = module.gate_proj.weight.shape[0]
                module.gate_proj.weight = torch.nn.Parameter(stacked[:rows], requires_grad=False)
                module.up_proj.weight = torch.nn.Parameter(stacked[rows:], requires_grad=False)
                module.forward = types.MethodType(fused_mlp, module)
                record.mlps += 1
            else:
                del module._gpumarket_stacked
    _find_rotary(model, param, record)
    setattr(model, FUSED_ATTR, record)
    log.info("fused kernels: %s", record.summary())
    return record


def _agrees(
    module: Any, fused: Callable[..., Any], shape: tuple[int, ...], param: Any, record: Fused
) -> bool:
    """Whether ``fused`` bound to ``module`` gives the module's own output on random input."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(shape, generator=generator).to(device=param.device, dtype=param.dtype)
    try:
        with torch.inference_mode():
            want, got = module(x), types.MethodType(fused, module)(x)
        torch.testing.assert_close(got, want)
        return True
    except Exception as exc:  # another rule (e.g. a (1 + w) norm): keep the model's own code
        record.left_out.append(f"{type(module).__name__}: {type(exc).__name__}")
        return False


def _find_rotary(model: Any, param: Any, record: Fused) -> None:
    """The fused rotary function, if the model's module has the standard one and it agrees."""
    import torch

    config = model.config
    home = sys.modules.get(type(model).__module__)
    original = getattr(home, "apply_rotary_pos_emb", None)
    heads = getattr(config, "num_attention_heads", None)
    if original is None or not heads:
        record.left_out.append("rotary: the model's module has no apply_rotary_pos_emb")
        return
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    generator = torch.Generator(device="cpu").manual_seed(0)

    def draw(*shape: int) -> Any:
        return torch.randn(shape, generator=generator).to(device=param.device, dtype=param.dtype)

    q, k, cos, sin = (
        draw(2, heads, 5, dim),
        draw(2, kv_heads, 5, dim),
        draw(2, 5, dim),
        draw(2, 5, dim),
    )
    try:
        with torch.inference_mode():
            want, got = original(q, k, cos, sin), rotary_embedding(q, k, cos, sin)
        same = all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    except Exception as exc:
        record.left_out.append(f"rotary: {type(exc).__name__}")
        return
    if not same:
        record.left_out.append("rotary: another rule than rotate_half")
        return
    record.rotary, record.module = rotary_embedding, home


#: modules whose rotary function is swapped now: id -> (module, original, users)
_SWAPPED: dict[int, tuple[Any, Any, int]] = {}
_SWAP_LOCK = threading.Lock()


@contextmanager
def using_fused_rotary(model: Any) -> Iterator[None]:
    """Meanwhile, the model's transformers module rotates with :func:`rotary_embedding` (when
    :func:`fuse` found it agrees); the original is put back when the last user leaves."""
    record = getattr(model, FUSED_ATTR, None)
    if record is None or record.rotary is None:
        yield
        return
    home = record.module
    with _SWAP_LOCK:
        _, original, users = _SWAPPED.get(id(home), (home, home.apply_rotary_pos_emb, 0))
        _SWAPPED[id(home)] = (home, original, users + 1)
        home.apply_rotary_pos_emb = record.rotary
    try:
        yield
    finally:
        with _SWAP_LOCK:
            _, original, users = _SWAPPED[id(home)]
            if users == 1:
                del _SWAPPED[id(home)]
                home.apply_rotary_pos_emb = original
            else:
                _SWAPPED[id(home)] = (home, original, users - 1)
