"""Checkpoint and resume: a training process killed mid-way resumes to exactly the uninterrupted result,
and a checkpoint of a different run (other batch, other params) is refused, naming what changed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from closedloop.training import optimization
from closedloop.training.causal_lm import train_causal_lm
from closedloop.training.checkpoints import CHECKPOINT_FILE, Checkpointing, ResumeRefused
from tests.unit.test_training import EXAMPLES, TINY, _fresh_model, _same, _state, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS, EVERY = 60, 5
TRAIN = dict(steps=STEPS, batch_size=8, lr=5e-3, warmup_steps=5, seed=3)
IDENTITY = {"batch": "b1", "params train.lr": 5e-3}

# The child process: the same model and data as this module, training with checkpoints until killed.
CHILD = """
import sys, torch
torch.set_num_threads(1)
from pathlib import Path
from closedloop.training.causal_lm import train_causal_lm
from closedloop.training.checkpoints import Checkpointing
from tests.unit.test_training import EXAMPLES, TINY
from closedloop.models.builtin import build_builtin_model, train_tokenizer
tokenizer = train_tokenizer([e.prompt + e.completion for e in EXAMPLES], TINY.vocab_size)
model = build_builtin_model(TINY, tokenizer, seed=0)
checkpoint = Checkpointing(Path(sys.argv[1]), {every}, {identity!r})
train_causal_lm(model, tokenizer, EXAMPLES, checkpoint=checkpoint, **{train!r})
"""


def _checkpoint_step(directory: Path) -> int:
    import torch

    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return 0
    try:
        return torch.load(path, map_location="cpu", weights_only=False)["step"]
    except Exception:  # noqa: BLE001 - being replaced right now; look again
        return 0


def test_a_killed_training_resumes_to_the_uninterrupted_result(tokenizer, tmp_path):  # noqa: F811
    uninterrupted = _fresh_model(tokenizer)
    reference = train_causal_lm(uninterrupted, tokenizer, EXAMPLES, **TRAIN)

    directory = tmp_path / "candidate.checkpoint"
    code = CHILD.format(every=EVERY, identity=IDENTITY, train=TRAIN)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 120
        while _checkpoint_step(directory) < STEPS // 3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # mid-way, with no chance to clean up
    finally:
        child.wait()
    killed_at = _checkpoint_step(directory)
    assert child.returncode == -signal.SIGKILL and EVERY <= killed_at < STEPS, killed_at

    resumed = _fresh_model(tokenizer)
    stats = train_causal_lm(resumed, tokenizer, EXAMPLES, checkpoint=Checkpointing(directory, EVERY, IDENTITY),
                            **TRAIN)
    assert _same(_state(resumed), _state(uninterrupted))
    assert stats.steps == STEPS and stats.losses == reference.losses  # the first part's losses came back too
    assert not directory.exists()  # finished: nothing left to resume


@pytest.mark.parametrize("changed, named", [
    ({"batch": "b2"}, "changed since it was written: batch."),
    ({"params train.lr": 1e-3}, "changed since it was written: params train.lr."),
])
def test_a_checkpoint_of_another_run_is_refused(tokenizer, tmp_path, changed, named):  # noqa: F811
    directory = tmp_path / "candidate.checkpoint"

    class Stop(Exception):
        pass

    # Leave a checkpoint behind: train with checkpoints, interrupted after the first save.
    model = _fresh_model(tokenizer)
    real_save = optimization.save_checkpoint

    def save_then_stop(*args, **kwargs):
        real_save(*args, **kwargs)
        raise Stop

    optimization.save_checkpoint = save_then_stop  # where the optimisation loop looks it up
    try:
        with pytest.raises(Stop):
            train_causal_lm(model, tokenizer, EXAMPLES, checkpoint=Checkpointing(directory, EVERY, IDENTITY), **TRAIN)
    finally:
        optimization.save_checkpoint = real_save
    assert (directory / CHECKPOINT_FILE).exists()

    with pytest.raises(ResumeRefused, match=named.replace(".", r"\.")):
        train_causal_lm(_fresh_model(tokenizer), tokenizer, EXAMPLES,
                        checkpoint=Checkpointing(directory, EVERY, {**IDENTITY, **changed}), **TRAIN)
    assert (directory / CHECKPOINT_FILE).exists()  # refused, not overwritten
