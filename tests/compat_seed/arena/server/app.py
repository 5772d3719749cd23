"""Not from the arena: the module its tests import (``from server.app import app``), here the
market's arena-compatible app (market/serve/compat_arena.py), so that the arena's own
tests/test_api.py runs unchanged against this market. Transcripts go to a temporary folder."""

from __future__ import annotations

import tempfile
from pathlib import Path

from market.serve.compat_arena import create_arena_app

app = create_arena_app(Path(tempfile.mkdtemp(prefix="gpumarket-arena-compat-")))
