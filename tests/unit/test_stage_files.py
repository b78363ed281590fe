"""What a stage leaves beside its outputs: numbers in its metrics file, the rest in its info file,
its timing in a metrics file of its own (closedloop/stage_files.py, written by run_stage)."""

import json

import pytest

from closedloop.io import read_json
from closedloop.stage_files import TIMING_KEYS, merge, split_numbers, split_rates, stage_result


def _numbers_only(data) -> bool:
    if isinstance(data, dict):
        return all(_numbers_only(value) for value in data.values())
    return isinstance(data, (int, float))


class TestSplitNumbers:
    @pytest.mark.parametrize("data, numbers, rest", [
        # a flat mix: the number stays, the string and the list leave
        ({"samples": 20, "backend": "hf", "settings_mismatches": ["top_p"]},
         {"samples": 20}, {"backend": "hf", "settings_mismatches": ["top_p"]}),
        # booleans are numbers to DVC (shown, and diffed as 0/1); null is not
        ({"trained": False, "untrained_reason": None}, {"trained": False}, {"untrained_reason": None}),
        # a nested dict with both kinds is on both sides, each with its own leaves
        ({"per_env": {"code": {"pass_rate": 0.5, "isolation": "jail"}}},
         {"per_env": {"code": {"pass_rate": 0.5}}}, {"per_env": {"code": {"isolation": "jail"}}}),
        # an empty dict (train's replay with no versions) stays with the numbers
        ({"replay": {}}, {"replay": {}}, {}),
        # a dict of strings goes whole to the rest
        ({"feedback_sources": {"verifier:code": "3f2a"}}, {}, {"feedback_sources": {"verifier:code": "3f2a"}}),
        # a list of numbers is still a list: DVC refuses it in a metrics file
        ({"losses": [0.5, 0.4]}, {}, {"losses": [0.5, 0.4]}),
    ])
    def test_split(self, data, numbers, rest):
        assert split_numbers(data) == (numbers, rest)
        assert _numbers_only(numbers)

    @pytest.mark.parametrize("data", [
        {"mode": "rft", "examples": {"positive": 3, "fix": 0}, "replay": {}, "trained": True,
         "untrained_reason": None, "model_version": "ab12"},
        {"a": {"b": {"c": 1, "d": "x", "e": {}}, "f": [1, {"g": 2}]}},
    ])
    def test_merge_gives_back_what_the_stage_returned(self, data):
        assert merge(*split_numbers(data)) == data


class TestSplitRates:
    @pytest.mark.parametrize("numbers, kept, rates", [
        # throughput is measured against the wall clock: it goes with the timing
        ({"samples": 20, "tokens_per_s": 1525.8}, {"samples": 20}, {"tokens_per_s": 1525.8}),
        # a dict of rates (per environment) becomes flat keys
        ({"verifications_per_s": {"code": 13.9, "data": 2.8}}, {},
         {"verifications_per_s/code": 13.9, "verifications_per_s/data": 2.8}),
        # a rate inside a section keeps its section in its name; the section's other figures stay
        ({"train": {"steps": 2, "tokens_per_s": 9.5}}, {"train": {"steps": 2}}, {"train/tokens_per_s": 9.5}),
        # a name that only contains the suffix is not a rate
        ({"per_slice": {"code/core": 2}}, {"per_slice": {"code/core": 2}}, {}),
    ])
    def test_split(self, numbers, kept, rates):
        assert split_rates(numbers) == (kept, rates)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The generate stage run through run_stage on a workspace of tiny params (no model needed)."""
    import yaml

    from closedloop.stages.common import run_stage
    from tests.tiny import TINY

    root = tmp_path_factory.mktemp("stagefiles")
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    return root, run_stage("generate", root)


def test_run_stage_writes_numbers_info_and_timing_apart(generated):
    root, returned = generated
    metrics = read_json(root / "metrics/generate.json")
    assert metrics["tasks"] == 10 and _numbers_only(metrics)
    assert "seconds" not in metrics  # timing has a file of its own
    timing = read_json(root / "metrics/timing/generate.json")
    assert set(TIMING_KEYS) <= set(timing)
    assert all(key in (*TIMING_KEYS, "gpu_peak_mb") or key.endswith("_per_s") for key in timing)
    assert all(isinstance(value, float) for value in timing.values())
    assert 0 <= timing["seconds"] < 600 and timing["cpu_seconds"] >= 0 and timing["peak_rss_mb"] > 10
    assert read_json(root / "metrics/info/generate.json") == {}  # generate says nothing but numbers
    # the flows read the wall clock from the return value
    assert returned["seconds"] == timing["seconds"] and returned["timing"] == timing
    assert stage_result(root, "generate") == {key: value for key, value in returned.items()
                                              if key not in ("seconds", "timing")}


def test_gpu_figure_only_where_cuda_was_initialised(generated):
    root, _ = generated
    import sys

    timing = read_json(root / "metrics/timing/generate.json")
    torch = sys.modules.get("torch")
    initialised = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    assert ("gpu_peak_mb" in timing) is initialised


def test_stage_result_of_a_stage_that_never_ran_is_empty(tmp_path):
    assert stage_result(tmp_path, "train") == {}


def test_stage_result_puts_info_back(tmp_path):
    (tmp_path / "metrics/info").mkdir(parents=True)
    (tmp_path / "metrics/train.json").write_text(json.dumps({"trained": False, "examples": {"positive": 0}}))
    (tmp_path / "metrics/info/train.json").write_text(json.dumps({"mode": "rft", "untrained_reason": "x"}))
    assert stage_result(tmp_path, "train") == {"trained": False, "examples": {"positive": 0}, "mode": "rft",
                                               "untrained_reason": "x"}
