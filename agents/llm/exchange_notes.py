"""What an LLM exchange records of each completion: its ``finish_reason`` (``"length"``: cut off
by the token limit) and the backend's degraded features (``Completion.extra["degraded"]``: a
request feature the backend did not honour, a model without a chat template...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def note_completion(exchange: dict[str, Any], extra: Mapping[str, Any]) -> bool:
    """Record a completion's ``finish_reason`` in ``exchange`` (the last one, and one per attempt
    in ``finish_reasons``) and add its new degraded notes to ``exchange["degraded"]``. True when
    the decision became degraded by this completion (it had no degraded feature before), so the
    agent counts each degraded decision once (``stats["degraded_features"]``)."""
    exchange["finish_reason"] = extra.get("finish_reason")
    exchange.setdefault("finish_reasons", []).append(exchange["finish_reason"])
    degraded = exchange.setdefault("degraded", [])
    notes = extra.get("degraded") or ()
    new = [str(n) for n in ([notes] if isinstance(notes, str) else notes) if n]
    new = [n for n in dict.fromkeys(new) if n not in degraded]
    became = bool(new) and not degraded
    degraded.extend(new)
    return became
