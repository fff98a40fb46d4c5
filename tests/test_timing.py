"""Speed figures (app/timing.py): undrafted and drafted runs timed in turn, and figures whose repeats disagree past
the limit marked unreliable, in `bench` and in `run`'s gate, human and --json. No assertion here reads a clock: the
order of the runs is recorded, and the limit is set below 1 where a test needs figures marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures import build_dflash, build_draft_model, build_target
from typer.testing import CliRunner

from specpair.app import timing
from specpair.app.timing import Spread, alternate, in_turn, spread
from specpair.cli import app

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_runs_alternate_ab_ba():
    order: list[str] = []

    def first() -> str:
        order.append("a")
        return "A"

    def second() -> str:
        order.append("b")
        return "B"

    assert in_turn(first, second, 0) == ("A", "B") and in_turn(first, second, 1) == ("A", "B")
    assert order == ["a", "b", "b", "a"]
    order.clear()
    assert alternate(first, second, 3) == (["A"] * 3, ["B"] * 3)
    assert order == ["a", "b", "b", "a", "a", "b"]


def test_the_spread_is_max_over_min_and_judged_against_the_limit():
    assert spread([10.0, 8.0, None, 12.5]) == 12.5 / 8.0 and spread([3.0]) is None and spread([]) is None
    steady = Spread.of([10.0, 10.5, 11.0], [20.0, 21.0, 22.0])
    assert steady.repeats == 3 and steady.reliable and steady.warning() == ""
    noisy = Spread.of([4.7, 1.3], [5.8, 5.9])  # issue 25: 4.7 vs 1.3 tok/s in one run
    assert not noisy.reliable and noisy.worst == 4.7 / 1.3
    assert "repeats disagree up to 3.62× (max/min; limit 1.25×)" in noisy.warning()
    assert noisy.to_json() == {
        "repeats": 2,
        "spread": {"undrafted": 4.7 / 1.3, "drafted": 5.9 / 5.8},
        "limit": timing.SPREAD_LIMIT,
        "reliable": False,
    }
    both = Spread.across([([10.0, 10.2], [1.0, 1.1]), ([3.0, 6.0, 4.0], [2.0])])
    assert (both.repeats, both.undrafted, both.drafted) == (2, 2.0, 1.1 / 1.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("timing")
    target = build_target(root / "target", "qwen3", layers=2)
    dflash = build_dflash(
        root / "dflash", target_layer_ids=[0, 1], num_target_layers=2, flavour="qwen3", layers=1, block_size=4
    )
    return target, build_draft_model(root / "draft"), dflash


def recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'u' for every undrafted generation, 'd' for every drafted one, in the order they run."""
    from specpair.runtime import generate, speculative

    calls: list[str] = []
    plain, drafted = generate.generate, speculative.speculative_generate

    def undrafted_run(*args, **kwargs):
        calls.append("u")
        return plain(*args, **kwargs)

    def drafted_run(*args, **kwargs):
        calls.append("d")
        return drafted(*args, **kwargs)

    monkeypatch.setattr(generate, "generate", undrafted_run)
    monkeypatch.setattr(speculative, "speculative_generate", drafted_run)
    return calls


def test_bench_times_each_row_in_turn_and_marks_rows_past_the_limit(models, monkeypatch):
    target, draft, _ = models
    calls = recorded(monkeypatch)
    monkeypatch.setattr(timing, "SPREAD_LIMIT", 0.99)  # below any max/min: every row with two runs is marked
    args = ["bench", str(target), str(draft), "--depth", "0", "--users", "1", "--tokens", "16", "--device", "cpu"]
    done = CliRunner().invoke(app, [*args, "--json", "--quiet"])
    assert done.exit_code == 0, done.output
    # after the warm-up's one each: two rows, ABBA AB, each run a call per batch of the row's prompts (the users
    # row runs the built-in prompts one at a time, the depth row one sequence)
    turns, batches = ["u", "d", "d", "u", "u", "d"], (len(calls) - 2 - 6) // 6
    assert batches > 1 and calls[2:] == [x for x in turns for _ in range(batches)] + turns
    for row in json.loads(done.stdout)["users"] + json.loads(done.stdout)["depth"]:
        t = row["timing"]
        assert t["repeats"] == 3 and t["limit"] == 0.99 and t["reliable"] is False
        assert t["spread"]["undrafted"] >= 1 and t["spread"]["drafted"] >= 1
    done = CliRunner().invoke(app, [*args, "--md", "--quiet"])
    assert done.exit_code == 0, done.output
    assert "| repeats max/min |" in done.stdout and done.stdout.count(" UNRELIABLE |") == 2
    assert "each figure the median of 3 runs, undrafted and drafted in turn" in done.stdout
    assert "more than 0.99× (max/min) make a row UNRELIABLE: 2 of 2 rows are" in done.stdout


def test_the_gate_alternates_its_runs_and_says_when_its_speed_is_unreliable(models, monkeypatch):
    target, _, dflash = models
    calls = recorded(monkeypatch)
    args = ["run", str(target), str(dflash), "--max-tokens", "16", "--batch", "1", "--device", "cpu"]
    done = CliRunner().invoke(app, [*args, "--temperature", "0", "--json", "--quiet"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    runs = len(report["runs"][0]["prompts"])
    assert runs >= 2 and calls[2:] == ["u", "d", "d", "u"] * (runs // 2) + ["u", "d"] * (runs % 2)
    assert report["timing"]["repeats"] == runs and report["timing"]["limit"] == timing.SPREAD_LIMIT
    monkeypatch.setattr(timing, "SPREAD_LIMIT", 0.99)
    done = CliRunner().invoke(app, [*args, "--temperature", "0", "--json", "--quiet"])
    report = json.loads(done.stdout)
    assert report["timing"]["reliable"] is False and "speed unreliable" in report["summary"]
    worst = max(x for x in report["timing"]["spread"].values() if x is not None)
    assert f"disagree up to {worst:.2f}× (max/min; limit 0.99×)" in report["summary"]
    done = CliRunner().invoke(app, [*args, "--temperature", "0"])  # human: the setting's line and the summary
    assert done.exit_code == 0 and done.output.count("speed unreliable: its ") == 2, done.output
