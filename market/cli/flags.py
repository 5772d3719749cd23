"""The command line's shared grammar: the value parsers and defaults that every command reads the
same way. Light on purpose (the standard library only): the parser and the light commands import
it, and ``gpumarket --help`` must not pay for the run stack.

The rules (docs/running.md, "One grammar"):

* ``--out DIR`` is the folder the command writes its files into, for every command;
* ``--seeds`` is ``START:STOP`` or a comma list, and defaults to :data:`DEFAULT_SEEDS` wherever a
  command takes it;
* ``--workers N`` is a number of worker processes, at least 1 (default: every CPU core);
* bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse

#: the seeds of every command that takes ``--seeds`` when none are given
DEFAULT_SEEDS = "0:10"


def parse_seeds(text: str) -> list[int]:
    """'0:20' -> 0..19, '3' -> [3], '1,5,9' -> those."""
    try:
        if ":" in text:
            lo, hi = text.split(":", 1)
            seeds = list(range(int(lo), int(hi)))
        else:
            seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r}: use START:STOP (e.g. 0:20) or a comma list (e.g. 1,5,9)"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError(
            f"--seeds {text!r} selects no seed; STOP must be above START"
        )
    return seeds


def parse_workers(text: str) -> int:
    """``--workers``: a whole number of processes, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: give a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers {text!r}: give at least 1")
    return value


def parse_seconds(text: str) -> float:
    """``--agent-timeout``: seconds >= 0 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(
            f"--agent-timeout {text!r}: give seconds from 0 up (e.g. 30; 0: no limit)"
        )
    return value


def parse_seat(text: str) -> tuple[str, str]:
    seat, sep, spec = text.partition("=")
    if not sep or not seat or not spec:
        raise argparse.ArgumentTypeError(
            f"--seat {text!r}: write SEAT=AGENT, e.g. bidder_0=truthful"
        )
    return seat.strip(), spec.strip()


def parse_specs(text: str) -> list[str]:
    """A comma-separated list of agent specs or scenario names, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


def one_line(exc: BaseException) -> str:
    """A multi-line scenario error as one line: 'SOURCE: key 'k': problem; key 'j': problem'."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(exc).__name__
    head = lines[0].rstrip(":")
    source, _, count = head.rpartition(": ")
    if source and count.endswith("problem(s)"):
        head = source if count.startswith("1 ") else f"{source}: {count.replace('(s)', 's')}"
    return f"{head}: " + "; ".join(line.removeprefix("- ") for line in lines[1:])


__all__ = [
    "DEFAULT_SEEDS",
    "one_line",
    "parse_seat",
    "parse_seconds",
    "parse_seeds",
    "parse_specs",
    "parse_workers",
]
