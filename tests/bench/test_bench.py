"""The benchmark suite's logic: comparing runs, the growth-exponent fit, the JSON schema.

No timing assertions: figures from a shared machine are noise. Only structure and arithmetic.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

from market.bench import clearing, compare, config, memory, suite, throughput
from market.cli import main


def _metric(
    name: str, value: float, direction: str = "higher", unit: str = "steps/s", **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "direction": direction,
        "section": name.split(".")[0],
        **extra,
    }


def _write(path: Path, metrics: list[dict[str, Any]], **top: Any) -> Path:
    data = {"schema": config.SCHEMA, "machine": {"cores": 2}, "metrics": metrics, **top}
    path.write_text(json.dumps(data))
    return path


def _pair(tmp_path: Path, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    return [str(_write(tmp_path / "old.json", old)), str(_write(tmp_path / "new.json", new))]


# -------------------------------------------------------------------------------- compare


def test_a_25_percent_slower_throughput_is_a_regression(tmp_path: Path, capsys: Any) -> None:
    files = _pair(
        tmp_path,
        [_metric("steps.market_round.steps_per_s", 12_000)],
        [_metric("steps.market_round.steps_per_s", 9_000)],
    )
    assert main(["bench", "--compare", *files]) == 1
    out = capsys.readouterr().out
    assert "regression" in out and "-25.0%" in out


def test_a_15_percent_slower_throughput_is_not_flagged(tmp_path: Path, capsys: Any) -> None:
    files = _pair(
        tmp_path,
        [_metric("steps.market_round.steps_per_s", 10_000)],
        [_metric("steps.market_round.steps_per_s", 8_500)],
    )
    assert main(["bench", "--compare", *files]) == 0
    assert "no regression > 20%" in capsys.readouterr().out


def test_the_threshold_is_configurable(tmp_path: Path) -> None:
    files = _pair(
        tmp_path, [_metric("steps.x.steps_per_s", 10_000)], [_metric("steps.x.steps_per_s", 8_500)]
    )
    assert main(["bench", "--compare", *files, "--threshold", "0.1"]) == 1
    assert main(["bench", "--compare", *files, "--threshold", "0.2"]) == 0


def test_direction_decides_what_is_worse(tmp_path: Path) -> None:
    lower = _pair(
        tmp_path,
        [_metric("clearing.vcg.n1000.ms", 4.0, "lower", "ms")],
        [_metric("clearing.vcg.n1000.ms", 3.0, "lower", "ms")],
    )
    assert main(["bench", "--compare", *lower]) == 0  # 25% less time: an improvement
    higher = _pair(
        tmp_path,
        [_metric("clearing.vcg.n1000.ms", 4.0, "lower", "ms")],
        [_metric("clearing.vcg.n1000.ms", 5.0, "lower", "ms")],
    )
    assert main(["bench", "--compare", *higher]) == 1  # 25% more time: a regression
    assert compare.classify(4.0, 3.0, "lower", 0.2) == (-0.25, "improved")
    assert compare.classify(4.0, 3.0, "higher", 0.2) == (-0.25, "regression")
    assert compare.classify(4.0, 5.0, "higher", 0.2) == (0.25, "improved")
    assert compare.classify(100.0, 119.0, "lower", 0.2)[1] == "ok"
    assert compare.classify(0.0, 0.0, "lower", 0.2) == (None, "ok")
    assert compare.classify(0.0, 3.0, "lower", 0.2) == (None, "n/a")


def test_changes_within_a_metrics_noise_floor_are_not_flagged(tmp_path: Path) -> None:
    # 0.06 -> 0.09 ms is +50% but only 0.03 ms: within the 0.1 ms floor of a small clearing
    small = _pair(
        tmp_path,
        [_metric("clearing.vcg.n10.ms", 0.06, "lower", "ms", noise=0.1)],
        [_metric("clearing.vcg.n10.ms", 0.09, "lower", "ms", noise=0.1)],
    )
    assert main(["bench", "--compare", *small]) == 0
    big = _pair(
        tmp_path,
        [_metric("clearing.vcg.n1000.ms", 2.0, "lower", "ms", noise=0.1)],
        [_metric("clearing.vcg.n1000.ms", 2.6, "lower", "ms", noise=0.1)],
    )
    assert main(["bench", "--compare", *big]) == 1  # +0.6 ms, +30%: beyond the floor
    assert compare.classify(0.06, 0.09, "lower", 0.2, noise=0.1) == (pytest.approx(0.5), "ok")
    assert compare.classify(0.06, 0.09, "lower", 0.2)[1] == "regression"
    bad = _pair(
        tmp_path,
        [_metric("x.ms", 1.0, "lower", "ms", noise=-1)],
        [_metric("x.ms", 1.0, "lower", "ms")],
    )
    assert main(["bench", "--compare", *bad]) == 2


def test_missing_metrics_are_listed_not_failures(tmp_path: Path, capsys: Any) -> None:
    files = _pair(
        tmp_path,
        [_metric("a.x", 1.0), _metric("b.gone", 1.0)],
        [_metric("a.x", 1.0), _metric("c.new", 1.0)],
    )
    assert main(["bench", "--compare", *files]) == 0
    out = capsys.readouterr().out
    assert "only in" in out and "b.gone" in out and "c.new" in out


def test_values_of_different_contexts_are_not_compared(tmp_path: Path) -> None:
    old = [_metric("llm.c8.decisions_per_s", 300.0, context={"server": "fake", "latency_ms": 50})]
    new = [
        _metric(
            "llm.c8.decisions_per_s",
            20.0,
            context={"server": "http://127.0.0.1:8080/v1", "model": "m"},
        )
    ]
    files = _pair(tmp_path, old, new)
    assert main(["bench", "--compare", *files]) == 0
    cmp = compare.compare_reports(
        compare.load_report(Path(files[0])), compare.load_report(Path(files[1]))
    )
    assert cmp.rows[0]["status"] == "not comparable" and not cmp.regressions


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        (json.dumps({"schema": config.SCHEMA}), "no 'metrics' list"),
        (json.dumps({"schema": "other/9", "metrics": []}), "schema 'other/9'"),
        (
            json.dumps(
                {
                    "schema": config.SCHEMA,
                    "metrics": [{"name": "a", "value": "fast", "direction": "higher"}],
                }
            ),
            "finite number",
        ),
        (
            json.dumps(
                {"schema": config.SCHEMA, "metrics": [{"name": "a", "value": 1, "direction": "up"}]}
            ),
            "'direction'",
        ),
        (
            json.dumps({"schema": config.SCHEMA, "metrics": [_metric("a", 1), _metric("a", 2)]}),
            "appears twice",
        ),
    ],
)
def test_bad_files_exit_2_with_one_line(
    tmp_path: Path, capsys: Any, content: str | None, needle: str
) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    good = _write(tmp_path / "good.json", [_metric("a", 1.0)])
    assert main(["bench", "--compare", str(bad), str(good)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpumarket bench: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_files_sharing_no_metric_exit_2(tmp_path: Path, capsys: Any) -> None:
    files = _pair(tmp_path, [_metric("a", 1.0)], [_metric("b", 1.0)])
    assert main(["bench", "--compare", *files]) == 2
    assert "share no metric" in capsys.readouterr().err


def test_bad_options_exit_2(tmp_path: Path, capsys: Any) -> None:
    good = str(_write(tmp_path / "g.json", [_metric("a", 1.0)]))
    assert main(["bench", "--compare", good, good, good]) == 2
    assert main(["bench", "--compare", good, good, "--threshold", "-1"]) == 2
    assert main(["bench", "--only", "steps", "--json", str(tmp_path / "no" / "x.json")]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--only", "steps,warp"])
    assert exc.value.code == 2
    assert "warp" in capsys.readouterr().err


def test_parse_sections_keeps_suite_order() -> None:
    assert config.parse_sections("llm, steps") == ("steps", "llm")


# ----------------------------------------------------------------------------- exponent fit

SIZES = [300, 1000, 3000, 10_000]


def test_growth_exponent_of_synthetic_timings() -> None:
    assert clearing.growth_exponent(SIZES, [3e-6 * n for n in SIZES]) == pytest.approx(1.0)
    assert clearing.growth_exponent(SIZES, [5e-9 * n * n for n in SIZES]) == pytest.approx(2.0)
    nlogn = clearing.growth_exponent(SIZES, [1e-7 * n * math.log(n) for n in SIZES])
    assert nlogn == pytest.approx(clearing.nlogn_exponent(SIZES))
    assert 1.1 < nlogn < 1.15
    # linear growth passes the n log n bar, quadratic does not
    assert clearing.growth_exponent(SIZES, SIZES) <= clearing.nlogn_exponent(SIZES)
    assert clearing.growth_exponent(SIZES, [n**2 for n in SIZES]) > clearing.nlogn_exponent(SIZES)
    with pytest.raises(ValueError):
        clearing.growth_exponent([10], [1.0])
    with pytest.raises(ValueError):
        clearing.growth_exponent([10, 10], [1.0, 2.0])


def test_targets_read_the_figures() -> None:
    report = {
        "metrics": [_metric("steps.market_round.steps_per_s", 9_000.0)],
        "details": {
            "clearing": {
                "nlogn_exponent": 1.13,
                "exponents": {"vcg": 1.05, "first_price": 1.3},
                "ms": {1000: {"vcg": 3.0, "first_price": 25.0}},
                "env_step": {"labs": 100, "median_ms": 1.0},
            }
        },
    }
    ok = {t["target"].split()[0]: t["ok"] for t in suite.targets(report)}
    assert ok == {"market_round": False, "vcg": True, "first_price": False, "clear()": False}


@pytest.mark.parametrize(
    ("env_step_ms", "overhead_pct", "expected"),
    [(7.9, 30.0, (True, True)), (8.0, 30.1, (False, False)), (12.0, 12.0, (False, True))],
)
def test_the_env_step_and_transcript_targets(
    env_step_ms: float, overhead_pct: float, expected: tuple[bool, bool]
) -> None:
    report = {
        "metrics": [_metric("transcript.market_round.digest_1.overhead_pct", overhead_pct)],
        "details": {
            "clearing": {
                "nlogn_exponent": 1.13,
                "exponents": {},
                "ms": {},
                "env_step": {"labs": 1000, "median_ms": env_step_ms},
            }
        },
    }
    found = {t["target"]: (t["value"], t["ok"]) for t in suite.targets(report)}
    assert found == {
        "env clearing step at 1,000 labs < 8 ms": (env_step_ms, expected[0]),
        "transcript overhead <= 30% with a state digest at every step (market_round)": (
            overhead_pct,
            expected[1],
        ),
    }


def test_worker_levels() -> None:
    assert throughput.worker_levels(1) == [1]
    assert throughput.worker_levels(2) == [1, 2]
    assert throughput.worker_levels(8) == [1, 2, 8]


# ------------------------------------------------------------------------------ quick runs


def test_quick_run_writes_the_json_schema(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code = main(
        [
            "bench",
            "--quick",
            "--only",
            "steps,clearing,transcript",
            "--scenario",
            "single_trade",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = compare.load_report(out)  # the loader's checks pass on our own output
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["package_version"]
    assert {"timestamp", "git_commit"} <= set(machine)
    assert report["options"] == {"quick": True, "sections": ["steps", "clearing", "transcript"]}
    assert report["skipped"] == {}
    names = {m["name"] for m in report["metrics"]}
    assert "steps.single_trade.steps_per_s" in names
    assert {
        f"clearing.{a}.exponent"
        for a in ("first_price", "second_price", "vcg", "fair_share", "posted_price")
    } <= names
    assert "clearing.vcg.n1000.ms" in names
    assert "transcript.market_round.digest_1.overhead_pct" in names
    for m in report["metrics"]:
        assert m["direction"] in ("higher", "lower") and isinstance(m["unit"], str)
        if not m["name"].endswith("overhead_pct"):  # noise can make an overhead negative
            assert math.isfinite(m["value"]) and m["value"] > 0, m
    details = report["details"]["clearing"]
    assert details["fit_sizes"] == [100, 300, 1000]
    assert details["nlogn_exponent"] == pytest.approx(clearing.nlogn_exponent([100, 300, 1000]))
    # a run compared with itself: nothing changed
    assert main(["bench", "--compare", str(out), str(out)]) == 0


def test_env_memory_counts_the_envs() -> None:
    row = memory.env_memory("single_trade", 3)
    assert row["traced_kib"] > 1 and row["rss_kib"] >= 0


def test_ray_missing_is_a_skip_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    report = suite.run_suite(config.quick_config(), ["ray"])
    assert "not installed" in report["skipped"]["ray"] and report["metrics"] == []


def test_a_failing_section_does_not_lose_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(cfg: config.BenchConfig) -> config.SectionResult:
        raise RuntimeError("boom\nsecond line")

    def fine(cfg: config.BenchConfig) -> config.SectionResult:
        return config.SectionResult([config.metric("memory.x.kib", 1.0, "KiB", "lower", "memory")])

    monkeypatch.setitem(suite.RUNNERS, "llm", broken)
    monkeypatch.setitem(suite.RUNNERS, "memory", fine)
    report = suite.run_suite(config.quick_config(), ["memory", "llm"])
    assert report["skipped"] == {"llm": "error: RuntimeError: boom"}
    assert [m["name"] for m in report["metrics"]] == ["memory.x.kib"]


def test_env_clearing_times_the_step_and_leaves_the_collector_as_it_was() -> None:
    gc.unfreeze()  # start with nothing frozen, whatever ran before in this process
    assert gc.isenabled() and gc.get_freeze_count() == 0
    figures = clearing.bench_env_clearing(n_labs=20, blocks=200, repeats=3)
    assert 0 < figures["min_ms"] <= figures["median_ms"]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # frozen only while it times
    gc.freeze()  # a caller that froze its own objects: they stay frozen
    try:
        assert gc.get_freeze_count() > 0
        clearing.bench_env_clearing(n_labs=20, blocks=200, repeats=1)
        assert gc.get_freeze_count() > 0 and gc.isenabled()
    finally:
        gc.unfreeze()
