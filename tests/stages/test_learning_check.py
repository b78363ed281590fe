"""benchmarks/learning.py's final check: every model measured under the same params, paired."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import learning  # noqa: E402


def test_the_final_check_pairs_models_as_episodes_under_its_overrides(warm_copy, tmp_path):
    from closedloop.workspace import Workspace

    root = warm_copy(tmp_path / "ws")
    warm = Workspace.at(root).warmstart_model
    # The warm start against itself: same tasks, same seed, so every paired difference is exactly 0.
    check = learning.final_check(root, {"itself": warm}, samples=2, rounds=2,
                                 overrides=["sample.trim_transcript=true"], saved=tmp_path / "measured")

    assert check["itself"]["pass@1"] == check["warm_start"]
    assert all(d["diff"] == 0 for d in check["itself"]["vs_warm_start"].values())
    assert all(d["diff"] == 0 for d in check["itself"]["round_1_vs_warm_start_round_1"].values())
    assert check["itself"]["round_1"] == check["warm_start_round_1"]
    assert set(check["warm_start"]) | {"in-distribution", "heldout"} == set(check["itself"]["rounds_vs_round_1"])
    assert 0.0 <= check["itself"]["correction_rate"]["rate"] <= 1.0
    assert [len(check["by_round"][name]) for name in ("warm_start", "itself")] == [2, 2]
    assert check["by_round"]["itself"][-1] == check["itself"]["pass@1"]
    assert check["by_round"]["itself"][0] == check["itself"]["round_1"]
    learning.plot_rounds(check["by_round"], tmp_path / "rounds.png")
    assert (tmp_path / "rounds.png").read_bytes()[:4] == b"\x89PNG"

    # Measured once, kept: a later check of the same models under the same settings reads them back,
    # and one under other settings measures again.
    saved = sorted(path.name for path in (tmp_path / "measured").iterdir())
    assert saved == ["itself.json", "warm_start.json"]
    stamps = {path: path.stat().st_mtime_ns for path in (tmp_path / "measured").iterdir()}
    again = learning.final_check(root, {"itself": warm}, samples=2, rounds=2,
                                 overrides=["sample.trim_transcript=true"], saved=tmp_path / "measured")
    assert again == check
    assert all(path.stat().st_mtime_ns == stamp for path, stamp in stamps.items())
    learning.final_check(root, {"itself": warm}, samples=1, rounds=2, saved=tmp_path / "measured")
    assert all(path.stat().st_mtime_ns != stamp for path, stamp in stamps.items())


def test_an_override_of_a_key_the_params_lack_is_refused_by_name(warm_copy, tmp_path):
    root = warm_copy(tmp_path / "ws")
    assert learning.overridden(root, ["sample.trim_transcript=true"]).sample.trim_transcript is True
    with pytest.raises(ValueError, match="trim_transcripts"):
        learning.overridden(root, ["sample.trim_transcripts=true"])
