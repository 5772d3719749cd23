"""The servers' trust flags (``gpumarket serve`` and ``gpumarket openenv``): what a client may
name in a line-up (``--allow-agent``, ``--allow-url``) and which browser origins may drive the
server (``--allow-origin``). docs/security.md is the trust model they configure.

:mod:`agents.spec_policy` and :mod:`market.serve.guards` need neither FastAPI nor uvicorn, so a
bad flag is reported even without the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import sys

from agents.spec_policy import SpecPolicy
from market.serve.guards import normalise_origin

#: flags of earlier releases, each with what replaces it
REMOVED = {
    "allow_any_spec": "--allow-any-spec",
    "allow_llm_lineup": "--allow-llm-lineup",
}


def add_trust_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--allow-agent",
        action="append",
        default=[],
        metavar="NAME",
        help="let clients seat this agent on the server (repeatable): a name (llm:openai, "
        "remote, torch_policy, a plug-in, py:pkg.mod:Class) with any parameters, or a whole "
        "spec ('NAME?k=v') exactly; by default clients may name only the built-in agents",
    )
    cmd.add_argument(
        "--allow-url",
        action="append",
        default=[],
        metavar="PREFIX",
        help="a URL prefix the server may call for a client's spec (repeatable), e.g. "
        "http://127.0.0.1:9000; every URL in a spec must fall under one",
    )
    cmd.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin besides the server's own that may drive it (repeatable), e.g. "
        "http://127.0.0.1:3000",
    )
    for dest, flag in REMOVED.items():
        cmd.add_argument(flag, dest=dest, action="store_true", help=argparse.SUPPRESS)


def trust_from_args(args: argparse.Namespace, prog: str) -> tuple[SpecPolicy, list[str]] | None:
    """(policy, allowed origins) from the flags, or None after a one-line message on stderr."""
    for dest, flag in REMOVED.items():
        if getattr(args, dest, False):
            _fail(
                prog,
                f"{flag} is gone: allow exactly what clients may name with --allow-agent NAME "
                "and --allow-url PREFIX (docs/security.md)",
            )
            return None
    try:
        policy = SpecPolicy.from_lists(args.allow_agent, args.allow_url)
        origins = [normalise_origin(o) for o in args.allow_origin]
    except ValueError as exc:
        _fail(prog, str(exc).splitlines()[0])
        return None
    return policy, origins


def _fail(prog: str, message: str) -> None:
    print(f"gpumarket {prog}: {message}", file=sys.stderr)


__all__ = ["add_trust_arguments", "trust_from_args"]
