"""The run report (``report.html`` of ``gpumarket run``): aggregates and an episode index built
from the result rows, pages for a sample of episodes, pages on demand, ``--no-report``.

What breaks these tests: an index link to a page that does not exist (or a row with neither a
link nor the command that writes the page), a sample that does not follow the documented rule,
an on-demand page that differs from the sampled one, aggregates that differ from the hand
computation, hostile text (seat names, agent specs, errors) that becomes markup, a report whose
size grows with the episodes' content, and ``--no-report`` writing a report.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from market.bench.config import quick_config
from market.bench.report import section_report, synthetic_rows
from market.cli import main as cli
from market.review.report import (
    build_report,
    build_run_report,
    episode_from,
    run_page,
    sample_seeds,
    write_run_report,
)
from market.review.report.run_page import EpisodeRow, episode_rows, read_rows
from market.run.rollout import run_episode

CHROMIUM = Path("/usr/bin/chromium")
SCENARIO, SEEDS = "single_trade", 14
HOSTILE = (
    "<script>document.title='PWNED';document.body.setAttribute('data-pwned','1')</script>"
    '<img src=x onerror="document.title=\'PWNED\'">"><a href="javascript:alert(1)">x</a>'
)


class Tags(HTMLParser):
    """Start tags with their attributes, and the text, as a browser's tokenizer sees them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def links(text: str) -> list[str]:
    return [a["href"] or "" for t, a in Tags(text).tags if t == "a" and "href" in a]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / SCENARIO
    args = ["run", SCENARIO, "--seeds", f"0:{SEEDS}", "--workers", "1", "--out", str(out)]
    assert cli([*args, "--no-progress"]) == 0
    return out


def test_run_writes_index_aggregates_and_sampled_pages(run_dir: Path) -> None:
    text = (run_dir / "report.html").read_text()
    episodes = episode_rows(read_rows(run_dir))
    assert [e.seed for e in episodes] == list(range(SEEDS))
    sampled = sample_seeds(episodes)
    assert sorted(int(p.stem) for p in (run_dir / "episodes").glob("*.html")) == sampled
    # every link is in-page or to a page that exists; every other recorded episode names the
    # command that writes its page
    hrefs = links(text)
    pages = [h for h in hrefs if not h.startswith("#")]
    assert pages == [f"episodes/{s}.html" for s in sampled]
    assert all((run_dir / h).is_file() for h in pages)
    for seed in set(range(SEEDS)) - set(sampled):
        assert f"<code>gpumarket report {run_dir} --episode {seed}</code>" in text
    assert {h for h in hrefs if h.startswith("#")} == {"#aggregate", "#index"}
    doc = Tags(text)
    index_rows = [a for t, a in doc.tags if t == "tr"]
    assert len(index_rows) >= SEEDS + 1  # the index's head and one row per episode
    assert 'data-plot="aggregate-returns"' in text and 'data-plot="welfare-by-seed"' in text
    assert "Conduct per agent" in text and "Agent health: no fallbacks" in text
    # the per-episode content is on the pages, not in the report
    assert 'class="round"' not in text and 'class="round"' in (run_dir / pages[0]).read_text()


def test_episode_page_on_demand_equals_the_sampled_page(run_dir: Path, tmp_path: Path) -> None:
    sampled = sample_seeds(episode_rows(read_rows(run_dir)))
    seed = sampled[-1]
    again = tmp_path / "again.html"
    assert cli(["report", str(run_dir), "--episode", str(seed), "-o", str(again)]) == 0
    assert again.read_bytes() == (run_dir / "episodes" / f"{seed}.html").read_bytes()
    # and it is the single-transcript page of that transcript, with everything it shows
    ep = episode_from(run_dir / "transcripts" / f"{seed}.jsonl")
    ep.source = f"transcripts/{seed}.jsonl"
    assert again.read_text() == build_report([ep])


def test_page_on_demand_of_an_unsampled_episode_gets_its_link(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    seed = max(set(range(SEEDS)) - set(sample_seeds(episode_rows(read_rows(folder)))))
    assert not (folder / "episodes" / f"{seed}.html").exists()
    assert cli(["report", str(folder), "--episode", str(seed)]) == 0
    assert (folder / "episodes" / f"{seed}.html").is_file()
    assert cli(["report", str(folder)]) == 0  # the run report again: now it links the page
    text = (folder / "report.html").read_text()
    assert f'href="episodes/{seed}.html"' in text
    assert f"--episode {seed}</code>" not in text
    capsys.readouterr()
    assert cli(["report", str(folder), "--episode", "999"]) == 2
    err = capsys.readouterr().err
    assert "no transcript for seed 999" in err and "Traceback" not in err
    assert cli(["report", str(folder / "transcripts"), "--episode", "1"]) == 2
    assert "--episode needs one run folder" in capsys.readouterr().err


def test_report_links_pages_relative_to_where_it_is_written(run_dir: Path, tmp_path: Path) -> None:
    """Links lead to the pages from wherever the report goes: beside the run folder, inside
    it, and among the pages themselves (no ``./`` prefix); a file named like a page that is
    not one (a folder) gets no link."""
    folder = tmp_path / "copy"
    shutil.copytree(run_dir, folder)
    *linked, last = sample_seeds(episode_rows(read_rows(folder)))
    (folder / "episodes" / f"{last}.html").unlink()
    (folder / "episodes" / f"{last}.html").mkdir()  # named like a page, but not a file
    for out, prefix in (
        (tmp_path / "report.html", "copy/episodes/"),
        (folder / "report.html", "episodes/"),
        (folder / "episodes" / "index.html", ""),
        (tmp_path / "a" / "b" / "r.html", "../../copy/episodes/"),
    ):
        report = write_run_report(folder, out=out, sample=False)
        hrefs = [h for h in links(report.path.read_text()) if not h.startswith("#")]
        assert hrefs == [f"{prefix}{s}.html" for s in linked], out
        assert all((out.parent / h).is_file() for h in hrefs)


def test_no_report_writes_no_report(tmp_path: Path) -> None:
    args = ["run", SCENARIO, "--seeds", "0:2", "--workers", "1", "--no-progress"]
    assert cli([*args, "--out", str(tmp_path / SCENARIO), "--no-report"]) == 0
    folder = tmp_path / SCENARIO
    assert not (folder / "report.html").exists() and not (folder / "episodes").exists()
    assert (folder / "transcripts" / "1.jsonl").is_file()
    # without transcripts the report is still written from the rows, with no page to link
    assert cli([*args, "--out", str(tmp_path / "b" / SCENARIO), "--no-transcripts"]) == 0
    text = (tmp_path / "b" / SCENARIO / "report.html").read_text()
    assert [h for h in links(text) if not h.startswith("#")] == []
    assert text.count("no transcript</span>") == 2


def test_fresh_run_removes_the_old_pages(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    shutil.copytree(run_dir, out / SCENARIO)
    stale = out / SCENARIO / "episodes" / "13.html"
    stale.write_text("stale")
    args = ["run", SCENARIO, "--seeds", "0:1", "--workers", "1", "--no-progress", "--fresh"]
    assert cli([*args, "--out", str(out / SCENARIO)]) == 0
    assert sorted(p.name for p in (out / SCENARIO / "episodes").iterdir()) == ["0.html"]


def test_sample_rule() -> None:
    welfare = [0.5, 0.4, 0.6, 0.5, 0.5, 0.5, 0.1, 0.9, 0.2, 0.95, 0.15, 0.8, math.nan, 0.99]
    eps = [EpisodeRow(s, welfare=w) for s, w in enumerate(welfare)]
    eps[12].fallbacks = 1  # flagged
    eps[4].timeouts = 1  # flagged, but among the first seeds already
    # first five: 0-4; lowest three: 6 (0.1), 10 (0.15), 8 (0.2); highest three: 13, 9, 7;
    # flagged: 4 and 12
    assert sample_seeds(eps) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13]
    assert sample_seeds(eps, first=0, extremes=1, flagged=0) == [6, 13]
    # ties on welfare go to the lower seed; the sample never depends on the rows' order
    tied = [EpisodeRow(s, welfare=0.5) for s in range(20)]
    assert sample_seeds(list(reversed(tied)), first=0, extremes=2, flagged=0) == [0, 1]
    flagged = [EpisodeRow(s, welfare=0.5, agent_errors=1) for s in range(20)]
    assert sample_seeds(flagged, first=0, extremes=0) == [0, 1, 2, 3, 4]


def row(seed: int, seat: str, ret: float, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": "market_round",
        "seed": seed,
        "seat": seat,
        "agent": "truthful",
        "return": ret,
        "components": {"job_value": ret + 1.0, "auction_payments": -1.0},
        "welfare_ratio": 0.25 * (seed + 1),
        "rounds": 5,
        "steps": 50,
        "conduct": {},
        **extra,
    }


def test_aggregates_match_the_hand_computation() -> None:
    rows = [
        row(0, "bidder_0", 1.0, conduct={"truthfulness": 0.5}),
        row(1, "bidder_0", 2.0, conduct={"truthfulness": 1.0, "manipulation_attempts": 2}),
        row(2, "bidder_0", 3.0, conduct=None),  # recorded before the conduct judge
    ]
    text = build_run_report(rows)
    # returns 1, 2, 3: mean 2, half-width t(0.975, 2) * s / sqrt(3) = 4.303 * 1 / 1.732 = 2.484
    assert '<td class="num">2 \u00b1 2.484</td>' in text
    assert '<td class="num">3 \u00b1 2.484</td>' in text  # job_value = return + 1
    assert '<td class="num">-1 \u00b1 0</td>' in text  # auction_payments
    # welfare 0.25, 0.5, 0.75: mean 0.5, half-width 4.303 * 0.25 / 1.732 = 0.621
    assert "welfare ratio: 0.500 \u00b1 0.621" in text
    # conduct: truthfulness over the two judged seat-episodes (0.5 + 1.0) / 2; manipulation 2 / 2
    assert "0.750 (n=2)" in text and '<td class="num">1.00</td>' in text


def test_hostile_rows_render_inert() -> None:
    rows = [
        row(
            s,
            f"bidder_0{HOSTILE}",
            1.0,
            agent=f"llm:{HOSTILE}",
            scenario=HOSTILE,
            fallbacks=1,
            decisions=3,
            first_error=HOSTILE,
            components={f"part {HOSTILE}": 1.0},
        )
        for s in range(3)
    ]
    text = build_run_report(rows, {0: "episodes/0.html"}, f"runs/{HOSTILE}", {0, 1})
    doc = Tags(text)
    names = {t for t, _ in doc.tags}
    assert not names & {"script", "img", "iframe", "object", "embed", "base", "form"}
    assert "<script" not in text.lower() and "<img" not in text.lower()
    for tag, attrs in doc.tags:
        for name, value in attrs.items():
            assert not name.startswith("on") and name not in ("src", "srcdoc", "style"), tag
            if name in ("href", "xlink:href", "action", "formaction"):  # a title is inert text
                assert "javascript:" not in (value or "").lower(), (tag, name, value)
    assert links(text) == ["#aggregate", "#index", "episodes/0.html"]
    shown = "".join(doc.text)
    assert HOSTILE in shown  # seat, agent, error and command are shown, as text
    assert f"gpumarket report runs/{HOSTILE} --episode 1" in shown
    assert "Agent failures" in text  # every decision fell back: the health box is red


def test_report_size_does_not_grow_with_episode_content(tmp_path: Path) -> None:
    small = build_run_report(synthetic_rows(200))
    # the same rows whose episodes had ten times the steps and rounds: same size within digits
    big_rows = [
        {**r, "steps": r["steps"] * 10, "rounds": r["rounds"] * 10} for r in synthetic_rows(200)
    ]
    assert abs(len(build_run_report(big_rows)) - len(small)) < 200 * 4
    # and it grows with the episodes by about one index row each (well under 5 MB at 3,000)
    per_episode = (len(build_run_report(synthetic_rows(400))) - len(small)) / 200
    assert per_episode < 5e6 / 3000, per_episode


def test_bench_section_reports_seconds_and_size() -> None:
    result = section_report(quick_config())
    names = [m["name"] for m in result.metrics]
    assert names == ["report.20_episodes.seconds", "report.20_episodes.mb"]
    assert result.details["20"]["mb"] > 0.01 and result.details["20"]["seconds"] > 0
    assert json.dumps(result.details)  # plain data, for --json


@pytest.mark.slow
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is not installed (apt-get install -y chromium chromium-driver)",
)
def test_run_report_and_its_page_in_headless_chromium(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    (folder / "transcripts").mkdir(parents=True)
    run_episode(SCENARIO, 0, transcript=folder / "transcripts" / "0.jsonl")
    rows = [row(s, f"bidder_0{HOSTILE}", 1.0, agent=HOSTILE, first_error=HOSTILE) for s in (0, 1)]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_run_report(folder)
    assert [p.name for p in report.pages] == ["0.html"]
    for page in (report.path, *report.pages):
        proc = subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / ('profile-' + page.stem)}",
                "--virtual-time-budget=2000",
                "--dump-dom",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        dom = proc.stdout
        assert proc.returncode == 0 and "<html" in dom, proc.stderr[-2000:]
        assert re.findall(r"<title>(.*?)</title>", dom)[0].startswith("gpumarket")
        assert "PWNED" not in re.findall(r"<title>(.*?)</title>", dom)[0]
        assert 'data-pwned="1"' not in dom
    dom_links = links(report.path.read_text())
    assert "episodes/0.html" in dom_links and (folder / "episodes" / "0.html").is_file()


def test_sampled_pages_written_by_several_workers_are_the_ones_one_process_writes(
    tmp_path: Path,
) -> None:
    """``workers`` spreads the sampled episodes' pages over processes (forced here: these pages
    are too quick to be worth a pool, see the next test): the same pages (byte for byte) and the
    same report as one process writes."""
    folder = tmp_path / "run"
    (folder / "transcripts").mkdir(parents=True)
    seeds = range(4)
    for seed in seeds:
        run_episode(SCENARIO, seed, transcript=folder / "transcripts" / f"{seed}.jsonl")
    rows = [row(s, "bidder_0", float(s)) for s in seeds]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written, writers = {}, {}
    for workers in (1, 3):
        # a fresh interpreter: one thread, so the pages really go to a pool of processes; each
        # page's writer notes its process id (forked pool workers inherit the wrapper)
        pids = tmp_path / f"pids{workers}.txt"
        code = (
            "import os, sys; from market.review.report import run_page as rp; "
            "rp.POOL_AFTER_S = 0.0; write = rp.write_episode_page\n"
            "def noted(*a):\n"
            f"    open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); return write(*a)\n"
            "rp.write_episode_page = noted\n"
            f"r = rp.write_run_report(sys.argv[1], out=sys.argv[2], workers={workers})\n"
            "print(os.getpid(), ' '.join(str(p) for p in r.pages))"
        )
        out = tmp_path / f"report{workers}.html"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(folder), str(out)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        own, *paths = proc.stdout.split()
        pages = [Path(p) for p in paths]
        writers[workers] = set(pids.read_text().split()) - {own}
        written[workers] = (
            [p.name for p in pages],
            [p.read_bytes() for p in pages],
            out.read_text().replace(f"report{workers}", "report"),
        )
    assert len(written[1][0]) == 4  # every episode of so small a run is in the sample
    assert written[3] == written[1]
    assert not writers[1] and writers[3]  # one process wrote all; then the pool wrote some


def test_quick_pages_are_written_without_a_pool(tmp_path: Path, monkeypatch: Any) -> None:
    """A pool starts only when writing the pages here would take over POOL_AFTER_S, as
    estimated from the first page: none for quick pages, one for slow ones."""
    pools: list[int] = []

    class NoPool:
        def __init__(self, work: Any, n: int) -> None:
            self.work = work
            pools.append(n)

        def __enter__(self) -> NoPool:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def imap_unordered(self, jobs: list[Any]) -> Any:
            return reversed([(p, self.work(job)) for p, job in enumerate(jobs)])

        def close(self) -> None:
            pass

    monkeypatch.setattr(run_page, "WorkerPool", NoPool)
    monkeypatch.setattr(run_page.threading, "active_count", lambda: 1)  # as in the CLI
    monkeypatch.setattr(run_page, "write_episode_page", lambda run_dir, seed: Path(f"{seed}.html"))
    # the first page takes 0.01 s, then 0.3 s, then 5 s
    ticks = iter([0.0, 0.01, 10.0, 10.3, 20.0, 25.0])
    clock = ticks.__next__
    quick = run_page.write_pages(tmp_path, [1, 2, 3, 4], workers=4, clock=clock)
    assert [p.name for p in quick] == ["1.html", "2.html", "3.html", "4.html"] and pools == []
    slow = run_page.write_pages(tmp_path, [5, 6, 7], workers=8, clock=clock)  # 2 x 0.3 > 0.5 s
    assert [p.name for p in slow] == ["5.html", "6.html", "7.html"] and pools == [2]
    alone = run_page.write_pages(tmp_path, [8, 9, 10], workers=1, clock=clock)
    assert [p.name for p in alone] == ["8.html", "9.html", "10.html"]
    assert pools == [2]  # one worker: never a pool
