"""Sampling settings saved with a model, and the check that names each difference."""

import pytest

from closedloop.config import SampleParams
from closedloop.models.settings import (RAW_PROMPT, SettingsMismatch, check_settings, differences, read_settings,
                                        save_settings)


class TestDifferences:
    @pytest.mark.parametrize(
        "change, named",
        [
            ({"temperature": 0.7}, "temperature: the model's rollouts used 1.0, requested 0.7"),
            ({"top_p": 0.9}, "top_p"),
            ({"max_new_tokens": 32}, "max_new_tokens"),
            ({"stop": ["\n\n"]}, "stop"),
        ],
    )
    def test_each_setting_is_named(self, tmp_path, change, named):
        save_settings(tmp_path, SampleParams())
        found = check_settings(tmp_path, SampleParams(**change), "warn")
        assert len(found) == 1 and found[0].startswith(named)

    def test_error_mode_raises_with_every_difference(self, tmp_path):
        save_settings(tmp_path, SampleParams())
        with pytest.raises(SettingsMismatch) as error:
            check_settings(tmp_path, SampleParams(temperature=0.5, top_p=0.5), "error")
        assert "temperature" in str(error.value) and "top_p" in str(error.value)
        assert "settings_mismatch: warn" in str(error.value)

    def test_same_settings_pass(self, tmp_path):
        save_settings(tmp_path, SampleParams(k=3, batch_size=7))  # k and batch size are not sampling settings
        assert check_settings(tmp_path, SampleParams(), "error") == []

    def test_a_model_without_saved_settings_is_not_checked(self, tmp_path):
        assert read_settings(tmp_path) is None
        assert check_settings(tmp_path, SampleParams(temperature=0.1), "error") == []

    def test_raw_prompts_are_recorded_without_a_template(self, tmp_path):
        save_settings(tmp_path, SampleParams())
        saved = read_settings(tmp_path)
        assert (saved["prompt_format"], saved["chat_template"], saved["system_prompt"]) == ("raw", None, None)

    @pytest.mark.parametrize("prompt, named", [
        # another template (its hash) on the same chat format
        ({"prompt_format": "chat", "chat_template": "bbbb", "system_prompt": None}, ["chat_template"]),
        # the template dropped altogether: raw continuations
        ({"prompt_format": "raw", "chat_template": None, "system_prompt": None}, ["prompt_format", "chat_template"]),
        ({"prompt_format": "chat", "chat_template": "aaaa", "system_prompt": "Be brief."}, ["system_prompt"]),
    ])
    def test_each_prompt_difference_is_named(self, tmp_path, prompt, named):
        save_settings(tmp_path, SampleParams(), {"prompt_format": "chat", "chat_template": "aaaa", "system_prompt": None})
        found = check_settings(tmp_path, SampleParams(), "warn", prompt)
        assert [line.split(":")[0] for line in found] == named

    def test_a_model_saved_before_prompt_formats_counts_as_raw(self, tmp_path):
        # closedloop_sampling.json of earlier versions had no prompt_format / system_prompt keys
        assert differences({"chat_template": None}, dict(RAW_PROMPT)) == []
