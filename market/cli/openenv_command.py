"""``gpumarket openenv``: serve the market as an OpenEnv environment (see docs/openenv.md).

The server's modules need the ``[serve]`` extra (OpenEnv, FastAPI, uvicorn), so they are loaded
when the command runs, not when the CLI starts: every other command works without the extra.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import sys

from market.cli.trust_flags import add_trust_arguments, trust_from_args

SERVER_MODULE = "market.serve.openenv_app"


def add_openenv_arguments(cmd: argparse.ArgumentParser) -> None:
    """The options of ``gpumarket openenv`` (its help is in :mod:`market.cli.parser`)."""
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
        default=128,
        help="concurrent sessions, each its own env (default 128; one more is refused)",
    )
    cmd.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=64,
        metavar="N",
        help="concurrent sessions one remote address may hold (default 64; one more is "
        "refused), so that no one client takes the whole server",
    )
    cmd.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="close a session whose client sent nothing for this long while none of its "
        "messages was being served (default 300); the MarketEnvClient reconnects by itself",
    )
    add_trust_arguments(cmd)


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
    if args.max_sessions_per_client < 1:
        print(
            "gpumarket openenv: --max-sessions-per-client must be at least 1, got "
            f"{args.max_sessions_per_client}",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.idle_timeout < float("inf"):
        print(
            f"gpumarket openenv: --idle-timeout must be a number of seconds above 0, got "
            f"{args.idle_timeout:g}",
            file=sys.stderr,
        )
        return 2
    trust = trust_from_args(args, "openenv")
    if trust is None:
        return 2
    policy, origins = trust
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
    print(f"gpumarket openenv: line-ups may name {policy.describe()}", file=sys.stderr)
    server.serve(
        args.host,
        args.port,
        args.max_sessions,
        policy,
        allow_origins=origins,
        max_sessions_per_client=args.max_sessions_per_client,
        idle_timeout_s=args.idle_timeout,
    )
    return 0


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["add_openenv_arguments", "cmd_openenv"]
