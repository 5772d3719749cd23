"""Loading a local transformers model: once per process, safely, with a GGUF conversion cache.

:func:`load_model` turns a :class:`ModelKey` (where the model is, which device and dtype) into a
:class:`LoadedModel` (the model, its tokenizer and what decoding needs to know about them).

**Once per process.** Loads are serialised by one process-wide lock: transformers imports its
model and tokenizer classes lazily, and two threads importing them at the same time can see a
half-initialised module (an ``ImportError`` that is not a missing package). With ``shared``
(the default) the first load of a key is kept: every later call, from any thread, asyncio loop
or episode, returns the same object without waiting for the lock. Code that imports transformers
lazily elsewhere (e.g. while decoding) should hold :data:`LOAD_LOCK` for the import too. A failed load is remembered
too: the same key raises the same :class:`ModelLoadError` at once until
:func:`clear_model_cache`. ``shared=False`` loads a private copy (still under the lock).

**True errors.** Every failure is a :class:`ModelLoadError` whose one-line message says what is
wrong and how to fix it: a missing file or folder, a missing package of the ``[hf]`` extra
(only when :func:`importlib.util.find_spec` says it is absent; any other ``ImportError`` is
reported as itself), a file that is not a GGUF, GGUF tensor types that cannot be dequantised
(read from the file before loading), an unknown dtype, a device torch cannot use.

**The conversion cache.** Loading a ``.gguf`` converts its tokenizer and dequantises its tensors
(about 28 s for SmolLM2-135M on two CPU cores). After the first conversion the model and
tokenizer are saved (safetensors) under ``cache_dir/hf/<sha256 of the file, 16 hex>-<dtype or
auto>``; later loads, in any process, read that folder instead (well under a second). The folder
is written under a temporary name and renamed into place, so two processes converting at once
never corrupt it and a half-written folder is never read; it is used only when its marker file
(:data:`MARKER`, written last) is there. A cache that cannot be written or read is a warning,
logged once per folder and kept in :attr:`LoadedModel.notes`; the load itself still works.
``cache_dir`` defaults to :func:`default_cache_dir`; ``GPUMARKET_HF_CACHE=0`` turns the cache off.

torch, transformers and gguf are imported inside the functions that use them, so importing this
module (and ``agents``) costs nothing without the ``[hf]`` extra.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.llm.backends.gguf_files import (
    CACHE_DIR_ENV,
    MARKER,
    ModelLoadError,
    check_gguf,
    conversion_dir,
    default_cache_dir,
    discard_conversion,
    error_reason,
    hf_cache_enabled,
    one_line,
    save_conversion,
    warn_once,
)
from agents.llm.backends.hf_quantize import QuantizeError, apply_quantize, check_quantize

log = logging.getLogger(__name__)

TORCH_PIN = "torch==2.13.0"
INSTALL_HINT = (
    f"the in-process HF backend needs the [hf] extra: pip install '{TORCH_PIN}' first (the CPU "
    "build), then pip install 'gpumarket[hf]'"
)
#: the packages of the ``[hf]`` extra a local model needs (gguf only for a ``.gguf`` file)
REQUIRED_MODULES: tuple[str, ...] = ("torch", "transformers", "xgrammar")
GGUF_HINT = "loading a .gguf file also needs the gguf package (pip install 'gpumarket[hf]')"


@dataclass(frozen=True)
class ModelKey:
    """What identifies a loaded model in this process.

    ``source`` is a model folder or a Hub id (with ``gguf_file`` the name of a ``.gguf`` file in
    that folder), as :func:`resolve_model_path` returns them; ``dtype`` a torch dtype name
    (``"float32"``, ``"bfloat16"``), ``"auto"`` or None (the checkpoint's; float32 for a
    dequantised GGUF). :meth:`of` builds a key from a user's path and options.
    """

    source: str
    gguf_file: str | None
    device: str
    dtype: str | None
    trust_remote_code: bool
    quantize: str = "none"  # "none" or "int8" (hf_quantize)
    adapter: str | None = None  # a PEFT LoRA adapter folder, merged into the weights on load

    @classmethod
    def of(
        cls,
        path: str | Path,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: Any = None,
        trust_remote_code: bool = False,
        quantize: str | None = None,
        adapter: str | Path | None = None,
    ) -> ModelKey:
        """The key of a model folder, ``.gguf`` path or Hub id (raises ``ValueError`` if the
        path does not exist, ``quantize`` is not a mode for ``device`` or ``adapter`` is not a
        PEFT adapter folder); ``dtype`` may be a ``torch.dtype`` or its name."""
        source, gguf = resolve_model_path(path, gguf_file)
        name = None if dtype is None else str(dtype).removeprefix("torch.")
        mode = check_quantize(quantize, str(device))
        folder = None if adapter in (None, "") else resolve_adapter(adapter)
        return cls(source, gguf, str(device), name, bool(trust_remote_code), mode, folder)

    def where(self) -> str:
        """The model's location as the user gave it, for messages."""
        return str(Path(self.source) / self.gguf_file) if self.gguf_file else self.source


@dataclass(eq=False)  # compared by identity: one object per loaded model
class LoadedModel:
    """A loaded model with its tokenizer and what decoding needs to know about them.

    ``eos_ids``: the tokens that end a reply (the tokenizer's and the generation config's).
    ``max_positions``: the context length (None when the config has none). ``vocab_size``: the
    width of the logits. ``converted_from_cache``: the weights came from a cached conversion of
    the GGUF, not the GGUF itself. ``cache_path``: that conversion's folder (None: no cache).
    ``notes``: what did not go as asked (e.g. a cache that could not be written), one sentence
    each. ``quantize``: ``"int8"`` when the linear layers run as int8 products (``hf_quantize``).
    ``state`` is a free slot for the decoding engine, guarded by ``state_lock``.
    """

    key: ModelKey
    model: Any
    tokenizer: Any
    device: Any
    eos_ids: frozenset[int]
    max_positions: int | None
    vocab_size: int
    load_seconds: float
    converted_from_cache: bool
    state: dict[str, Any] = field(default_factory=dict)
    state_lock: threading.Lock = field(default_factory=threading.Lock)
    cache_path: Path | None = None
    notes: tuple[str, ...] = ()
    quantize: str = "none"  # how the weights run: "none" or "int8" (see hf_quantize)


# --- the [hf] extra and model paths ----------------------------------------------------------


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """The names among ``names`` that ``importlib.util.find_spec`` cannot find (never imports)."""
    missing = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def required_modules(gguf: bool = False) -> tuple[str, ...]:
    return REQUIRED_MODULES + (("gguf",) if gguf else ())


def missing_extra_message(missing: list[str]) -> str:
    hint = f"{INSTALL_HINT}; {GGUF_HINT}" if missing == ["gguf"] else INSTALL_HINT
    return f"missing {', '.join(missing)}: {hint}"


def require_hf_extra(gguf: bool = False) -> None:
    """Raise ``ModuleNotFoundError`` with the install line when the [hf] extra is missing."""
    missing = missing_modules(required_modules(gguf))
    if missing:
        raise ModuleNotFoundError(missing_extra_message(missing), name=missing[0])


def resolve_model_path(path: str | Path, gguf_file: str | None = None) -> tuple[str, str | None]:
    """``(directory or Hub id, gguf file name or None)`` from a directory, .gguf path or Hub id."""
    p = Path(path).expanduser()
    if p.is_file():
        if gguf_file is not None and gguf_file != p.name:
            raise ValueError(f"path {str(p)!r} is a file but gguf_file={gguf_file!r} is another")
        if p.suffix.lower() != ".gguf":
            raise ValueError(
                f"path {str(p)!r} is a file but not a .gguf; pass a model directory or a .gguf file"
            )
        return str(p.parent.resolve()), p.name
    if p.is_dir():
        if gguf_file is not None and not (p / gguf_file).is_file():
            raise ValueError(f"gguf_file {gguf_file!r} is not in {str(p)!r}")
        return str(p.resolve()), gguf_file
    if str(path).lower().endswith(".gguf") or p.is_absolute() or str(path).startswith((".", "~")):
        raise ValueError(f"model path {str(path)!r} does not exist")
    return str(path), gguf_file  # a Hub model id: loads from the local cache or the Hub


#: the file a PEFT adapter folder always holds
ADAPTER_CONFIG = "adapter_config.json"
PEFT_HINT = "a LoRA adapter needs the peft package: pip install peft (or 'gpumarket[train]')"


def resolve_adapter(adapter: str | Path) -> str:
    """The absolute path of a PEFT adapter folder (one holding ``adapter_config.json``; a
    ``gpumarket train-llm`` run folder is taken for its ``adapter/``); ``ValueError`` else."""
    p = Path(adapter).expanduser()
    if (
        p.is_dir()
        and not (p / ADAPTER_CONFIG).is_file()
        and (p / "adapter" / ADAPTER_CONFIG).is_file()
    ):
        p = p / "adapter"  # a train-llm run folder
    if not p.exists():
        raise ValueError(f"adapter {str(adapter)!r} does not exist; give a PEFT adapter folder")
    if not (p.is_dir() and (p / ADAPTER_CONFIG).is_file()):
        raise ValueError(
            f"adapter {str(adapter)!r} is not a PEFT adapter folder (no {ADAPTER_CONFIG} in it)"
        )
    return str(p.resolve())


def apply_adapter(model: Any, adapter: str) -> Any:
    """``model`` with the LoRA adapter in ``adapter`` merged into its weights (decoding then
    costs what the base model costs). :class:`ModelLoadError` when peft is missing or the
    adapter was trained on another model."""
    if missing_modules(("peft",)):
        raise ModelLoadError(f"missing peft: {PEFT_HINT}")
    from peft import PeftModel

    try:
        merged = PeftModel.from_pretrained(model, adapter, is_trainable=False).merge_and_unload()
    except Exception as exc:
        raise ModelLoadError(
            one_line(
                f"cannot apply the adapter {adapter} ({error_reason(exc)}); was it trained on "
                "this base model?"
            )
        ) from None
    return merged


def check_device(name: str) -> Any:
    """The ``torch.device`` of ``name``; :class:`ModelLoadError` naming the device when torch
    cannot parse it or it is not available on this machine."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"device {name!r} is not a torch device ({one_line(str(exc), 200)}); use cpu, "
            "cuda, cuda:N or mps"
        ) from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                f"this torch build ({torch.__version__}) has no CUDA support"
                if torch.version.cuda is None
                else "torch sees no CUDA GPU (check the driver and CUDA_VISIBLE_DEVICES)"
            )
            raise ModelLoadError(
                f"device {name!r} is not available: {why}; use device=cpu, or a CUDA build of "
                "torch on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ModelLoadError(
                f"device {name!r} is not available: torch sees {count} CUDA GPU(s), "
                f"cuda:0 to cuda:{count - 1}; pick one of those"
            )
        return device
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(
            f"device {name!r} is not available: this machine or torch build has no MPS "
            "(Apple GPU) support; use device=cpu"
        )
    try:
        torch.empty(1, device=device)
    except Exception as exc:
        raise ModelLoadError(
            f"device {name!r} is not available ({error_reason(exc)}); use device=cpu or cuda"
        ) from None
    return device


def torch_dtype(name: str | None) -> Any:
    """None, ``"auto"`` or the ``torch.dtype`` called ``name``; :class:`ModelLoadError` else."""
    import torch

    if name is None or name == "auto":
        return name
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ModelLoadError(
            f"dtype {name!r} is not a torch dtype; use float32, bfloat16, float16 or auto"
        )
    return value


# --- loading ---------------------------------------------------------------------------------


class _NoPackedWeightsNote(logging.Filter):
    """Drops transformers' note that a GGUF's weights "stay packed" in a dtype other than
    float32: without the ``kernels`` package (and its Hub kernel) transformers unpacks every
    weight into the asked dtype, so the note is wrong and would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "weights packed is fastest" not in record.getMessage()


def from_pretrained(source: str, gguf_file: str | None, key: ModelKey) -> tuple[Any, Any]:
    """``(tokenizer, model)`` read by transformers from a folder, Hub id or GGUF (on the CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": key.trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    if key.dtype is not None:
        kwargs["dtype"] = torch_dtype(key.dtype)
    quiet = _NoPackedWeightsNote()
    gguf_log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    unpacked = gguf_file and importlib.util.find_spec("kernels") is None
    if unpacked:
        gguf_log.addFilter(quiet)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    finally:
        gguf_log.removeFilter(quiet)
    return tokenizer, model


def _eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    eos: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (getattr(tokenizer, "eos_token_id", None), config_eos):
        if isinstance(value, int):
            eos.add(value)
        elif isinstance(value, list | tuple):
            eos.update(int(v) for v in value)
    return frozenset(eos)


def _vocab_size(model: Any) -> int:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    if size is None:
        size = model.get_output_embeddings().weight.shape[0]
    return int(size)


def _read_gguf(
    key: ModelKey, cache_dir: Path | None
) -> tuple[Any, Any, bool, Path | None, list[str]]:
    """Tokenizer and model of a GGUF: from its cached conversion when there is one, else
    converted (and cached). Returns them with (from cache?, cache folder, notes)."""
    path = Path(key.source) / str(key.gguf_file)
    if not path.is_file():
        raise ModelLoadError(f"model file {str(path)!r} does not exist; check the path")
    notes: list[str] = []
    target = None
    if cache_dir is not None and hf_cache_enabled():
        try:
            target = conversion_dir(cache_dir, path, key.dtype)
        except OSError as exc:
            raise ModelLoadError(f"cannot read {path} ({error_reason(exc)})") from None
        if (target / MARKER).is_file():
            try:
                tokenizer, model = from_pretrained(str(target), None, key)
                return tokenizer, model, True, target, notes
            except ImportError:
                raise
            except Exception as exc:
                note = f"the cached conversion {target} could not be read ({error_reason(exc)}); converted the GGUF again"
                warn_once(target, note)
                notes.append(note)
                discard_conversion(target)
    check_gguf(path)
    tokenizer, model = from_pretrained(key.source, key.gguf_file, key)
    if target is not None:
        meta = {
            "gguf": str(path),
            "folder": target.name,
            "dtype": key.dtype,
            "transformers": importlib.metadata.version("transformers"),
        }
        failure = save_conversion(model, tokenizer, target, meta)
        if failure:
            notes.append(failure)
            target = None
        else:
            log.info("cached the conversion of %s in %s", path, target)
    return tokenizer, model, False, target, notes


def load_uncached(key: ModelKey, cache_dir: Path | None = None) -> LoadedModel:
    """Load ``key`` now, without the process's registry or lock (:func:`load_model` adds them).

    Every failure is a :class:`ModelLoadError` with a one-line message."""
    start = time.perf_counter()
    missing = missing_modules(required_modules(key.gguf_file is not None))
    if missing:
        raise ModelLoadError(missing_extra_message(missing))
    if not key.gguf_file and Path(key.source).is_absolute() and not Path(key.source).is_dir():
        raise ModelLoadError(f"model folder {key.source!r} does not exist; check the path")
    error: str | None = None
    try:
        device = check_device(key.device)
        torch_dtype(key.dtype)
        if key.gguf_file:
            tokenizer, model, cached, folder, notes = _read_gguf(key, cache_dir)
        else:
            tokenizer, model = from_pretrained(key.source, None, key)
            cached, folder, notes = False, None, []
        if key.adapter:
            model = apply_adapter(model, key.adapter)
        model.to(device)
        model.eval()
        quantize = apply_quantize(model, key.quantize, key.device)
        max_positions = getattr(model.config, "max_position_embeddings", None)
        return LoadedModel(
            key=key,
            model=model,
            tokenizer=tokenizer,
            device=device,
            eos_ids=_eos_ids(tokenizer, model),
            max_positions=int(max_positions) if max_positions else None,
            vocab_size=_vocab_size(model),
            load_seconds=time.perf_counter() - start,
            converted_from_cache=cached,
            cache_path=folder,
            notes=tuple(notes),
            quantize=quantize,
        )
    except ModelLoadError:
        raise
    except QuantizeError as exc:
        error = str(exc)
    except ImportError as exc:  # a package really missing, or an import that broke
        missing = missing_modules(required_modules(key.gguf_file is not None))
        error = (
            missing_extra_message(missing)
            if missing
            else f"cannot load {key.where()}: {error_reason(exc)}"
        )
    except Exception as exc:  # mapped outside the handler, so no chained traceback
        error = f"cannot load {key.where()}: {error_reason(exc)}"
    raise ModelLoadError(one_line(error))


# --- the process's registry ------------------------------------------------------------------

#: serialises every load in the process; hold it too while importing transformers lazily
#: elsewhere (its lazy imports are not thread-safe)
LOAD_LOCK = threading.Lock()
_REGISTRY_LOCK = threading.Lock()  # guards the two tables (held only briefly)
_MODELS: dict[ModelKey, LoadedModel] = {}
_FAILURES: dict[ModelKey, str] = {}
_LOADED_ANY = threading.Event()  # set once a load began in this process (see models_loaded)


def models_loaded() -> bool:
    """Whether this process began loading a model (shared or not): torch's, xgrammar's and the
    engine's threads may then be running at exit (``market.cli.local_exit``)."""
    return _LOADED_ANY.is_set()


def _lookup(key: ModelKey, shared: bool) -> LoadedModel | None:
    with _REGISTRY_LOCK:
        failure = _FAILURES.get(key)
        loaded = _MODELS.get(key) if shared else None
    if failure is not None:
        raise ModelLoadError(failure)
    return loaded


def load_model(key: ModelKey, *, shared: bool = True, cache_dir: Path | None = None) -> LoadedModel:
    """The loaded model of ``key``: loaded once per process and shared (see the module
    docstring); ``shared=False`` loads a private copy. ``cache_dir`` (default
    :func:`default_cache_dir`) holds the GGUF conversion cache. Raises :class:`ModelLoadError`,
    also for a key whose load failed before (until :func:`clear_model_cache`)."""
    if not isinstance(key, ModelKey):
        raise TypeError(f"load_model takes a ModelKey (ModelKey.of(path, ...)), got {key!r}")
    loaded = _lookup(key, shared)
    if loaded is not None:
        return loaded
    with LOAD_LOCK:
        loaded = _lookup(key, shared)  # another thread may have loaded it while we waited
        if loaded is not None:
            return loaded
        try:
            folder: Path | None = default_cache_dir() if cache_dir is None else Path(cache_dir)
        except RuntimeError as exc:  # no home folder to put ~/.cache in
            folder = None
            warn_once(
                Path("~"), f"no GGUF conversion cache ({error_reason(exc)}); set {CACHE_DIR_ENV}"
            )
        _LOADED_ANY.set()  # from here torch (and then the engine's threads) may be running
        try:
            loaded = load_uncached(key, folder)
        except ModelLoadError as exc:
            with _REGISTRY_LOCK:
                _FAILURES[key] = str(exc)
            raise
        if shared:
            with _REGISTRY_LOCK:
                _MODELS[key] = loaded
        return loaded


def clear_model_cache() -> int:
    """Forget the shared models (freed once nobody holds them) and the remembered failures;
    returns how many models were dropped. The on-disk conversion cache is kept."""
    with _REGISTRY_LOCK:
        n = len(_MODELS)
        _MODELS.clear()
        _FAILURES.clear()
    return n
