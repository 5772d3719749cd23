"""GGUF files for the in-process HF backend: the checks made before loading one, and the
on-disk cache of their conversions to transformers' format.

:func:`check_gguf` reads the file's header with the gguf package (no tensor data): a file that is
not a GGUF, or holds tensor types the gguf package cannot dequantise (what transformers uses to
read a GGUF), raises :class:`ModelLoadError` naming the types and the supported ones.

:func:`save_conversion` writes a converted model and tokenizer (``save_pretrained``,
safetensors) as ``cache_dir/hf/<sha256 of the GGUF, 16 hex>-<dtype or auto>``
(:func:`conversion_dir`): into a temporary sibling folder, the marker file :data:`MARKER` last,
then renamed into place, so a reader sees no folder or a complete one and two processes
converting at once never corrupt it (the first rename wins; the other copy is deleted). A cache
that cannot be written is a warning, logged once per folder, never an error. ``cache_dir``
defaults to :func:`default_cache_dir`; ``GPUMARKET_HF_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from agents.llm.backends.base import BackendError

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "GPUMARKET_CACHE_DIR"
HF_CACHE_ENV = "GPUMARKET_HF_CACHE"
#: written last into a conversion folder: the folder is complete only when it holds this file
MARKER = "gpumarket-conversion.json"
STALE_TEMP_S = 6 * 3600.0  # temporary folders older than this were left by a killed process
_OFF = ("0", "false", "no", "off")


class ModelLoadError(BackendError):
    """A local model could not be loaded; the one-line message says why and what to do."""


def one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_reason(exc: BaseException) -> str:
    """``"TypeName: message"`` of an exception, on one line."""
    return f"{type(exc).__name__}: {one_line(str(exc), 300)}"


# --- the conversion cache --------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$GPUMARKET_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpumarket``, else ``~/.cache/gpumarket``."""
    explicit = os.environ.get(CACHE_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "gpumarket"


def hf_cache_enabled() -> bool:
    """False when ``GPUMARKET_HF_CACHE`` is ``0`` (or ``false``/``no``/``off``)."""
    return os.environ.get(HF_CACHE_ENV, "1").strip().lower() not in _OFF


_DIGESTS: dict[str, str] = {}
DIGESTS_FILE = "digests.json"


def file_digest(path: Path, memo_dir: Path | None = None) -> str:
    """The first 16 hex digits of the sha256 of the file's contents.

    Remembered for the same path, size and modification time: in this process, and in
    ``memo_dir/digests.json`` when given (so a later process does not read a large file again;
    a memo that cannot be read or written is skipped: the digest is computed)."""
    stat = path.stat()
    memo = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    if memo in _DIGESTS:
        return _DIGESTS[memo]
    table: dict[str, str] = {}
    memo_file = None if memo_dir is None else Path(memo_dir) / DIGESTS_FILE
    if memo_file is not None:
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(memo_file.read_text(encoding="utf-8"))
            table = {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
    digest = table.get(memo)
    if digest is None:
        sha = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        digest = sha.hexdigest()[:16]
        if memo_file is not None:  # replaced whole, atomically: a reader never sees half a file
            with contextlib.suppress(OSError):
                memo_file.parent.mkdir(parents=True, exist_ok=True)
                tag = f"{os.getpid()}-{threading.get_ident()}"
                temp = memo_file.with_name(f".{DIGESTS_FILE}.tmp-{tag}")
                temp.write_text(json.dumps({**table, memo: digest}, sort_keys=True), "utf-8")
                os.replace(temp, memo_file)
    _DIGESTS[memo] = digest
    return digest


def conversion_dir(cache_dir: Path, gguf_path: Path, dtype: str | None) -> Path:
    """Where the conversion of ``gguf_path`` in ``dtype`` is cached under ``cache_dir``."""
    root = Path(cache_dir) / "hf"
    return root / f"{file_digest(gguf_path, memo_dir=root)}-{dtype or 'auto'}"


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(where: Path, message: str) -> None:
    """Log ``message`` as a warning, once per process for the folder ``where``."""
    with _WARNED_LOCK:
        if str(where) in _WARNED:
            return
        _WARNED.add(str(where))
    log.warning("%s", message)


@contextlib.contextmanager
def _as_plain_model(model: Any) -> Iterator[None]:
    """Let ``save_pretrained`` write a dequantised GGUF model: transformers marks it as
    quantised with gguf (not serialisable) although its weights are plain tensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    config: Any = getattr(model, "config", None)
    qconfig = None if config is None else vars(config).pop("quantization_config", None)
    if quantizer is not None:
        model.hf_quantizer = None
    try:
        yield
    finally:
        if quantizer is not None:
            model.hf_quantizer = quantizer
        if qconfig is not None:
            config.quantization_config = qconfig


def _remove_stale_temps(root: Path) -> None:
    now = time.time()
    for entry in root.glob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if now - entry.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(entry, ignore_errors=True)


def discard_conversion(target: Path) -> None:
    """Move an unusable conversion folder out of the way (atomically), then delete it."""
    aside = target.with_name(f".{target.name}.tmp-discard-{os.getpid()}-{threading.get_ident()}")
    with contextlib.suppress(OSError):
        os.rename(target, aside)
        shutil.rmtree(aside, ignore_errors=True)


def save_conversion(model: Any, tokenizer: Any, target: Path, meta: dict[str, Any]) -> str | None:
    """Save a converted model and tokenizer as ``target`` (atomically); None when done, else
    the warning (also logged, once per folder) that says why the cache was not written.

    Written into a temporary sibling folder, marker last, then renamed to ``target``: a reader
    sees either no folder or a complete one. If another process renamed its copy first, its copy
    is kept and this one deleted."""
    if getattr(getattr(model, "hf_quantizer", None), "packed_modules", None):
        return "the GGUF weights stay packed in GGUF blocks on this device: no conversion to cache"
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(root)
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
        try:
            temp.chmod(0o755)  # readable by every user of a shared cache, like the files in it
            with _as_plain_model(model):
                model.save_pretrained(str(temp))
            tokenizer.save_pretrained(str(temp))
            (temp / MARKER).write_text(json.dumps(meta, sort_keys=True), encoding="utf-8")
            if target.exists() and not (target / MARKER).is_file():
                discard_conversion(target)  # a folder without its marker is not ours to keep
            try:
                os.rename(temp, target)
            except OSError:
                if not (target / MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(temp, ignore_errors=True)  # gone after the rename; a loser's copy
    except Exception as exc:  # a read-only or full disk, a model that cannot be serialised...
        message = (
            f"cannot write the GGUF conversion cache in {root} ({error_reason(exc)}); the model "
            f"converts again at every load: set {CACHE_DIR_ENV} to a writable folder, or "
            f"{HF_CACHE_ENV}=0 to turn the cache off"
        )
        warn_once(root, message)
        return message
    return None


# --- checks before loading -------------------------------------------------------------------


@cache
def supported_gguf_types() -> tuple[str, ...]:
    """The GGUF tensor types the installed gguf package can dequantise (which is what
    transformers uses to read a GGUF), found by dequantising one zero block of each."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    names = []
    for qtype in GGMLQuantizationType:
        sizes = GGML_QUANT_SIZES.get(qtype)
        if sizes is None:
            continue
        try:
            dequantize(np.zeros(sizes[1], dtype=np.uint8), qtype)
        except Exception:  # NotImplementedError for the types it cannot read
            continue
        names.append(qtype.name)
    return tuple(names)


def _own_gguf_path(architecture: str) -> bool:
    """True when transformers reads this architecture with its own GGUF reader (which checks
    the tensor types itself); older transformers have no such reader."""
    try:
        module = importlib.import_module("transformers.integrations.gguf")
    except ImportError:
        return False
    check = getattr(module, "is_gguf_arch_supported", None)
    return bool(check(architecture)) if check is not None else False


def check_gguf(path: Path) -> None:
    """Raise :class:`ModelLoadError` when ``path`` is not a readable GGUF file or holds tensor
    types that cannot be dequantised (naming them and the supported ones)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        field_ = reader.fields.get("general.architecture")
        architecture = "" if field_ is None else bytes(field_.parts[field_.data[0]]).decode()
        types: dict[str, int] = {}
        for tensor in reader.tensors:
            name = tensor.tensor_type.name
            types[name] = types.get(name, 0) + 1
    except Exception as exc:  # bad magic, truncated header, unknown type number...
        raise ModelLoadError(
            f"{path} is not a readable GGUF file ({error_reason(exc)}); pass a model file in "
            "llama.cpp's GGUF format (download it again if it was cut off) or a model folder"
        ) from None
    if _own_gguf_path(architecture):
        return
    supported = supported_gguf_types()
    bad = sorted(t for t in types if t not in supported)
    if bad:
        held = ", ".join(f"{t} ({types[t]} tensors)" for t in bad)
        raise ModelLoadError(
            f"{path} holds GGUF tensor types that cannot be dequantised for transformers: "
            f"{held}; supported: {', '.join(supported)}; use a file quantised to a supported "
            "type (e.g. Q8_0 or Q4_K_M), or serve this one with llama.cpp (llm:openai)"
        )
