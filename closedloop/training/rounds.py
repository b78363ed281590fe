"""The on-policy rounds' state between rounds (``train.grpo.rounds``): how the batch's tasks are cut
into rounds, and the policy after each finished round, saved so the next round's samplers can load it
and a killed train stage can resume after the last finished round (closedloop.stages.onpolicy samples
and scores the rounds; closedloop.training.modes.grpo trains them).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from closedloop.faults import fault_point
from closedloop.io import read_jsonl, write_jsonl
from closedloop.models.loading import save_policy
from closedloop.models.settings import save_settings

ROUND_FILE = "round.json"
STATE_FILE = "policy_state.pt"


def round_parts(task_ids: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The batch's tasks cut into ``rounds`` parts of near-equal size, after a seeded shuffle (the tasks
    file is ordered by environment: every part must hold every environment's share)."""
    order = list(task_ids)
    random.Random(seed).shuffle(order)
    return [order[len(order) * r // rounds: len(order) * (r + 1) // rounds] for r in range(rounds)]


class RoundStore:
    """The policy after each finished round, under ``directory`` (the train stage's checkpoint
    directory): a model directory the next round's samplers load, its exact weights, the round's
    training figures and the samples it trained on. ``identity`` (the step checkpoints' identity)
    decides whether a saved round belongs to this training run; None: nothing is resumed."""

    def __init__(self, directory: Path, identity: dict | None) -> None:
        self.directory = Path(directory)
        self.identity = identity

    def policy_dir(self, number: int) -> Path:
        return self.directory / "rounds" / f"round-{number}"

    def save(self, number: int, model: Any, tokenizer: Any, settings: Any, prompt_record: dict, figures: dict,
             rows: list[dict], carry: Any = None) -> Path:
        """Save round ``number``'s policy and record; written to a staging directory and renamed, so a
        kill leaves either the whole round or none of it."""
        import torch

        target = self.policy_dir(number)
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        save_policy(model, tokenizer, staging)
        save_settings(staging, settings, prompt_record)
        torch.save({"model": model.state_dict(), "carry": None if carry is None else carry.state()},
                   staging / STATE_FILE)
        write_jsonl(staging / "samples.jsonl", rows)
        (staging / ROUND_FILE).write_text(json.dumps({"identity": self.identity, "figures": figures}, default=str))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        fault_point("train:round")  # tests kill the stage here, between two rounds
        return target

    def load(self, number: int, model: Any, carry: Any = None, lr: float = 0.0,
             warmup_steps: int = 0) -> tuple[dict, list[dict]] | None:
        """Round ``number`` as an earlier run of this training left it: its figures and samples, with
        its weights loaded into ``model`` and its optimizer and schedule into ``carry`` (made for
        ``lr`` and ``warmup_steps``); None when it is not saved or belongs to another run."""
        import torch

        path = self.policy_dir(number)
        if self.identity is None or not (path / ROUND_FILE).is_file():
            return None
        record = json.loads((path / ROUND_FILE).read_text())
        if record.get("identity") != json.loads(json.dumps(self.identity, default=str)):
            return None
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        if carry is not None:
            carry.restore(model, lr, warmup_steps, state["carry"])
        return record["figures"], read_jsonl(path / "samples.jsonl")

    def clear(self) -> None:
        shutil.rmtree(self.directory / "rounds", ignore_errors=True)


def figures_of(stats: Any) -> dict:
    """A round's GrpoStats as plain values (what RoundStore saves)."""
    return asdict(stats)
