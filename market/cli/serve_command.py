"""``gpumarket serve``: host served matches with remote seats (market/serve/match_app.py), or
with ``--agent SPEC`` an agent service for the ``remote`` agent (market/serve/agent_app.py).

The serving room needs the ``serve`` extra (FastAPI, uvicorn): it is loaded by name when the
command runs, so that every other command works on a base install, and a missing extra is one
line saying what to install.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from agents.registry import AgentSpecError
from agents.specs_redact import redact_spec, redact_text
from market.cli.trust_flags import add_trust_arguments, trust_from_args

#: the environment variable ``serve --agent`` reads its bearer token from
TOKEN_ENV = "GPUMARKET_AGENT_TOKEN"
#: the environment variable served matches read their creator token from
CREATE_TOKEN_ENV = "GPUMARKET_CREATE_TOKEN"
#: the shortest creator token taken (a guessable one would open the server to anyone)
MIN_CREATE_TOKEN = 16


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
    add_trust_arguments(cmd)
    cmd.add_argument(
        "--keep",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long an ended match and its tokens stay reachable (default 3600)",
    )
    # the defaults are market.serve.matches' (not imported here: the CLI starts without FastAPI)
    cmd.add_argument(
        "--create-token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="require 'Authorization: Bearer TOKEN' to create a match, TOKEN read from this file "
        f"(or set {CREATE_TOKEN_ENV}; at least {MIN_CREATE_TOKEN} characters); by default "
        "anyone who reaches the port may create matches",
    )
    cmd.add_argument(
        "--max-matches",
        type=int,
        default=1000,
        metavar="N",
        help="matches running at once, all clients together (default 1000)",
    )
    cmd.add_argument(
        "--max-matches-per-client",
        type=int,
        default=64,
        metavar="N",
        help="matches running at once per client IP address (default 64; 0: no limit)",
    )
    cmd.add_argument(
        "--max-match-time",
        type=float,
        default=21600.0,
        metavar="SECONDS",
        help="a match still running after this long is ended, aborted (default 21600: 6 h)",
    )
    cmd.add_argument(
        "--idle-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="a match none of whose remote seats has sent a request for this long is ended, "
        "aborted (default 900)",
    )
    cmd.add_argument(
        "--agent",
        default=None,
        metavar="SPEC",
        help="serve this agent as an agent service (POST /reset, /act) instead of matches",
    )
    cmd.add_argument(
        "--compat",
        choices=("arena", "daedalus"),
        default=None,
        help="serve a seed's HTTP contract instead of matches: 'arena' (the GPU-arena's /reset, "
        "/step, /state, /tasks) or 'daedalus' (the DAEDALUS designer env's /reset, /step, "
        "/api/design); one session per client, every episode a transcript in --out "
        "(docs/compat.md)",
    )
    cmd.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="with --agent: require 'Authorization: Bearer TOKEN' on every request, TOKEN read "
        f"from this file (or set {TOKEN_ENV}; a token is never taken from the command line, "
        "which every user of the machine can list)",
    )
    # refused with a one-line message: a token in argv is in every user's process list
    cmd.add_argument("--token", default=None, help=argparse.SUPPRESS)


def agent_token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(token, None) for ``serve --agent``: from ``--token-file``, else the environment variable
    :data:`TOKEN_ENV`, else none; (None, message) when it cannot be had."""
    if args.token is not None:
        return None, (
            f"--token puts the token in the process list; use --token-file PATH or the "
            f"{TOKEN_ENV} environment variable"
        )
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            return None, f"--token-file {args.token_file}: cannot read it ({why})"
        if not token or any(c.isspace() for c in token):
            return None, f"--token-file {args.token_file}: give one token (no spaces) in the file"
        return token, None
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token and any(c.isspace() for c in token):
        return None, f"{TOKEN_ENV}: give one token (no spaces)"
    return token or None, None


def create_token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(token, None) for served matches: from ``--create-token-file``, else the environment
    variable :data:`CREATE_TOKEN_ENV`, else none; (None, message) when it cannot be had."""
    env = os.environ.get(CREATE_TOKEN_ENV, "").strip()
    where = CREATE_TOKEN_ENV
    token = env
    if args.create_token_file is not None:
        if env:
            return None, (
                f"both --create-token-file and {CREATE_TOKEN_ENV} are set; give one creator token"
            )
        where = f"--create-token-file {args.create_token_file}"
        try:
            token = args.create_token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            return None, f"{where}: cannot read it ({why})"
        if not token:
            return None, f"{where}: the file is empty; put the token in it"
    if not token:
        return None, None
    if any(c.isspace() for c in token) or not token.isascii() or not token.isprintable():
        return None, f"{where}: give one token of printable ASCII, no spaces"
    if len(token) < MIN_CREATE_TOKEN:
        return None, (
            f"{where}: the token has {len(token)} characters; give at least {MIN_CREATE_TOKEN} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token, None


def _limits(args: argparse.Namespace) -> tuple[dict[str, object] | None, str | None]:
    """The served matches' limits from the flags, or (None, message) for a bad value."""
    if args.max_matches < 1:
        return None, f"--max-matches {args.max_matches}: give at least 1"
    if args.max_matches_per_client < 0:
        return None, f"--max-matches-per-client {args.max_matches_per_client}: give 0 or more"
    for flag, value in (
        ("--max-match-time", args.max_match_time),
        ("--idle-timeout", args.idle_timeout),
    ):
        if not 0 < value < float("inf"):
            return None, f"{flag} {value}: give seconds > 0"
    token, problem = create_token(args)
    if problem is not None:
        return None, problem
    return {
        "create_token": token,
        "max_matches": args.max_matches,
        "max_matches_per_client": args.max_matches_per_client,
        "max_match_s": args.max_match_time,
        "idle_s": args.idle_timeout,
    }, None


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
    if args.agent is None and (args.token is not None or args.token_file is not None):
        print(
            "gpumarket serve: --token-file is for an agent service (--agent SPEC)", file=sys.stderr
        )
        return 2
    if args.agent is not None and args.compat is not None:
        print("gpumarket serve: give --agent SPEC or --compat KIND, not both", file=sys.stderr)
        return 2
    if args.agent is not None:
        token, problem = agent_token(args)
        if problem is not None:
            print(f"gpumarket serve: {problem}", file=sys.stderr)
            return 2
        service = _serving("agent_app")
        if service is None:
            return 2
        try:
            app = service.agent_app(args.agent, token=token)
        except AgentSpecError as exc:
            print(f"gpumarket serve: {redact_text(str(exc).splitlines()[0])}", file=sys.stderr)
            return 2
        print(
            f"agent service {redact_spec(args.agent)} on http://{args.host}:{args.port}"
            + (
                " (bearer token required)"
                if token
                else f" with no token: anyone who can reach the port may use it ({TOKEN_ENV} "
                "or --token-file to require one)"
            ),
            file=sys.stderr,
        )
        service.run(app, args.host, args.port)
        return 0
    if args.compat is not None:
        return _serve_compat(args)
    if args.keep <= 0:
        print("gpumarket serve: --keep must be seconds > 0", file=sys.stderr)
        return 2
    limits, problem = _limits(args)
    if limits is None:
        print(f"gpumarket serve: {problem}", file=sys.stderr)
        return 2
    trust = trust_from_args(args, "serve")
    if trust is None:
        return 2
    policy, origins = trust
    matches = _serving("match_app")
    if matches is None:
        return 2
    print(
        f"serving matches on http://{args.host}:{args.port} (transcripts in {args.out}); "
        f"live view of a match: http://{args.host}:{args.port}/matches/<match id>/live",
        file=sys.stderr,
    )
    print(f"clients may seat: remote, {policy.describe()}", file=sys.stderr)
    if limits["create_token"] is None:
        print(
            "anyone who reaches the port may create matches (--create-token-file or "
            f"{CREATE_TOKEN_ENV} to require a token)",
            file=sys.stderr,
        )
    matches.serve(
        args.host,
        args.port,
        args.out,
        policy=policy,
        keep_s=args.keep,
        allow_origins=origins,
        **limits,
    )
    return 0


def _serve_compat(args: argparse.Namespace) -> int:
    """``serve --compat arena|daedalus``: a seed's HTTP contract (market/serve/compat_*.py).
    Clients choose no agents, so ``--allow-agent``/``--allow-url`` do not apply; the session
    limits are ``--max-matches``, ``--max-matches-per-client`` and ``--idle-timeout``."""
    if args.max_matches < 1 or args.max_matches_per_client < 0:
        print(
            "gpumarket serve: --compat: --max-matches must be at least 1 and "
            "--max-matches-per-client 0 (no limit) or more",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.idle_timeout < float("inf"):
        print(
            f"gpumarket serve: --idle-timeout {args.idle_timeout}: give seconds > 0",
            file=sys.stderr,
        )
        return 2
    trust = trust_from_args(args, "serve")
    if trust is None:
        return 2
    _, origins = trust
    module = _serving(f"compat_{args.compat}")
    server = _serving("compat_server")
    if module is None or server is None:
        return 2
    create = getattr(module, f"create_{args.compat}_app")
    app = create(
        args.out,
        origins,
        max_sessions=args.max_matches,
        max_sessions_per_client=args.max_matches_per_client or args.max_matches,
        idle_timeout_s=args.idle_timeout,
    )
    print(
        f"serving the {args.compat} seed's HTTP contract on http://{args.host}:{args.port} "
        f"(one session per client; transcripts in {args.out})",
        file=sys.stderr,
    )
    server.serve(app, args.host, args.port)
    return 0
