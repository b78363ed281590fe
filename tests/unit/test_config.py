"""params.yaml: one typed tree that fails loudly, naming the key."""

import pytest
import yaml

from closedloop.config import ConfigError, Params, default_params_yaml, load_params, parse_params, write_params


class TestParse:
    @pytest.mark.parametrize(
        "data, named",
        [
            ({"sample": {"kk": 8}}, "sample.kk: unknown key"),  # a typo is not silently ignored
            ({"sampel": {}}, "sampel: unknown key"),  # nor a misspelled section
            ({"sample": {"k": "eight"}}, "sample.k"),  # wrong type
            ({"sample": {"k": 0}}, "sample.k"),  # out of range
            ({"model": {"builtin": {"hidden_size": 30, "num_heads": 4}}}, "model.builtin.hidden_size (30)"),
            ({"reward": {"weights": {"speed": 1.0}}}, "reward.weights: unknown key"),  # weights are per environment now
            ({"envs": {"code": {"weights": {"syntax": 1.0, "runs": -1.0}}}}, "weights must not be negative"),
            ({"envs": {"custom": {"code": {"entry": "m:C"}}}}, "built-in environment names"),
            ({"envs": {"custom": {"mine": {}}}}, "envs.custom.mine.entry"),
            ({"monitors": {"block_promotion": ["canry"]}}, "monitors.block_promotion: Value error, unknown monitor 'canry'"),
            ({"monitors": {"thresholds": {"drift": {"warn": 0.1}}}}, "monitors.thresholds: Value error, unknown monitor 'drift'"),
            # a warn-only monitor (fail: null) can never hold the gate: refused, naming the threshold to set
            ({"monitors": {"block_promotion": ["reward_shift"]}}, "set monitors.thresholds.reward_shift.fail"),
            ({"monitors": {"block_promotion": ["canary"], "thresholds": {"canary": {"warn": 0, "fail": None}}}},
             "set monitors.thresholds.canary.fail"),
            ([1, 2], "expected a mapping"),
        ],
    )
    def test_rejects_with_the_key_named(self, data, named):
        with pytest.raises(ConfigError) as error:
            parse_params(data, "params.yaml")
        assert named in str(error.value)
        assert "params.yaml" in str(error.value)

    def test_empty_file_means_defaults(self):
        assert parse_params(None) == Params()

    def test_stage_seeds_differ_by_stage_and_iteration(self):
        a = Params()
        b = Params(loop={"iteration": 1})
        assert a.stage_seed("sample") != a.stage_seed("generate")
        assert a.stage_seed("sample") != b.stage_seed("sample")
        assert a.stage_seed("warmstart", False) == b.stage_seed("warmstart", False)


class TestFiles:
    def test_default_yaml_round_trips(self, tmp_path):
        (tmp_path / "params.yaml").write_text(default_params_yaml())
        assert load_params(tmp_path) == Params()
        assert "# Samples per task." in default_params_yaml()

    def test_missing_file_names_the_path(self, tmp_path):
        with pytest.raises(ConfigError, match="params.yaml: not found"):
            load_params(tmp_path)

    def test_bad_yaml_names_the_file(self, tmp_path):
        (tmp_path / "params.yaml").write_text("sample: [unclosed\n")
        with pytest.raises(ConfigError, match="not valid YAML"):
            load_params(tmp_path)

    def test_write_keeps_comments_and_completes_the_file(self, tmp_path):
        path = tmp_path / "params.yaml"
        path.write_text("# my settings\nsample:\n  k: 4  # four is enough\n")
        params = load_params(tmp_path)
        params.loop.iteration = 3
        assert write_params(tmp_path, params) is True
        text = path.read_text()
        assert "# my settings" in text and "# four is enough" in text
        written = yaml.safe_load(text)
        assert written["sample"]["k"] == 4 and written["loop"]["iteration"] == 3
        # every key is present: DVC reads each stage's params keys from this file
        assert written == params.model_dump(mode="json")
        assert write_params(tmp_path, params) is False
