"""Where every file of a workspace lives. One place, so stages, dvc.yaml and the flows agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, root: Path | str = ".") -> "Workspace":
        return cls(Path(root).resolve())

    def path(self, relative: str) -> Path:
        return self.root / relative

    # The fixed benchmark and the warm start (iteration 0).
    benchmark_tasks = property(lambda self: self.root / BENCHMARK_TASKS)
    references = property(lambda self: self.root / REFERENCES)
    warmstart_model = property(lambda self: self.root / WARMSTART_MODEL)
    warmstart_eval = property(lambda self: self.root / WARMSTART_EVAL)
    # The current champion: an input of the pipeline (dvc add), so the loop closes without a cycle.
    champion = property(lambda self: self.root / CHAMPION)
    # The batch of the current iteration; earlier batches live in the DVC cache and experiment refs.
    tasks = property(lambda self: self.root / TASKS)
    samples = property(lambda self: self.root / SAMPLES)
    sample_timings = property(lambda self: self.root / SAMPLE_TIMINGS)
    rollouts = property(lambda self: self.root / ROLLOUTS)
    rewards = property(lambda self: self.root / REWARDS)
    train_rounds = property(lambda self: self.root / TRAIN_ROUNDS)
    graded = property(lambda self: self.root / GRADED)
    fixes = property(lambda self: self.root / FIXES)
    train_set = property(lambda self: self.root / TRAIN_SET)
    validation_dir = property(lambda self: self.root / VALIDATION_DIR)
    validation_report = property(lambda self: self.root / VALIDATION_REPORT)
    candidate = property(lambda self: self.root / CANDIDATE)
    evaluation = property(lambda self: self.root / EVALUATION)
    gate = property(lambda self: self.root / GATE)
    next_champion = property(lambda self: self.root / NEXT_CHAMPION)
    # What people said: human review answers and the completions they marked as reward hacking.
    # Inputs of the reward stage, recorded with `dvc add` when an iteration closes its loop.
    human_labels = property(lambda self: self.root / HUMAN_LABELS)
    known_hacks = property(lambda self: self.root / KNOWN_HACKS)
    review_sample = property(lambda self: self.root / REVIEW_SAMPLE)
    review_outcome = property(lambda self: self.root / REVIEW_OUTCOME)
    canary_check = property(lambda self: self.root / CANARY_CHECK)
    monitors_report = property(lambda self: self.root / MONITORS_REPORT)

    def metrics(self, stage: str) -> Path:
        return self.root / METRICS_DIR / f"{stage}.json"


BENCHMARK_TASKS = "data/benchmark/tasks.jsonl"
REFERENCES = "data/warmstart/references.jsonl"
WARMSTART_MODEL = "data/models/warmstart"
WARMSTART_EVAL = "data/warmstart/evaluation.json"
CHAMPION = "data/champion"
TASKS = "data/batch/tasks.jsonl"
SAMPLES = "data/batch/samples.jsonl"
SAMPLE_TIMINGS = "data/batch/sample_timings.jsonl"
ROLLOUTS = "data/batch/rollouts.jsonl"  # each sample's tokens and sampling log-probabilities (for GRPO)
REWARDS = "data/batch/rewards.jsonl"
# grpo's on-policy rounds (train.grpo.rounds > 1): the samples the train stage drew and scored itself
TRAIN_ROUNDS = "data/batch/train_rounds.jsonl"
GRADED = "data/batch/graded.jsonl"
FIXES = "data/batch/fixes.jsonl"
TRAIN_SET = "data/batch/train_set.jsonl"
VALIDATION_DIR = "data/batch/validation"
VALIDATION_REPORT = "data/batch/validation/report.json"
CANDIDATE = "data/models/candidate"
EVALUATION = "data/reports/evaluation.json"
GATE = "data/reports/gate.json"
NEXT_CHAMPION = "data/models/next_champion"
HUMAN_LABELS = "data/labels/human.jsonl"
KNOWN_HACKS = "data/labels/known_hacks.jsonl"
KNOWN_HACKS_CHECK = "data/batch/known_hacks_check.jsonl"  # per known hack: its reward under today's verifier
# The benchmark canary: fixed stored completions (references, blanks) scored by today's verifiers.
CANARY_CHECK = "data/batch/canary_check.jsonl"
MONITORS_REPORT = "data/reports/monitors.json"  # every monitor's verdict over this batch and its history
REVIEW_SAMPLE = "data/batch/review_sample.jsonl"  # this iteration's samples drawn for human review
# What the review of this iteration's batch said before its gate (review.mode before_promotion): an
# input of the gate, written by the flow and recorded with `dvc add`, like the labels.
REVIEW_OUTCOME = "data/reports/review.json"
METRICS_DIR = "metrics"
