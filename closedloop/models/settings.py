"""Training/inference consistency: the sampling settings a model's rollouts used travel with it.

Every model directory the loop writes carries ``closedloop_sampling.json``. Sampling that model with
other settings is a silent distribution shift (a policy trained on temperature-1.0 rollouts sampled
greedily, a different stop list, a chat template applied or not, or another template), so it fails, or warns where
params.yaml says ``sample.settings_mismatch: warn``, naming each difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from closedloop.models.prompts import prompt_format, resolve_stop

SETTINGS_FILE = "closedloop_sampling.json"
FIELDS = ("temperature", "top_p", "max_new_tokens", "stop", "prompt_format", "chat_template", "system_prompt")
# The prompt fields of a model saved before they were recorded: raw prompts, no template.
RAW_PROMPT = {"prompt_format": "raw", "chat_template": None, "system_prompt": None}


class SettingsMismatch(ValueError):
    pass


def settings_record(settings: Any, prompt: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recorded fields of a SamplingSettings and of the prompt format (a PromptFormat.record():
    the format, the chat template's hash, the system prompt, the stop strings in force; raw prompts
    when None)."""

    return {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_new_tokens": settings.max_new_tokens,
        "stop": list(resolve_stop(settings.stop, "raw")),
        **(prompt or RAW_PROMPT),
    }


def prompt_record_of(model_dir: Path, params: Any) -> dict[str, Any]:
    """The prompt format ``params`` gives the model in ``model_dir`` (its own tokenizer decides
    whether ``prompt_format: auto`` means chat), as recorded with the sampling settings."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return prompt_format(params.sample, params.model, tokenizer).record(tokenizer)


def save_settings(model_dir: Path, settings: Any, prompt: dict[str, Any] | None = None) -> None:
    path = Path(model_dir) / SETTINGS_FILE
    path.write_text(json.dumps(settings_record(settings, prompt), sort_keys=True, indent=2) + "\n")


def read_settings(model_dir: Path) -> dict[str, Any] | None:
    """None for a model the loop did not write (a user's Hugging Face directory): nothing to compare."""
    path = Path(model_dir) / SETTINGS_FILE
    return json.loads(path.read_text()) if path.exists() else None


def differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    saved = {**RAW_PROMPT, **saved}
    return [
        f"{name}: the model's rollouts used {saved.get(name)!r}, requested {requested.get(name)!r}"
        for name in FIELDS
        if saved.get(name) != requested.get(name)
    ]


def check_settings(model_dir: Path, settings: Any, on_mismatch: str,
                   prompt: dict[str, Any] | None = None) -> list[str]:
    """Compare a model's saved settings (and prompt format) with the requested ones; raise on a
    difference unless ``on_mismatch`` is "warn". Returns the differences (empty when they agree or
    none were saved)."""
    saved = read_settings(model_dir)
    if saved is None:
        return []
    found = differences(saved, settings_record(settings, prompt))
    if found and on_mismatch != "warn":
        raise SettingsMismatch(
            f"{model_dir}: sampling settings differ from those its training rollouts used "
            "(to proceed anyway set sample.settings_mismatch: warn in params.yaml, or send "
            '{"sample": {"settings_mismatch": "warn"}} as the run\'s params from the Prefect UI or API; '
            "a run's params change only the keys they name):\n  " + "\n  ".join(found)
        )
    return found
