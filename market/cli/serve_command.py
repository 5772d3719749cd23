"""``gpumarket serve``: host served matches with remote seats (market/serve/match_app.py), or
with ``--agent SPEC`` an agent service for the ``remote`` agent (market/serve/agent_app.py).

The serving room needs the ``serve`` extra (FastAPI, uvicorn): it is loaded by name when the
command runs, so that every other command works on a base install, and a missing extra is one
line saying what to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from types import ModuleType

from agents.registry import AgentSpecError

EXAMPLE = (
    "gpumarket serve --port 8765 --out runs/served\n"
    "  (then: curl -X POST http://127.0.0.1:8765/matches -H 'content-type: application/json' "
    """-d '{"scenario": "market_round", "seats": {"bidder_0": "remote"}}')\n"""
    "         gpumarket serve --agent rule_expert --port 9000   (an agent service: seat it with "
    "--seat bidder_0=remote?url=http://127.0.0.1:9000)"
)


def add_serve_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1, this machine only; 0.0.0.0 opens it to the "
        "network: put it behind TLS)",
    )
    cmd.add_argument("--port", type=int, default=8765, help="TCP port (default 8765)")
    cmd.add_argument(
        "--out",
        type=Path,
        default=Path("runs/served"),
        help="folder for the matches' transcripts, one <match id>.jsonl each (default runs/served)",
    )
    cmd.add_argument(
        "--allow-any-spec",
        action="store_true",
        help="let a match seat any agent spec on the server (py:, llm:, remote?url=); by "
        "default only 'remote' and registered agent names",
    )
    cmd.add_argument(
        "--keep",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long an ended match and its tokens stay reachable (default 3600)",
    )
    cmd.add_argument(
        "--agent",
        default=None,
        metavar="SPEC",
        help="serve this agent as an agent service (POST /reset, /act) instead of matches",
    )
    cmd.add_argument(
        "--token",
        default=None,
        help="with --agent: require 'Authorization: Bearer TOKEN' on every request",
    )


def _serving(module: str) -> ModuleType | None:
    """``market.serve.<module>``, or None (after a one-line message) without the serve extra."""
    try:
        return importlib.import_module(f"market.serve.{module}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("fastapi", "uvicorn", "starlette"):
            raise
        print(f"gpumarket serve: needs {exc.name}: pip install 'gpumarket[serve]'", file=sys.stderr)
        return None


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        print(f"gpumarket serve: --port {args.port}: give a port in 1..65535", file=sys.stderr)
        return 2
    if args.agent is not None:
        service = _serving("agent_app")
        if service is None:
            return 2
        try:
            app = service.agent_app(args.agent, token=args.token)
        except AgentSpecError as exc:
            print(f"gpumarket serve: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        print(f"agent service {args.agent} on http://{args.host}:{args.port}", file=sys.stderr)
        service.run(app, args.host, args.port)
        return 0
    if args.keep <= 0:
        print("gpumarket serve: --keep must be seconds > 0", file=sys.stderr)
        return 2
    matches = _serving("match_app")
    if matches is None:
        return 2
    print(
        f"serving matches on http://{args.host}:{args.port} (transcripts in {args.out}); "
        f"live view of a match: http://{args.host}:{args.port}/matches/<match id>/live",
        file=sys.stderr,
    )
    matches.serve(
        args.host, args.port, args.out, allow_any_spec=args.allow_any_spec, keep_s=args.keep
    )
    return 0
