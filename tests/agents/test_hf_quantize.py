"""Int8 products on the CPU (``hf_quantize``): the product rule, the modes, and the real model.

What must hold: a quantised layer's weights are the float weights rounded to a per-tensor scale
(max |W| / 127.5) and its output is the float product to within the rounding of weights and
inputs; int8 is asked for, never the default, and asking for it where it cannot run (a GPU,
bfloat16 weights, an unknown mode) is a clear error; the real SmolLM2 loads as int8 when asked,
every linear layer int8, and its engine still decodes replies the grammar allows.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules, tiny_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agents.llm.backends.hf_loading import ModelKey, load_uncached  # noqa: E402
from agents.llm.backends.hf_quantize import (  # noqa: E402
    QuantizeError,
    apply_quantize,
    check_quantize,
    int8_unavailable,
    is_quantized,
    quantize_int8,
)

needs_int8 = pytest.mark.skipif(
    int8_unavailable() is not None, reason=f"no int8 on this torch: {int8_unavailable()}"
)


def test_modes_are_checked_before_loading() -> None:
    assert check_quantize(None, "cpu") == "none"
    assert check_quantize(" INT8 ", "cpu") == "int8"
    assert check_quantize("none", "cuda:0") == "none"
    with pytest.raises(
        QuantizeError, match=r"quantize='int4' is not a mode; use one of none, int8"
    ):
        check_quantize("int4", "cpu")
    with pytest.raises(QuantizeError, match="runs on the CPU only, not on cuda:1.*bfloat16"):
        check_quantize("int8", "cuda:1")
    with pytest.raises(ValueError, match="runs on the CPU only"):  # a ValueError to callers
        ModelKey.of(".", device="cuda", quantize="int8")
    assert ModelKey.of(".").quantize == "none"
    assert ModelKey.of(".", quantize="int8") != ModelKey.of(".")  # never shares a float model


@needs_int8
def test_an_int8_layer_rounds_its_weights_per_tensor_and_keeps_the_product() -> None:
    """``W`` is stored as ``round(W / s)·s`` with ``s = max|W| / 127.5`` (symmetric, per tensor),
    and ``y = x·Wᵀ + b`` holds to ``Σ_i |x_i|·s/2 + Σ_i |Ŵ_i|·s_x/2`` (``s_x``: the input's scale,
    its range over 255 levels, at most over 127 when the range is halved)."""
    gen = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(48, 20)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(20, 48, generator=gen))
        layer.bias.copy_(torch.randn(20, generator=gen))
    weight = layer.weight.detach().clone()
    model = torch.nn.Sequential(layer)
    assert quantize_int8(model) == 1 and is_quantized(model)
    stored = model[0].weight()
    scale = float(weight.abs().max()) / 127.5
    assert stored.q_scale() == pytest.approx(scale, rel=1e-6)
    assert (stored.dequantize() - weight).abs().max() <= scale / 2 + 1e-6
    torch.testing.assert_close(
        stored.int_repr().float(), torch.round(weight / scale).clamp(-128, 127)
    )

    x = torch.randn(5, 48, generator=gen)
    with torch.inference_mode():
        got = model(x)
    want = x @ weight.T + layer.bias.detach()
    x_scale = float(x.max().clamp(min=0) - x.min().clamp(max=0)) / 127
    bound = (
        x.abs().sum(-1, keepdim=True) * scale / 2
        + stored.dequantize().abs().sum(-1) * x_scale / 2
        + 1e-4
    )
    assert ((got - want).abs() <= bound).all()
    assert (got - want).abs().max() > 0  # it is the int8 product, not the float one


@needs_int8
def test_int8_quantises_float32_on_a_cpu_and_refuses_other_dtypes_and_devices() -> None:
    model = tiny_llama()
    assert apply_quantize(model, "none", "cpu") == "none" and not is_quantized(model)
    with pytest.raises(QuantizeError, match="runs on the CPU only, not on cuda"):
        apply_quantize(model, "int8", "cuda")
    assert not is_quantized(model)
    assert apply_quantize(model, "int8", "cpu") == "int8" and is_quantized(model)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # all 2·7 + 1
    half = tiny_llama(torch.bfloat16)
    with pytest.raises(
        QuantizeError,
        match="cannot run: int8 products take float32 weights and this model's "
        "are bfloat16; use quantize=none",
    ):
        apply_quantize(half, "int8", "cpu")
    assert not is_quantized(half)


@needs_int8
def test_an_int8_model_gives_nearly_the_float_logits() -> None:
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(5))
    floats, ints = tiny_llama(), tiny_llama()
    apply_quantize(ints, "int8", "cpu")
    with torch.inference_mode():
        want, got = floats(input_ids=ids).logits, ints(input_ids=ids).logits
    assert not torch.equal(got, want)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cosine) > 0.99


@pytest.fixture(scope="module")
def gguf() -> Any:
    require_modules(HF_MODULES, HF_INSTALL)
    return require_gguf()


@pytest.mark.real_model
@needs_int8
def test_the_real_model_loads_int8_when_asked_and_still_decodes_legal_replies(gguf: Any) -> None:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from agents.llm.backends.hf_backend import HFBackend

    backend = HFBackend(gguf, max_new_tokens=40, quantize="int8", share_model=False)
    loaded = backend.loaded
    assert (loaded.key.quantize, loaded.quantize) == ("int8", "int8")
    modules = list(loaded.model.modules())
    layers = 30 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert sum(isinstance(m, DynamicLinear) for m in modules) == layers
    assert not [m for m in modules if isinstance(m, torch.nn.Linear)]
    assert load_uncached(ModelKey.of(gguf)).quantize == "none"  # the default

    schema = {
        "type": "object",
        "properties": {"action_type": {"enum": ["bid", "pass"]}, "price": {"type": "integer"}},
        "required": ["action_type", "price"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Bid for GPU blocks as JSON."}]
    replies = [backend.complete(messages, schema, {"max_tokens": 40}) for _ in range(2)]
    value = json.loads(replies[0].text)  # the grammar holds with int8 products too
    assert value["action_type"] in ("bid", "pass") and isinstance(value["price"], int)
    assert replies[1].text == replies[0].text  # greedy: the same tokens again


def test_a_bad_mode_in_a_spec_is_a_clear_error(tmp_path: Any) -> None:
    from agents.llm.backends.hf_backend import HFBackend

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="quantize='fp4' is not a mode"):
        HFBackend(model, quantize="fp4")


@pytest.mark.real_model
def test_a_bfloat16_gguf_load_is_unpacked_and_says_nothing_of_packed_weights(
    gguf: Any, tmp_path: Any
) -> None:
    """transformers notes that a GGUF's weights "stay packed" in bfloat16; without the kernels
    package it unpacks them (plain float layers), so the loader drops that wrong note."""
    import importlib.util
    import logging

    if importlib.util.find_spec("kernels") is not None:
        pytest.skip("the kernels package is installed: transformers may keep the weights packed")

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    kept = Kept()
    gguf_log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    gguf_log.addHandler(kept)
    try:
        loaded = load_uncached(ModelKey.of(gguf, dtype="bfloat16"), tmp_path)
    finally:
        gguf_log.removeHandler(kept)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert sum(isinstance(m, torch.nn.Linear) for m in loaded.model.modules()) == 30 * 7 + 1
    assert not [m for m in kept.messages if "weights packed" in m]
