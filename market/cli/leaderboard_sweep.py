"""The real-model leaderboard over LLM seat settings: one ``llm:`` spec per combination of
``memory`` x ``reasoning`` x ``mode`` on one OpenAI-compatible server, ranked by
``gpumarket eval --leaderboard`` against ``rule_expert`` and ``rule_designer``.

    python -m market.cli.leaderboard_sweep --base-url http://127.0.0.1:8080/v1 \\
        --model smollm2-135m --seeds 0:3 --out runs/leaderboard-smollm2

The setting values are passed through as spec parameters (``&memory=window:4&reasoning=field``)
and never interpreted here: whatever the LLM seat accepts is what the sweep can rank. An empty
list (``--memory ""``) leaves the parameter out of every spec. ``--dry-run`` prints the command
instead of running it. Every other flag after ``--`` goes to ``gpumarket eval`` unchanged.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
from collections.abc import Mapping, Sequence

from market.cli import main as gpumarket

#: the settings swept by default, in spec order
SETTINGS: dict[str, tuple[str, ...]] = {
    "memory": ("none", "window:4", "full", "summary"),
    "reasoning": ("none", "field", "native"),
    "mode": ("json", "tools", "auto"),
}
#: agent parameters every spec of the sweep carries: small replies and generous limits for a
#: CPU model on a loaded machine (a decision may take minutes)
FIXED = "response_format=json_object&timeout=900&max_retries=0&max_tokens=128&retries=1"


def sweep_specs(
    model: str,
    base_url: str,
    settings: Mapping[str, Sequence[str]] = SETTINGS,
    fixed: str = FIXED,
) -> list[str]:
    """One ``llm:openai`` spec per combination of ``settings`` (the first key varies slowest)."""
    base = f"llm:openai?model={model}&base_url={base_url}" + (f"&{fixed}" if fixed else "")
    keys = [k for k, values in settings.items() if values]
    for key in keys:
        for value in settings[key]:
            if any(c in value for c in ",&?= "):
                raise ValueError(f"{key} value {value!r}: no commas, '&', '?', '=' or spaces")
    specs = []
    for combo in itertools.product(*(settings[k] for k in keys)):
        specs.append(base + "".join(f"&{k}={v}" for k, v in zip(keys, combo, strict=True)))
    return specs


def command(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The ``gpumarket eval --leaderboard`` arguments of the sweep."""
    settings = {
        key: tuple(v for v in (getattr(args, key) or "").split(",") if v) for key in SETTINGS
    }
    specs = sweep_specs(args.model, args.base_url, settings)
    return [
        "eval",
        "--leaderboard",
        "--agents",
        ",".join(specs),
        "--scenarios",
        args.scenarios,
        "--seats",
        args.seats,
        "--seeds",
        args.seeds,
        "--out",
        args.out,
        "--agent-timeout",
        str(args.agent_timeout),
        "--max-in-flight",
        "1",  # a llama.cpp server answers one request at a time
        *extra,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m market.cli.leaderboard_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="smollm2-135m", help="the server's model name")
    for key, values in SETTINGS.items():
        parser.add_argument(
            f"--{key}", default=",".join(values), help=f"comma list (default: {','.join(values)})"
        )
    parser.add_argument("--scenarios", default="single_trade,market_round")
    parser.add_argument("--seats", default="designer_0,bidder_0")
    parser.add_argument("--seeds", default="0:3")
    parser.add_argument("--out", default="runs/leaderboard-sweep")
    parser.add_argument("--agent-timeout", type=float, default=900.0)
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args, extra = parser.parse_known_args(argv)
    try:
        argv_eval = command(args, [e for e in extra if e != "--"])
    except ValueError as exc:
        print(f"leaderboard_sweep: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("gpumarket " + " ".join(shlex.quote(a) for a in argv_eval))
        return 0
    return gpumarket(argv_eval)


if __name__ == "__main__":
    sys.exit(main())
