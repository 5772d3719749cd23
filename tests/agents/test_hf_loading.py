"""Loading a local model (agents/llm/backends/hf_loading.py and gguf_files.py): once per process
under concurrency, true one-line errors, and the on-disk cache of a converted GGUF.

The unmarked tests use tiny GGUF files written here with the gguf package and a fake
transformers reader (``hf_loading.from_pretrained`` monkeypatched); the ``slow`` and
``real_model`` ones load the real SmolLM2-135M GGUF found by ``tests/real_model_utils.py``.
Every cache lives in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from real_model_utils import HF_INSTALL, HF_MODULES, require_gguf, require_modules

from agents.llm.backends import gguf_files, hf_loading
from agents.llm.backends.base import BackendError
from agents.llm.backends.hf_loading import (
    LoadedModel,
    ModelKey,
    ModelLoadError,
    clear_model_cache,
    load_model,
)

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    clear_model_cache()
    yield
    clear_model_cache()


@pytest.fixture
def hf_stack() -> None:
    require_modules(HF_MODULES, HF_INSTALL)


def write_gguf(path: Path, quant: str | None = None) -> Path:
    """A tiny GGUF (architecture llama): one F32 tensor, plus one of type ``quant`` if given."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    if quant is not None:
        qtype = GGMLQuantizationType[quant]
        _, type_size = GGML_QUANT_SIZES[qtype]
        raw = np.zeros((2, type_size), dtype=np.uint8)
        writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def one_line_error(info: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert isinstance(info.value, BackendError)
    return message


# --- fakes -----------------------------------------------------------------------------------


class FakeTokenizer:
    eos_token_id = 2

    def save_pretrained(self, folder: str) -> None:
        (Path(folder) / "tokenizer.json").write_text("{}")


class FakeModel:
    """Stands in for a transformers model: a config, a device move, ``save_pretrained``."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(vocab_size=11, max_position_embeddings=64)
        self.generation_config = SimpleNamespace(eos_token_id=[2, 5])
        self.device: Any = None
        self.saves = 0

    def to(self, device: Any) -> FakeModel:
        self.device = device
        return self

    def eval(self) -> FakeModel:
        return self

    def save_pretrained(self, folder: str) -> None:
        self.saves += 1
        time.sleep(0.02)  # a write that takes time, so concurrent writers overlap
        (Path(folder) / "model.safetensors").write_bytes(b"weights")


@pytest.fixture
def fake_reader(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Replace transformers' reading with fakes; returns the (source, gguf_file) of each read."""
    reads: list[tuple[str, str | None]] = []

    def read(source: str, gguf_file: str | None, key: ModelKey) -> tuple[Any, Any]:
        reads.append((source, gguf_file))
        return FakeTokenizer(), FakeModel()

    monkeypatch.setattr(hf_loading, "from_pretrained", read)
    return reads


def fake_loaded(key: ModelKey) -> LoadedModel:
    return LoadedModel(
        key=key,
        model=object(),
        tokenizer=object(),
        device="cpu",
        eos_ids=frozenset({2}),
        max_positions=64,
        vocab_size=11,
        load_seconds=0.0,
        converted_from_cache=False,
    )


class CountingLoader:
    """A slow fake for ``load_uncached``: counts loads and the most running at once."""

    def __init__(self, error: str | None = None) -> None:
        self.calls = 0
        self.running = 0
        self.most_running = 0
        self.error = error
        self.guard = threading.Lock()

    def __call__(self, key: ModelKey, cache_dir: Path | None = None) -> LoadedModel:
        with self.guard:
            self.calls += 1
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            time.sleep(0.2)
            if self.error:
                raise ModelLoadError(self.error)
            return fake_loaded(key)
        finally:
            with self.guard:
                self.running -= 1


KEY = ModelKey("/models/m", "m.gguf", "cpu", None, False)


def load_everywhere(
    key: ModelKey, threads: int = 8, loops: int = 2, per_loop: int = 3
) -> list[Any]:
    """``load_model(key)`` from ``threads`` threads and ``loops`` asyncio loops (each in its own
    thread, ``per_loop`` tasks each), all started together; returns every result or error."""
    results: list[Any] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + loops)

    def keep(value: Any) -> None:
        with lock:
            results.append(value)

    def call() -> Any:
        try:
            return load_model(key)
        except Exception as exc:
            return exc

    def in_thread() -> None:
        barrier.wait()
        keep(call())

    def in_loop() -> None:
        async def main() -> list[Any]:
            return list(await asyncio.gather(*(asyncio.to_thread(call) for _ in range(per_loop))))

        barrier.wait()
        for value in asyncio.run(main()):
            keep(value)

    workers = [threading.Thread(target=in_thread) for _ in range(threads)]
    workers += [threading.Thread(target=in_loop) for _ in range(loops)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert len(results) == threads + loops * per_loop
    return results


# --- once per process ------------------------------------------------------------------------


def test_concurrent_loads_from_threads_and_loops_load_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = CountingLoader()
    monkeypatch.setattr(hf_loading, "load_uncached", loader)
    results = load_everywhere(KEY)
    assert loader.calls == 1
    assert all(r is results[0] for r in results) and isinstance(results[0], LoadedModel)
    assert load_model(KEY) is results[0]  # later calls: the same object, no load
    assert loader.calls == 1
    assert clear_model_cache() == 1
    assert load_model(KEY) is not results[0] and loader.calls == 2


def test_loads_of_different_models_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """One lock serialises every load in the process (transformers' lazy imports are not
    thread-safe), even of different models."""
    loader = CountingLoader()
    monkeypatch.setattr(hf_loading, "load_uncached", loader)
    keys = [ModelKey(f"/models/{i}", None, "cpu", None, False) for i in range(4)]
    threads = [threading.Thread(target=load_model, args=(k,)) for k in keys for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.calls == 4 and loader.most_running == 1


def test_a_failed_load_is_remembered_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = CountingLoader(error="model file '/models/m/m.gguf' does not exist; check the path")
    monkeypatch.setattr(hf_loading, "load_uncached", loader)
    results = load_everywhere(KEY, threads=4, loops=1, per_loop=2)
    assert loader.calls == 1
    assert all(isinstance(r, ModelLoadError) for r in results)
    assert {str(r) for r in results} == {loader.error}
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(KEY)
    assert time.perf_counter() - start < 0.1 and loader.calls == 1  # no slow retry
    clear_model_cache()
    with pytest.raises(ModelLoadError):
        load_model(KEY)
    assert loader.calls == 2


def test_a_private_copy_is_loaded_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = CountingLoader()
    monkeypatch.setattr(hf_loading, "load_uncached", loader)
    shared = load_model(KEY)
    private = load_model(KEY, shared=False)
    assert private is not shared and loader.calls == 2
    assert load_model(KEY) is shared and loader.calls == 2
    assert load_model(KEY, shared=False) is not private and loader.calls == 3


def test_load_model_takes_a_key() -> None:
    with pytest.raises(TypeError, match="ModelKey"):
        load_model("/models/m.gguf")  # type: ignore[arg-type]


# --- true errors -----------------------------------------------------------------------------


def test_a_missing_extra_names_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    gone = {"transformers", "xgrammar"}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in gone else real_find_spec(name, *a),
    )
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")  # never read: the missing packages are found first
    key = ModelKey.of(model)
    with pytest.raises(ModelLoadError) as info:
        load_model(key, cache_dir=tmp_path / "cache")
    message = one_line_error(info)
    assert message.startswith("missing transformers, xgrammar:")
    assert "pip install 'gpumarket[hf]'" in message and "torch==2.13.0" in message
    with pytest.raises(ModuleNotFoundError, match="missing transformers, xgrammar"):
        hf_loading.require_hf_extra(gguf=True)


def test_another_import_error_is_reported_as_itself(
    tmp_path: Path, hf_stack: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bug of issue 16: an ImportError from a broken (e.g. concurrent) import was reported
    as a missing [hf] extra. With every package present it is reported as what it is."""

    def broken(source: str, gguf_file: str | None, key: ModelKey) -> tuple[Any, Any]:
        raise ImportError("cannot import name 'LlamaForCausalLM' (partially initialized module)")

    monkeypatch.setattr(hf_loading, "from_pretrained", broken)
    key = ModelKey.of(write_gguf(tmp_path / "m.gguf"))
    with pytest.raises(ModelLoadError) as info:
        load_model(key, cache_dir=tmp_path / "cache")
    message = one_line_error(info)
    assert "ImportError: cannot import name 'LlamaForCausalLM'" in message
    assert "pip install" not in message and "[hf] extra" not in message
    assert str(tmp_path / "m.gguf") in message


def test_a_missing_file_or_folder(tmp_path: Path, hf_stack: None) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        ModelKey.of(tmp_path / "missing.gguf")
    gone = ModelKey(str(tmp_path), "deleted.gguf", "cpu", None, False)  # deleted after keying
    with pytest.raises(ModelLoadError) as info:
        load_model(gone, cache_dir=tmp_path / "cache")
    assert "deleted.gguf' does not exist" in one_line_error(info)
    folder = ModelKey(str(tmp_path / "nofolder"), None, "cpu", None, False)
    with pytest.raises(ModelLoadError) as info:
        load_model(folder, cache_dir=tmp_path / "cache")
    assert "model folder" in one_line_error(info) and "nofolder" in str(info.value)


def test_an_unsupported_quantisation_is_named(tmp_path: Path, hf_stack: None) -> None:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    key = ModelKey.of(write_gguf(tmp_path / "q8k.gguf", quant="Q8_K"))
    with pytest.raises(ModelLoadError) as info:
        load_model(key, cache_dir=tmp_path / "cache")
    message = one_line_error(info)
    assert "Q8_K (1 tensors)" in message and "supported: F32, F16, Q4_0" in message
    assert "Q4_K" in message and "Q8_0" in message
    # the claim is true: the dequantiser transformers calls cannot read Q8_K, but reads Q4_K
    with pytest.raises(NotImplementedError):
        q8k = GGMLQuantizationType.Q8_K
        dequantize(np.zeros(GGML_QUANT_SIZES[q8k][1], np.uint8), q8k)
    assert "Q8_K" not in gguf_files.supported_gguf_types()
    assert {"Q4_1", "Q8_0", "Q4_K", "Q6_K", "F32"} <= set(gguf_files.supported_gguf_types())


def test_not_a_gguf_file(tmp_path: Path, hf_stack: None) -> None:
    text = tmp_path / "x.gguf"
    text.write_text("this is not a model\n")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(write_gguf(tmp_path / "whole.gguf").read_bytes()[:40])
    for bad in (text, cut):
        with pytest.raises(ModelLoadError) as info:
            load_model(ModelKey.of(bad), cache_dir=tmp_path / "cache")
        message = one_line_error(info)
        assert f"{bad} is not a readable GGUF file" in message and "GGUF format" in message


def test_a_device_that_is_not_there(tmp_path: Path, hf_stack: None) -> None:
    import torch

    model = write_gguf(tmp_path / "m.gguf")
    absent = "cuda:99" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelKey.of(model, device=absent), cache_dir=tmp_path / "cache")
    message = one_line_error(info)
    assert f"device '{absent}' is not available" in message and "cpu" in message
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelKey.of(model, device="gpu0"), cache_dir=tmp_path / "cache")
    assert "device 'gpu0' is not a torch device" in one_line_error(info)
    with pytest.raises(ModelLoadError) as info:
        load_model(ModelKey.of(model, dtype="float33"), cache_dir=tmp_path / "cache")
    assert "dtype 'float33' is not a torch dtype" in one_line_error(info)


# --- the conversion cache (fake reader) ------------------------------------------------------


def test_the_conversion_is_cached_and_read_back(
    tmp_path: Path, hf_stack: None, fake_reader: list[tuple[str, str | None]]
) -> None:
    model = write_gguf(tmp_path / "m.gguf")
    cache = tmp_path / "cache"
    key = ModelKey.of(model)
    first = load_model(key, cache_dir=cache)
    digest = gguf_files.file_digest(model)
    folder = cache / "hf" / f"{digest}-auto"
    assert fake_reader == [(str(tmp_path.resolve()), "m.gguf")]
    assert not first.converted_from_cache and first.cache_path == folder and first.notes == ()
    assert sorted(p.name for p in folder.iterdir()) == [
        gguf_files.MARKER,
        "model.safetensors",
        "tokenizer.json",
    ]
    assert json.loads((folder / gguf_files.MARKER).read_text())["gguf"] == str(model.resolve())
    # no temporary left; the digest is remembered for the next process
    assert sorted(p.name for p in (cache / "hf").iterdir()) == [folder.name, "digests.json"]
    assert first.eos_ids == frozenset({2, 5}) and first.vocab_size == 11
    assert first.max_positions == 64 and str(first.device) == "cpu"
    clear_model_cache()
    second = load_model(key, cache_dir=cache)
    assert second.converted_from_cache and second.cache_path == folder
    assert fake_reader[1] == (str(folder), None)  # read from the cache, not the GGUF
    # another dtype is another conversion; the digest is the file's contents
    load_model(ModelKey.of(model, dtype="bfloat16"), cache_dir=cache)
    assert (cache / "hf" / f"{digest}-bfloat16" / gguf_files.MARKER).is_file()
    import hashlib

    assert digest == hashlib.sha256(model.read_bytes()).hexdigest()[:16]


def test_the_digest_is_remembered_on_disk(
    tmp_path: Path, hf_stack: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later process reads a large GGUF's digest from ``digests.json`` instead of hashing the
    file again; a changed file (size or time) is hashed again."""
    import hashlib

    model = write_gguf(tmp_path / "m.gguf")
    memo = tmp_path / "hf"
    first = gguf_files.file_digest(model, memo_dir=memo)
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()[:16]
    table = json.loads((memo / "digests.json").read_text())
    assert list(table.values()) == [first]
    (memo / "digests.json").write_text(json.dumps({k: "feedfacefeedface" for k in table}))
    monkeypatch.setattr(gguf_files, "_DIGESTS", {})  # as in a fresh process
    assert gguf_files.file_digest(model, memo_dir=memo) == "feedfacefeedface"
    model.write_bytes(model.read_bytes() + b"more")  # another file now
    assert (
        gguf_files.file_digest(model, memo_dir=memo)
        == (hashlib.sha256(model.read_bytes()).hexdigest()[:16])
    )
    assert len(json.loads((memo / "digests.json").read_text())) == 2


def test_the_cache_can_be_turned_off(
    tmp_path: Path,
    hf_stack: None,
    fake_reader: list[tuple[str, str | None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUMARKET_HF_CACHE", "0")
    loaded = load_model(ModelKey.of(write_gguf(tmp_path / "m.gguf")), cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists() and loaded.cache_path is None and loaded.notes == ()


def test_no_home_folder_means_no_cache(
    tmp_path: Path,
    hf_stack: None,
    fake_reader: list[tuple[str, str | None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("GPUMARKET_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", no_home)
    loaded = load_model(ModelKey.of(write_gguf(tmp_path / "m.gguf")))
    assert loaded.model is not None and loaded.cache_path is None
    assert fake_reader == [(str(tmp_path.resolve()), "m.gguf")]


def test_an_unwritable_cache_is_a_warning_once(
    tmp_path: Path,
    hf_stack: None,
    fake_reader: list[tuple[str, str | None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder should be")
    model = write_gguf(tmp_path / "m.gguf")
    with caplog.at_level(logging.WARNING):
        first = load_model(ModelKey.of(model), cache_dir=blocker)
        second = load_model(ModelKey.of(model), cache_dir=blocker, shared=False)
    assert first.model is not None and second.model is not None  # the loads still work
    assert len(first.notes) == 1 and first.cache_path is None
    assert "cannot write the GGUF conversion cache" in first.notes[0]
    assert "GPUMARKET_CACHE_DIR" in first.notes[0] and "\n" not in first.notes[0]
    warnings = [r for r in caplog.records if "conversion cache" in r.getMessage()]
    assert len(warnings) == 1  # logged once, though it failed twice
    assert second.notes == first.notes


def test_a_folder_without_its_marker_is_never_used(
    tmp_path: Path, hf_stack: None, fake_reader: list[tuple[str, str | None]]
) -> None:
    model = write_gguf(tmp_path / "m.gguf")
    folder = tmp_path / "cache" / "hf" / f"{gguf_files.file_digest(model)}-auto"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"half written")
    loaded = load_model(ModelKey.of(model), cache_dir=tmp_path / "cache")
    assert not loaded.converted_from_cache and fake_reader[0][1] == "m.gguf"
    assert (folder / gguf_files.MARKER).is_file()  # replaced by a complete conversion
    assert (folder / "model.safetensors").read_bytes() == b"weights"


def test_concurrent_writers_leave_one_complete_folder(tmp_path: Path) -> None:
    """Several writers (processes or threads) converting at once: one folder, complete, and no
    temporary folder left behind."""
    target = tmp_path / "hf" / "abc-auto"
    models = [FakeModel() for _ in range(6)]
    barrier = threading.Barrier(len(models))
    notes: list[str | None] = []

    def write(model: FakeModel) -> None:
        barrier.wait()
        notes.append(gguf_files.save_conversion(model, FakeTokenizer(), target, {"n": 1}))

    threads = [threading.Thread(target=write, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert notes == [None] * len(models) and all(m.saves == 1 for m in models)
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["abc-auto"]
    assert sorted(p.name for p in target.iterdir()) == [
        gguf_files.MARKER,
        "model.safetensors",
        "tokenizer.json",
    ]


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert os.environ.get("GPUMARKET_CACHE_DIR")  # conftest: never the user's ~/.cache in tests
    monkeypatch.delenv("GPUMARKET_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert hf_loading.default_cache_dir() == Path.home() / ".cache" / "gpumarket"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_loading.default_cache_dir() == tmp_path / "xdg" / "gpumarket"
    monkeypatch.setenv("GPUMARKET_CACHE_DIR", str(tmp_path / "mine"))
    assert hf_loading.default_cache_dir() == tmp_path / "mine"


def test_imports_without_torch() -> None:
    """Importing the loading modules never imports torch, transformers or gguf."""
    code = (
        "import sys, agents.llm.backends.hf_loading; "
        "assert not {'torch', 'transformers', 'gguf'} & set(sys.modules), 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2 loaded cold from its GGUF (the conversion written to a fresh cache), then again
    from the cache; the two loads with their times."""
    require_modules(HF_MODULES, HF_INSTALL)
    gguf = require_gguf()
    cache = tmp_path_factory.mktemp("hf_cache")
    key = ModelKey.of(gguf)
    clear_model_cache()
    cold = load_model(key, cache_dir=cache)
    clear_model_cache()
    warm = load_model(key, cache_dir=cache)
    clear_model_cache()
    return {"gguf": gguf, "cache": cache, "key": key, "cold": cold, "warm": warm}


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_cached_conversion_gives_the_same_logits(
    real: dict[str, Any], record_property: Any
) -> None:
    import torch

    cold, warm = real["cold"], real["warm"]
    assert not cold.converted_from_cache and warm.converted_from_cache
    assert cold.cache_path == warm.cache_path and (cold.cache_path / gguf_files.MARKER).is_file()
    assert cold.notes == () and warm.notes == ()
    assert list(cold.cache_path.glob("*.safetensors"))
    prompt = 'Reply with the JSON object {"action_type": "wait"}.'
    text = cold.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    assert text == warm.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    ids = cold.tokenizer(text, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, warm.tokenizer(text, return_tensors="pt")["input_ids"])
    with torch.inference_mode():
        assert torch.equal(cold.model(ids).logits, warm.model(ids).logits)
    assert cold.eos_ids == warm.eos_ids and cold.eos_ids
    assert cold.vocab_size == warm.vocab_size == 49152
    assert cold.max_positions == warm.max_positions == 8192
    assert warm.load_seconds < cold.load_seconds
    record_property(
        "load_seconds", {"gguf": round(cold.load_seconds, 2), "cache": round(warm.load_seconds, 2)}
    )


CONCURRENT = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from pathlib import Path
    from agents.llm.backends import hf_loading

    # two keys (trust_remote_code differs): two loads, both read the same cached conversion
    keys = [hf_loading.ModelKey.of(sys.argv[1], trust_remote_code=t) for t in (False, True)]
    cache = Path(sys.argv[2])
    inner = hf_loading.load_uncached
    calls = []
    def counted(k, cache_dir=None):
        calls.append(k)
        return inner(k, cache_dir)
    hf_loading.load_uncached = counted
    barrier = threading.Barrier(10)
    got = []
    def call(i):
        try:
            return hf_loading.load_model(keys[i % 2], cache_dir=cache)
        except Exception as exc:
            return exc
    def in_thread(i):
        barrier.wait()
        got.append(call(i))
    def in_loop():
        async def main():
            return await asyncio.gather(*(asyncio.to_thread(call, i) for i in range(4)))
        barrier.wait()
        got.extend(asyncio.run(main()))
    threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=in_loop) for _ in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    errors = sorted({f"{type(g).__name__}: {g}" for g in got if isinstance(g, Exception)})
    models = [g for g in got if not isinstance(g, Exception)]
    print(json.dumps({"calls": len(calls), "results": len(got), "errors": errors,
                      "distinct": len({id(g) for g in models}),
                      "from_cache": sorted({g.converted_from_cache for g in models})}))
    """
)


@pytest.mark.slow
@pytest.mark.real_model
def test_real_model_concurrent_first_loads_in_a_fresh_process(real: dict[str, Any]) -> None:
    """8 threads and 2 asyncio loops load two keys of the real model at once in a fresh
    interpreter, where transformers' lazy imports happen (unserialised, two such loads failed
    with a false "needs the [hf] extra"): one load per key, one object per key, no error."""
    done = subprocess.run(
        [sys.executable, "-c", CONCURRENT, str(real["gguf"]), str(real["cache"])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {
        "calls": 2,
        "results": 16,
        "errors": [],
        "distinct": 2,
        "from_cache": [True],
    }
