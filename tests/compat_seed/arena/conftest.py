"""Not from the arena: puts this folder on ``sys.path`` so that the arena's files copied here
import as they do in the arena's repository (``gpu_budget_arena.models``, ``server.app``)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
