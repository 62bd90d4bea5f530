"""The results page's aggregate (IQM, bootstrap interval) and benchmarks/results.py's rows,
against hand-computed values, on run directories written here."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from trellis.builders.experiments import curves
from trellis.builders.experiments.aggregate import (
    bootstrap_ci,
    interquartile_mean,
    quartile_weights,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def results() -> Iterator[ModuleType]:
    """benchmarks/results.py as a module (it imports its sibling `common` by name)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "results_benchmark", os.path.join(REPO, "benchmarks", "results.py"))
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # Its dataclass looks its module up there.
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("results_benchmark", None)
        sys.path.remove(os.path.join(REPO, "benchmarks"))


def test_interquartile_mean_by_hand():
    # Four scores: the middle two, as scipy's trim_mean(x, 0.25) (rliable's IQM).
    assert interquartile_mean([4.0, 1.0, 100.0, 2.0]) == pytest.approx((2 + 4) / 2)
    # Three: each holds a third of the mass; [1/4, 3/4] takes 1/12 of each outer one and all of
    # the middle one: (1 * 1 + 4 * 2 + 1 * 30) / 6.
    assert interquartile_mean([30.0, 1.0, 2.0]) == pytest.approx(39 / 6)
    # Eight: the middle four.
    assert interquartile_mean(np.arange(8.0)) == pytest.approx((2 + 3 + 4 + 5) / 4)
    assert interquartile_mean([7.0]) == 7.0
    np.testing.assert_allclose(quartile_weights(5), [0, 0.3, 0.4, 0.3, 0])
    # Along an axis: runs on axis 0, a curve's points kept.
    np.testing.assert_allclose(interquartile_mean(np.array([[1.0, 2], [3, 4], [5, 60]])),
                               [3.0, (2 + 16 + 60) / 6])


def test_one_outlier_moves_the_iqm_less_than_the_mean():
    scores = np.array([100.0, 101, 102, 103, 104, 105, 106, 107])
    spoiled = scores.copy()
    spoiled[-1] = 10_000.0
    assert interquartile_mean(spoiled) == interquartile_mean(scores)
    assert spoiled.mean() > scores.mean() + 1000


def test_bootstrap_interval_by_hand():
    # Two runs, 0 and 1: a resample is (0, 0), (1, 1) (IQM 0 and 1, a quarter each) or mixed
    # (IQM 0.5, half): the 2.5% and 97.5% quantiles are 0 and 1.
    low, high = bootstrap_ci([0.0, 1.0])
    assert (low, high) == (0.0, 1.0)
    # A 40% interval's ends, the 30% and 70% quantiles, both fall in the mixed half: 0.5.
    assert bootstrap_ci([0.0, 1.0], level=0.4) == (0.5, 0.5)
    # All runs alike: no spread.
    assert bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)


def test_bootstrap_interval_matches_every_resample():
    """Three runs have 27 equally likely resamples: the interval's ends are the quantiles of
    their IQMs, computed here by enumeration (levels whose quantiles sit well inside one
    value's share of the 27, so that sampling cannot cross to the next)."""
    scores = np.array([10.0, 200.0, 470.0])
    every = np.array([interquartile_mean(scores[list(p)])
                      for p in itertools.product(range(3), repeat=3)])
    for level in (0.95, 0.8, 0.5):
        low, high = bootstrap_ci(scores, level=level, resamples=20_000)
        exact = np.quantile(every, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
        assert (low, high) == pytest.approx(tuple(exact)), level
    # By hand for 80%: 1 of the 27 resamples is all 10s (IQM 10), 3 have IQM 41.67
    # ((10 + 4 * 10 + 200) / 6), so the 10% quantile is 41.67; the 90% one is 425.
    assert bootstrap_ci(scores, level=0.8) == pytest.approx((250 / 6, 425.0))
    # Reproducible: the same seed, the same interval.
    assert bootstrap_ci(scores) == bootstrap_ci(scores)


def test_bootstrap_interval_per_curve_point():
    curves = np.array([[0.0, 1.0], [0.0, 3.0], [0.0, 5.0]])  # [seeds, points]
    low, high = bootstrap_ci(curves)
    assert low.shape == high.shape == (2,)
    assert low[0] == high[0] == 0.0
    assert 1.0 <= low[1] < high[1] <= 5.0


def test_bad_input_speaks():
    with pytest.raises(ValueError, match="at least 1 score"):
        quartile_weights(0)
    with pytest.raises(ValueError, match=r"in \(0, 1\)"):
        bootstrap_ci([1.0, 2.0], level=95)


def _write_run(root: str, seed: int, returns: list[tuple[int, float | None]],
               agent: str = "ppo", total: int = 300, members: int = 0) -> str:
    """A finished run directory: config.json, summary.json and one metrics record per
    (env steps, return)."""
    path = os.path.join(root, f"{agent}-seed{seed}")
    os.makedirs(path)
    argv = [f"--agent={agent}", "--env=CartPole-v1", "--platform=local_mt", "--seed", str(seed),
            f"--logdir={path}", "--quiet", f"--total_env_steps={total}"]
    config = {"command_line": {"agent": agent, "env": "CartPole-v1", "platform": "local_mt"},
              "experiment": {"seed": seed, "total_env_steps": total, "return_window": 100},
              "agent_config": {},
              "run": {"created": "2026-11-29T01:00:00", "git_commit": "abcdef0123",
                      "versions": {"jax": "0.10.2"}, "sessions": [{"argv": argv}]}}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for steps, value in returns:
            record: dict[str, Any] = {"env_steps": steps, "return_mean": value}
            record.update({f"member/{m}/return_mean": value + m for m in range(members)
                           if value is not None})
            f.write(json.dumps(record) + "\n")
    last = returns[-1][0]
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"env_steps": last, "stopped_by": "budget", "wall_time_s": 10.0 + seed,
                   "env_steps_per_s": 100.0 * seed}, f)
    return path


def test_rows_from_run_directories(results, tmp_path):
    root = str(tmp_path)
    dirs = [_write_run(root, seed, [(0, None), (100, 10.0 * seed), (310, 100.0 * seed)])
            for seed in (1, 2, 3)]
    dirs.append(_write_run(root, 1, [(0, None), (300, 7.0)], agent="impala"))
    page, store = os.path.join(root, "results.md"), os.path.join(root, "results.json")
    flags = ["--results", store, "--page", page, "--machine", "a test machine"]
    assert results.main(["add", *dirs, *flags]) == 2  # impala has 1 seed: a row needs 3.
    assert not os.path.exists(store)
    assert results.main(["add", *dirs, *flags, "--min_seeds=1"]) == 0
    rows = json.load(open(store))["rows"]
    assert [r["agent"] for r in rows] == ["ppo", "impala"]
    ppo = rows[0]
    # The first record at or past the budget (300): 310 env steps.
    assert ppo["scores"] == {"1": 100.0, "2": 200.0, "3": 300.0}
    assert ppo["iqm"] == pytest.approx((100 + 4 * 200 + 300) / 6)
    assert ppo["ci95"][0] < ppo["iqm"] < ppo["ci95"][1]
    assert ppo["command"] == ["--agent=ppo", "--env=CartPole-v1", "--platform=local_mt",
                              "--total_env_steps=300"]
    assert ppo["wall_time_s"] == 12.0 and ppo["env_steps_per_s"] == 200
    text = open(page).read()
    assert "| ppo | CartPole-v1 | local_mt | 300 | 200 [100, 300] |" in text
    assert "1: 100, 2: 200, 3: 300" in text and "1. a test machine" in text
    assert "--seeds=1,2,3 --budget=300" in text
    # Another budget is another row; the same command and budget again replaces its row.
    assert results.main(["add", *dirs[:3], *flags, "--budget=100"]) == 0
    assert results.main(["add", *dirs[:3], *flags, "--budget=100"]) == 0
    rows = json.load(open(store))["rows"]
    assert [(r["agent"], r["budget"]) for r in rows] == [
        ("ppo", 300), ("impala", 300), ("ppo", 100)]
    assert rows[2]["scores"] == {"1": 10.0, "2": 20.0, "3": 30.0}
    # render writes the same page from the stored rows.
    os.remove(page)
    assert results.main(["render", "--results", store, "--page", page]) == 0
    assert results.render(rows) == open(page).read()


def test_a_population_gives_a_score_per_member(results, tmp_path):
    path = _write_run(str(tmp_path), 4, [(0, None), (300, 50.0)], members=3)
    row = results.make_row([results.read_run(path)], None, "m", None)
    assert row["scores"] == {"4/member 0": 50.0, "4/member 1": 51.0, "4/member 2": 52.0}


def test_bad_runs_speak(results, tmp_path, capsys):
    root = str(tmp_path)
    short = _write_run(root, 1, [(0, None), (120, 5.0)], total=300)
    store, page = os.path.join(root, "r.json"), os.path.join(root, "r.md")
    assert results.main(["add", short, "--results", store, "--page", page,
                         "--min_seeds=1"]) == 2
    assert "short of the budget 300" in capsys.readouterr().err
    twice = os.path.join(root, "again")
    os.makedirs(twice)
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        with open(os.path.join(short, name)) as src, open(os.path.join(twice, name), "w") as dst:
            dst.write(src.read())
    assert results.main(["add", short, twice, "--budget=100", "--results", store, "--page",
                         page, "--min_seeds=1"]) == 2
    assert "repeats seed 1" in capsys.readouterr().err
    assert results.main(["add", root, "--results", store, "--page", page]) == 2
    assert "not a finished run directory" in capsys.readouterr().err
    assert not os.path.exists(store) and not os.path.exists(page)


def test_row_command_drops_each_seeds_flags(results):
    assert results.row_command(["--agent=ppo", "--seed", "3", "--logdir=/x", "--quiet",
                                "--quiet=true", "--num_seeds=4", "--seed=2"]) == (
        "--agent=ppo", "--num_seeds=4")


def test_plot_runs_draws_the_seeds_iqm_and_interval(tmp_path, monkeypatch):
    """launch/plot.py's figure of several seeds: the IQM line and the bootstrap band."""
    plt = curves._pyplot()
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    dirs = []
    for seed, scale in ((1, 1.0), (2, 2.0), (3, 10.0)):
        path = tmp_path / f"seed{seed}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps(
            {"command_line": {"agent": "ppo", "env": "CartPole-v1"},
             "experiment": {"seed": seed, "return_window": 100}}))
        (path / "metrics.jsonl").write_text("".join(
            json.dumps({"env_steps": 100 * i, "return_mean": scale * i}) + "\n"
            for i in range(5)))
        dirs.append(str(path))
    curves.plot_runs(dirs, str(tmp_path / "curves.png"))
    (fig,) = kept
    (line,) = fig.axes[0].get_lines()
    assert "IQM of 3 seeds, 95% CI" in line.get_label()
    xs, ys = line.get_data()
    # At 400 env steps the seeds are at 4, 8 and 40: IQM (4 + 4 * 8 + 40) / 6.
    assert xs[-1] == 400 and ys[-1] == pytest.approx(76 / 6)
    (band,) = fig.axes[0].collections
    low, high = bootstrap_ci([4.0, 8.0, 40.0])
    top = band.get_paths()[0].vertices[:, 1]
    assert top.min() == pytest.approx(0.0) and top.max() == pytest.approx(high)
    assert low < ys[-1] < high
    plt.close(fig)
