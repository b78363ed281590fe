"""The prompt format and sampling settings of the model a stage samples or trains, as StageErrors.

Its own module, not stages/common.py, so that only the stages that load a model (sample, train,
evaluate, warmstart) have models/prompts.py and models/settings.py in their DVC code deps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closedloop.config import Params
from closedloop.io import say
from closedloop.models.prompts import PromptFormatError, prompt_format
from closedloop.models.settings import SettingsMismatch, check_settings, prompt_record_of
from closedloop.stages.common import StageError


def check_sampling_settings(model_dir: Path, params: Params) -> list[str]:
    """The requested sampling settings and prompt format against those the model's rollouts used
    (see models/settings.py)."""
    try:
        prompt = prompt_record_of(model_dir, params)
        found = check_settings(model_dir, params.sample, params.sample.settings_mismatch, prompt)
    except (SettingsMismatch, PromptFormatError) as error:
        raise StageError(str(error)) from None
    for line in found:
        say(f"closedloop: warning: {model_dir}: {line}")
    return found


def prompt_format_of(params: Params, tokenizer: Any):
    """The PromptFormat sampling, training and evaluation all use for this model (models/prompts.py)."""
    try:
        return prompt_format(params.sample, params.model, tokenizer)
    except PromptFormatError as error:
        raise StageError(str(error)) from None
