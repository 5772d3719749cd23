"""The ``gpumarket`` argument parser: every command, its help and example.

Start-up: ``gpumarket --help`` and ``gpumarket agents`` must start in well under half a second, and
a command's options come from modules that import the run stack (the LLM pool flags of
:mod:`market.run.async_runner`, the serve and play commands). So each command's options are added
when that command is parsed or its help is printed (:class:`CommandParser`), from
:mod:`market.cli.arguments` or the command's own module; the top level knows only the names, help
and examples below. ``build_parser()`` builds the same parser either way.

Grammar: an unknown option is reported with the usage of the command it was given to, not the top
level's; ``gpumarket`` alone prints this help (exit 0); ``--version`` prints the version. The
shared value parsers and defaults are in :mod:`market.cli.flags`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from market.cli.flags import one_line, parse_seat, parse_seeds, parse_specs
from market.version import __version__

#: each command's help: the first sentence is its line in ``gpumarket --help``, the whole text the
#: description in ``gpumarket COMMAND --help``
HELP: dict[str, str] = {
    "run": "Run a scenario over seeds in parallel and print mean +/- 95% CI of each seat's reward "
    "components. Every finished episode is kept in the run folder OUT (default "
    "runs/SCENARIO): OUT/results.jsonl (one row per episode and seat), its transcript in "
    "OUT/transcripts/ and the run report OUT/report.html; rerunning skips the episodes already "
    "there.",
    "eval": "Evaluate agents in one seat across scenarios: a table of the seat's mean return +/- "
    "95% CI per agent x scenario (other seats keep each scenario's agents), printed and written "
    "to OUT/eval.csv and OUT/eval.md. With --mechanisms: compare mechanisms on one scenario "
    "(welfare ratio, revenue, fairness, participation, stability, designer composite) and each "
    "bidder type's gain from deviating to its best alternative built-in strategy; written to "
    "OUT/mechanisms.{csv,md,html}. Resumable like run. With --expert-matrix: rule_expert minus "
    "every scripted bidder of the population in every built-in scenario but the daedalus "
    "family, paired on the same seeds (mean +/- 95% CI), written to OUT/expert_matrix.{csv,md}. "
    "With --negotiation: the negotiation report (value of talk, cost of lying, contract rates, "
    "hedging gain, negotiable welfare per scenario), written to OUT/negotiation.{csv,md,svg}.",
    "tournament": "Rate bidders against each other (rotating through the bidder seats) and "
    "designers against bidder populations, with OpenSkill ratings, win rates and mean returns "
    "with confidence intervals. Resumable: finished matches are kept in OUT/matches.jsonl.",
    "play": "Play one seat yourself, in the terminal, against agents.",
    "replay": "Re-execute transcripts from their seed and verify every reward and state digest "
    "(exit 1 on the first divergence, 2 on an unusable file).",
    "report": "Write one self-contained HTML report (plots, trade/coalition graph, every round) of "
    "a transcript or a folder of transcripts (*.jsonl); of a run folder, the run report "
    "(aggregates, episode index, sampled episode pages).",
    "show": "Print a transcript in the terminal, round by round.",
    "validate": "Check scenario files (or built-in names) as run would: the scenario's keys, "
    "every seat's agent (a name that exists, in a seat its role allows) and the judges; report "
    "every problem at once, or the scenario's summary and line-up.",
    "agents": "List the registered agents and the seats they can fill.",
    "train": "Train a small torch policy (REINFORCE with a baseline) for one seat against the "
    "scenario's scripted population; save it, its learning curve and a paired evaluation vs "
    "random_valid and rule_expert. Needs torch (pip install 'gpumarket[rl]'). See docs/rl.md.",
    "export-sft": "Export the LLM decisions of transcripts as a chat-format SFT dataset (JSONL: "
    "messages = system, user, assistant; metadata = file, seed, step, seat, agent, rewards...). "
    "See docs/training-data.md.",
    "train-llm": "Fine-tune an LLM seat with LoRA (TRL's SFTTrainer or GRPOTrainer) from a TOML "
    "config and evaluate it on held-out seeds: the teacher's decisions (e.g. rule_expert's), "
    "played by the runner, are the SFT data; GRPO scores completions in the real env. Writes the "
    "run folder OUT: adapter/, log.jsonl, curves.png, eval.json; given again it resumes. Needs "
    "the [train] extra. See docs/training.md.",
    "bench": "Benchmark this machine: start-up time of the command line, AEC steps/s per "
    "scenario, episodes/s with 1, 2 and all cores and on Ray, clearing time against market size "
    "(10 to 10,000 bidders) with its growth exponent, memory per live env, transcript overhead, "
    "LLM decisions/s at concurrency 1/8/32 (fake server unless --llm-base-url). --json writes "
    "the figures; --compare OLD.json flags metrics > --threshold worse (exit 1). See "
    "docs/benchmarks.md.",
    "serve": "Host matches with remote seats over HTTP, an agent service, or a seed's HTTP "
    "contract (--compat arena|daedalus, docs/compat.md).",
    "openenv": "Serve the market as an OpenEnv environment: one learner seat per WebSocket "
    "session, the other seats played by the server (docs/openenv.md).",
}

#: each command's example; every ``gpumarket ...`` line in them is run by the tests
#: (tests/run/test_cli_examples.py), so none may go stale
EXAMPLES: dict[str, str] = {
    "run": "gpumarket run market_round --seeds 0:20 --seat bidder_0=rule_expert\n"
    "  (writes runs/market_round/; rerun the same command to resume, --fresh to start over)\n"
    "         gpumarket run market_round --seeds 0:20 --out runs/expert_trial\n"
    "         gpumarket run large_market --seeds 0:1000 --backend ray --address 10.0.0.5:6379",
    "eval": "gpumarket eval --agents rule_expert,truthful,random_valid "
    "--scenarios single_trade,market_round --seat bidder_0 --seeds 0:20 --out runs/eval\n"
    "         gpumarket eval --mechanisms --scenario mechanism_stage_4 --seeds 0:30\n"
    "         gpumarket eval --expert-matrix --seeds 0:100 --workers 8\n"
    "         gpumarket eval --negotiation --scenarios market_round,coalition_market,shock_storm "
    "--seeds 0:60\n"
    '         gpumarket eval --leaderboard --agents "llm:openai?model=m&base_url='
    'http://127.0.0.1:8080/v1,truthful" --scenarios single_trade,market_round --seeds 0:5',
    "tournament": "gpumarket tournament --bidders rule_expert,truthful,random_valid "
    "--designers fixed,rule_designer --scenario market_round --seeds 0:10 "
    "--out runs/tournament\n  (rerun the same command to resume an interrupted run)",
    "play": "gpumarket play single_trade --seat bidder_0 --seed 3 "
    "--seat bidder_1=rule_expert   (docs/human-play.md)",
    "replay": "gpumarket replay runs/market_round/transcripts/0.jsonl   (or a folder: "
    "gpumarket replay runs/market_round)",
    "report": "gpumarket report runs/market_round/ -o report.html",
    "show": "gpumarket show runs/market_round/transcripts/0.jsonl --round 2",
    "validate": "gpumarket validate my_scenario.toml\n"
    "         gpumarket validate market_round --seat bidder_0=rule_expert",
    "agents": "gpumarket agents",
    "train": "gpumarket train --scenario market_round --seat bidder_0 --episodes 3000 "
    "--out runs/train\n  (then: gpumarket run market_round --seeds 0:20 "
    "--seat bidder_0=torch_policy?path=runs/train/policy.pt)",
    "export-sft": "gpumarket export-sft runs/market_round -o sft.jsonl --seat bidder_0 "
    "--valid-only --min-return 0.5\n"
    "         gpumarket export-sft runs/market_round --include-scripted "
    "--agent rule_expert -o distil.jsonl",
    "train-llm": "gpumarket train-llm sft market/train/configs/smollm2_market_round.toml "
    "--out runs/sft\n"
    "  (then seat the adapter in a run: "
    "--seat 'bidder_0=llm:hf?path=MODEL.gguf&adapter=runs/sft&memory=none')",
    "bench": "gpumarket bench --json bench.json   (later: gpumarket bench --compare bench.json)\n"
    "         gpumarket bench --only startup,clearing,memory --quick\n"
    "         gpumarket bench --compare old.json new.json --threshold 0.2",
    "serve": "gpumarket serve --port 8765 --out runs/served\n"
    "  (then: curl -X POST http://127.0.0.1:8765/matches -H 'content-type: application/json' "
    """-d '{"scenario": "market_round", "seats": {"bidder_0": "remote"}}')\n"""
    "         gpumarket serve --agent rule_expert --port 9000   (an agent service: seat it with "
    "--seat bidder_0=remote?url=http://127.0.0.1:9000; with GPUMARKET_AGENT_TOKEN set it "
    "requires that token: add &token_env=VAR to the spec)\n"
    "         gpumarket serve --compat arena --port 8000 --out runs/arena   (the GPU-arena's "
    "/reset and /step; --compat daedalus: the DAEDALUS designer env's)",
    "openenv": "gpumarket openenv --port 8000   (then: MarketEnvClient(base_url="
    '"http://127.0.0.1:8000"); docs/openenv.md)',
}

Options = Callable[[argparse.ArgumentParser], None]


def command_options(name: str) -> Options | None:
    """The function that adds command ``name``'s options, its module imported now; None for a
    command without options."""
    if name == "agents":
        return None
    if name == "play":
        from market.cli.play_command import add_play_arguments

        return add_play_arguments
    if name == "serve":
        from market.cli.serve_command import add_serve_arguments

        return add_serve_arguments
    if name == "openenv":
        from market.cli.openenv_command import add_openenv_arguments

        return add_openenv_arguments
    if name == "train-llm":
        from market.cli.train_command import add_train_llm_arguments

        return add_train_llm_arguments
    from market.cli.arguments import OPTIONS

    return OPTIONS[name]


class CommandParser(argparse.ArgumentParser):
    """One command's parser. Its options are added the first time it parses, or prints its help
    or usage (:func:`command_options`), and an option it does not know is an error with its own
    usage (argparse would leave it to the top level, which prints the top-level usage)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: str | None = None

    def defer(self, name: str) -> None:
        """Add command ``name``'s options on first use."""
        self._pending = name

    def complete(self) -> CommandParser:
        """Add the deferred options now (idempotent)."""
        name, self._pending = self._pending, None
        if name is not None:
            add = command_options(name)
            if add is not None:
                add(self)
        return self

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.complete()
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def format_usage(self) -> str:
        self.complete()
        return super().format_usage()

    def format_help(self) -> str:
        self.complete()
        return super().format_help()


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


def build_parser() -> argparse.ArgumentParser:
    """The ``gpumarket`` parser (each command's options are added on first use)."""
    parser = argparse.ArgumentParser(
        prog="gpumarket",
        description="Multi-agent GPU market: run scenarios, evaluate agents, play a seat, "
        "replay and report, benchmark.",
        epilog="gpumarket COMMAND --help shows a command's options and an example. Every "
        "command that writes files takes --out DIR, the folder it writes into.",
    )
    parser.add_argument("--version", action="version", version=f"gpumarket {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", parser_class=CommandParser
    )
    for name, text in HELP.items():
        # argparse %-formats help strings (not descriptions): "95% CI" must be written "95%% CI"
        cmd = sub.add_parser(
            name,
            help=_first_sentence(text).replace("%", "%%"),
            description=text,
            epilog=f"example: {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.defer(name)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, CommandParser]:
    """Command name -> its parser, options added."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: cmd.complete() for name, cmd in action.choices.items()}


__all__ = [
    "EXAMPLES",
    "HELP",
    "CommandParser",
    "build_parser",
    "command_options",
    "one_line",
    "parse_seat",
    "parse_seeds",
    "parse_specs",
    "subcommands",
]
