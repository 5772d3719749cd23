"""Fused norm, rotary and MLP kernels (``hf_fused``): the same rule as the code they replace.

What must hold: a fused model gives the original's logits (to float rounding); the rotary
rewrite gives the same bits; the stacked MLP weights add no memory; a rule the rewrite does not
follow is left out (and said); the rotary swap is undone when its last user leaves, also when
users overlap; and the real SmolLM2 decodes the same tokens fused and unfused.
"""

from __future__ import annotations

import copy
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from real_model_utils import HF_INSTALL, HF_MODULES, require_modules, tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agents.llm.backends.hf_fused import (  # noqa: E402
    FUSED_ATTR,
    fuse,
    rotary_embedding,
    using_fused_rotary,
)


def test_a_fused_model_gives_the_originals_logits_and_adds_no_memory() -> None:
    original = tiny_llama()
    model = copy.deepcopy(original)
    record = fuse(model)
    assert (record.norms, record.mlps) == (2 * 2 + 1, 2)  # two per layer and the final one
    assert record.rotary is rotary_embedding and not record.left_out
    assert fuse(model) is record  # idempotent
    ids = torch.randint(0, 128, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = original(input_ids=ids).logits
        with using_fused_rotary(model):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    mlp = model.model.layers[0].mlp
    stacked = mlp._gpumarket_stacked
    assert mlp.gate_proj.weight.data_ptr() == stacked.data_ptr()
    row_bytes = stacked.shape[1] * stacked.element_size()
    assert mlp.up_proj.weight.data_ptr() == stacked.data_ptr() + 96 * row_bytes


def test_the_rotary_rewrite_gives_the_same_bits_as_rotate_half() -> None:
    """x·cos + rotate_half(x)·sin written out by hand, rotate_half(x) = (-x2, x1)."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g)
    cos, sin = torch.randn(2, 3, 8, generator=g), torch.randn(2, 3, 8, generator=g)

    def by_hand(x: Any) -> Any:
        half = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
        return x * cos[:, None] + half * sin[:, None]

    fq, fk = rotary_embedding(q, k, cos, sin)
    assert torch.equal(fq, by_hand(q)) and torch.equal(fk, by_hand(k))
    assert fq.shape == q.shape and fk.shape == k.shape


class OffsetRMSNorm(torch.nn.Module):
    """A norm of another rule, ``(1 + w) · x / rms(x)``: the rewrite must leave it alone."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((width,), 0.5))
        self.variance_epsilon = 1e-6

    def forward(self, x: Any) -> Any:
        rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (1 + self.weight) * x * rms


def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:
    """An interleaved rotary rule (pairs of neighbours), not rotate_half's halves."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def turn(x: Any) -> Any:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)

    return q * cos + turn(q) * sin, k * cos + turn(k) * sin


class OtherModel(torch.nn.Module):
    """A model of this test module (whose ``apply_rotary_pos_emb`` is interleaved)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = OffsetRMSNorm(8)
        self.config = SimpleNamespace(num_attention_heads=2, num_key_value_heads=1, head_dim=8)


def test_another_norm_or_rotary_rule_is_left_out_and_said() -> None:
    model = OtherModel()
    record = fuse(model)
    assert record.norms == 0 and record.rotary is None
    assert any("OffsetRMSNorm" in note for note in record.left_out)
    assert any(note.startswith("rotary:") for note in record.left_out)
    assert "forward" not in model.norm.__dict__  # its own forward is kept
    with using_fused_rotary(model):  # nothing to swap
        assert sys.modules[__name__].apply_rotary_pos_emb is apply_rotary_pos_emb


def test_the_rotary_swap_is_undone_when_the_last_of_overlapping_users_leaves() -> None:
    model = tiny_llama()
    fuse(model)
    home = getattr(model, FUSED_ATTR).module
    original = home.apply_rotary_pos_emb
    inside, leave = threading.Event(), threading.Event()
    seen: list[Any] = []

    def other_user() -> None:
        with using_fused_rotary(model):
            inside.set()
            leave.wait(10)
        seen.append(home.apply_rotary_pos_emb)

    thread = threading.Thread(target=other_user)
    with using_fused_rotary(model):
        assert home.apply_rotary_pos_emb is rotary_embedding
        thread.start()
        assert inside.wait(10)
    assert home.apply_rotary_pos_emb is rotary_embedding  # the other user is still inside
    leave.set()
    thread.join(10)
    assert seen == [original] and home.apply_rotary_pos_emb is original


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_decodes_the_same_tokens_fused_and_unfused() -> None:
    """Two copies of the real SmolLM2 (from its cached conversion): one engine fused, one not."""
    require_modules(HF_MODULES, HF_INSTALL)
    from real_model_utils import require_gguf

    from agents.llm.backends.hf_engine import BatchEngine, GenerationRequest
    from agents.llm.backends.hf_loading import ModelKey, load_model

    gguf = require_gguf()
    loaded = load_model(ModelKey.of(gguf))
    if loaded.cache_path is not None:  # the cached conversion loads in a second
        plain = transformers.AutoModelForCausalLM.from_pretrained(loaded.cache_path).eval()
    else:
        plain = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name
        ).eval()
    fused_model = copy.deepcopy(plain)
    prompts = ["Name one GPU maker.", "Reply with a JSON object with a key price."]
    tokens = {}
    for fused, model in ((False, plain), (True, fused_model)):
        engine = BatchEngine(
            model, loaded.tokenizer, "cpu", loaded.eos_ids, loaded.vocab_size, fused=fused
        )
        batch = [
            GenerationRequest(prompt_ids=loaded.tokenizer.encode(p), max_new=12) for p in prompts
        ]
        tokens[fused] = [r.token_ids for r in engine.decode(batch)]  # type: ignore[union-attr]
        assert (engine.fused is not None) == fused
    assert getattr(fused_model, FUSED_ATTR).norms == 61 and not hasattr(plain, FUSED_ATTR)
    assert tokens[True] == tokens[False] and all(len(t) > 0 for t in tokens[True])


def test_the_fused_kernels_option_of_a_spec_is_read_as_a_flag() -> None:
    """``llm:hf?...&fused_kernels=false`` must switch the rewrite off: the text "false" is not a
    true value, and "none" keeps the default (on a GPU only)."""
    from agents.llm.backends.hf_backend import HFBackend
    from agents.llm.spec import coerce_params

    read = coerce_params(HFBackend, {"fused_kernels": "false", "static_cache": "true"})
    assert read == {"fused_kernels": False, "static_cache": True}
    assert coerce_params(HFBackend, {"fused_kernels": "on"}) == {"fused_kernels": True}
    assert coerce_params(HFBackend, {"fused_kernels": "none"}) == {"fused_kernels": None}
