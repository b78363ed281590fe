"""benchmarks/eval_noise.py: the evaluation's variance split into task difficulty and sampling."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from eval_noise import band, variance_parts  # noqa: E402


def _draws(rates: list[float], samples: int, rng: random.Random) -> list[float]:
    return [sum(rng.random() < p for _ in range(samples)) / samples for p in rates]


def test_the_split_recovers_how_much_tasks_differ_and_how_much_is_sampling():
    rng = random.Random(0)
    alike = _draws([0.5] * 4000, 4, rng)  # every task the same: all of the variance is sampling
    between, sampling = variance_parts(alike, 4)
    assert between == pytest.approx(0.0, abs=0.004) and sampling == pytest.approx(0.25 / 4, rel=0.05)
    spread = _draws([rng.choice([0.0, 1.0]) for _ in range(4000)], 4, rng)  # solved or not: no sampling noise
    between, sampling = variance_parts(spread, 4)
    assert sampling == 0.0 and between == pytest.approx(0.25, rel=0.05)


def test_more_samples_narrow_only_the_sampling_part_and_pairing_removes_the_tasks_difficulty():
    rng = random.Random(1)
    rates = [rng.random() for _ in range(400)]
    pairs = list(zip(_draws(rates, 4, rng), _draws(rates, 4, rng)))  # two evaluations of one model
    bands = {at: band({"all": pairs}, 4, at, 2.0)["all"] for at in (1, 4, 32)}
    assert bands[1][0] > bands[4][0] > bands[32][0] > 0.5 * bands[4][0]  # difficulty stays whatever the samples
    assert all(paired < gate for gate, paired in bands.values())
    assert bands[32][1] < 0.4 * bands[4][1]  # the paired band is sampling alone: it keeps shrinking
