"""torch's CPU threads for ``llm:hf`` seats (``threads=``): set once per loaded model.

torch's intra-op thread count is one setting per process, and by default it is every core of the
machine. Each model loaded on the CPU decodes on its own engine thread, so two models (or two
processes) at the default each ask for every core and the cores are oversubscribed: torch's
threads wait on one another instead of computing. The process's Python side needs a core too:
the event loop builds prompts and grammars, the engine writes the grammar masks and the env
steps while torch multiplies. ``threads=N`` sets the count; without it a backend loading a CPU
model gives each CPU model loaded in the process one share of the cores, the Python side
counting as one more (``max(1, cores // (models + 1))``; the cores are those this process may
run on): 1 thread on 2 cores, 8 on 16 for one model. Seats on one model share its engine and
decode in one batch, so they share one share. ``OMP_NUM_THREADS`` in the
environment is left alone (torch read it at start). The count is applied at load: an engine
already decoding keeps the count it started with."""

from __future__ import annotations

import os
import threading
from typing import Any

#: the environment variable that, when set, makes the default leave torch's threads alone
OMP_ENV = "OMP_NUM_THREADS"
_LOCK = threading.Lock()
_CPU_MODELS: set[int] = set()  # ids of the models loaded on the CPU that set a share


def check_threads(value: Any) -> int:
    """A ``threads=`` value: an int of at least 1 (spec strings are read as ints); ValueError
    with the fix otherwise."""
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise ValueError(f"threads={value}: give a whole number of CPU threads, at least 1")
    try:
        n = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"threads={value}: give a whole number of CPU threads, at least 1"
        ) from None
    if n < 1:
        raise ValueError(f"threads={value}: give a whole number of CPU threads, at least 1")
    return n


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def share(models: int, cores: int | None = None) -> int:
    """One CPU model's share of the cores, the Python side counting as one more consumer:
    ``max(1, cores // (models + 1))``."""
    return max(1, (usable_cores() if cores is None else cores) // (max(1, models) + 1))


def apply_threads(asked: int | None, model: Any, device: str) -> int | None:
    """Set torch's CPU threads for ``model`` loaded on ``device``: ``asked``, else one share of
    the cores per CPU model loaded (see the module docstring). Returns the count torch now uses,
    or None for a model not on the CPU without ``asked``."""
    import torch

    on_cpu = str(device).split(":")[0] == "cpu"
    if asked is None and not on_cpu:
        return None
    with _LOCK:
        if on_cpu:
            _CPU_MODELS.add(id(model))
        if asked is None and os.environ.get(OMP_ENV):
            return int(torch.get_num_threads())
        n = asked if asked is not None else share(len(_CPU_MODELS))
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n


def forget_models() -> None:
    """Forget the CPU models counted so far (tests; after ``clear_model_cache``)."""
    with _LOCK:
        _CPU_MODELS.clear()
