"""``gpumarket openenv``: serve the market as an OpenEnv environment (see docs/openenv.md).

The server's modules need the ``[serve]`` extra (OpenEnv, FastAPI, uvicorn), so they are loaded
when the command runs, not when the CLI starts: every other command works without the extra.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import sys
from collections.abc import Callable

SERVER_MODULE = "market.serve.openenv_app"


def add_openenv_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The ``openenv`` subcommand and its options."""
    cmd = add(
        "openenv",
        "Serve the market as an OpenEnv environment: one learner seat per WebSocket session, "
        "the other seats played by the server (docs/openenv.md).",
    )
    cmd.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; the server has no "
        "authentication, so bind another address only on a trusted network)",
    )
    cmd.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    cmd.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="concurrent sessions, each its own env (default 64; one more is refused)",
    )
    cmd.add_argument(
        "--allow-llm-lineup",
        action="store_true",
        help="let a session's line-up name LLM seats (llm:... specs; the server then calls "
        "the URLs they name)",
    )


def cmd_openenv(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        print(f"gpumarket openenv: --port must be 1..65535, got {args.port}", file=sys.stderr)
        return 2
    if args.max_sessions < 1:
        print(
            f"gpumarket openenv: --max-sessions must be at least 1, got {args.max_sessions}",
            file=sys.stderr,
        )
        return 2
    try:
        server = importlib.import_module(SERVER_MODULE)
    except ModuleNotFoundError as exc:
        print(
            f"gpumarket openenv: {exc.name} is not installed; pip install 'gpumarket[serve]'",
            file=sys.stderr,
        )
        return 2
    if not _loopback(args.host):
        print(
            f"gpumarket openenv: warning: binding {args.host}, reachable from other machines; "
            "the server has no authentication",
            file=sys.stderr,
        )
    print(f"gpumarket openenv: serving on http://{args.host}:{args.port} (WebSocket /ws)")
    server.serve(args.host, args.port, args.max_sessions, args.allow_llm_lineup)
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["add_openenv_parser", "cmd_openenv"]
