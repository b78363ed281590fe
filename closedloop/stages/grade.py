"""Stage grade: buckets per sample, failure→fix pairs, and the training set they make."""

from __future__ import annotations

import statistics
from collections import defaultdict

from closedloop.envs.base import load_tasks
from closedloop.grading import bucket_counts, bucket_of, build_fix_pairs, fix_pair_record, training_records
from closedloop.io import read_jsonl, write_jsonl
from closedloop.review.sample import STRATA, draw
from closedloop.stages.common import StageContext, StageError


def run(ctx: StageContext) -> dict:
    tasks = {task.task_id: task for task in load_tasks(ctx.ws.tasks)}
    samples = read_jsonl(ctx.ws.samples, required=("sample_id", "task_id", "completion"))
    rewards = {r["sample_id"]: r for r in read_jsonl(ctx.ws.rewards, required=("sample_id", "steps", "reward", "passed"))}
    missing = [s["sample_id"] for s in samples if s["sample_id"] not in rewards]
    if missing:
        raise StageError(f"{ctx.ws.rewards}: no reward for {len(missing)} sample(s), e.g. {missing[0]}")

    graded = [graded_row(sample, rewards[sample["sample_id"]]) for sample in samples]
    prompts = {task_id: task.prompt for task_id, task in tasks.items()}
    references = {task_id: task.reference for task_id, task in tasks.items()} if ctx.params.grade.unsolved_references else {}
    fixes = build_fix_pairs(graded, prompts, ctx.params.grade.fix_pairs_per_task)
    train_set = training_records(
        graded, prompts, fixes, include_fixes=ctx.params.train.include_fix_pairs,
        max_fix_fraction=ctx.params.train.max_fix_fraction, max_task_pass_rate=ctx.params.grade.max_task_pass_rate,
        references=references,
        episode_prompts={s["sample_id"]: s["episode"]["prompt"] for s in samples if "episode" in s},
    )
    write_jsonl(ctx.ws.graded, graded)
    write_jsonl(ctx.ws.fixes, (fix_pair_record(pair) for pair in fixes))
    write_jsonl(ctx.ws.train_set, train_set)
    review = review_sample(ctx, graded, rewards, tasks)
    write_jsonl(ctx.ws.review_sample, review)  # empty when review is off: the out always exists
    return {**summary(graded, fixes, train_set),
            "review_sample": {stratum: sum(row["stratum"] == stratum for row in review) for stratum in STRATA}}


def review_sample(ctx: StageContext, graded: list[dict], rewards: dict[str, dict], tasks: dict) -> list[dict]:
    review = ctx.params.review
    if review.mode == "off":
        return []
    return draw(graded, rewards, {task_id: task.to_record() for task_id, task in tasks.items()}, review.strata,
                review.size, seed=ctx.seed("review"), iteration=ctx.params.loop.iteration)


def check_counts(reward: dict) -> tuple[int, int]:
    """(checks passed, checks total) of one verdict, the same scale for every environment.

    Tests for code (its steps count them); for other environments, the step signals of the verifier's
    chain (format → ... → result), a step holding when it is True or a fraction of 1. Only a passing
    verdict counts as all checks passed, so the bucket always agrees with ``passed``.
    """
    steps = reward["steps"]
    if "tests_total" in steps:
        return int(steps.get("tests_passed") or 0), int(steps.get("tests_total") or 0)
    judged = [v for v in steps.values() if v is not None and not isinstance(v, str)]
    total = max(1, len(judged))
    if reward["passed"]:
        return total, total
    held = sum(1 for v in judged if v is True or (type(v) in (int, float) and v >= 1))
    return min(held, total - 1), total


def graded_row(sample: dict, reward: dict) -> dict:
    steps = reward["steps"]
    passed, total = check_counts(reward)
    # form first (parses, valid JSON, format), then execution; "extract" (how a chat reply's answer
    # was read) is not a judgement of the answer itself
    chain = [value for name, value in steps.items() if name != "extract"]
    return {
        "sample_id": sample["sample_id"], "task_id": sample["task_id"], "env": sample["env"],
        "slice": sample["slice"], "kind": sample["kind"], "sample_index": sample["sample_index"],
        "completion": sample["completion"], "model_version": sample["model_version"],
        "prompt_tokens": sample["prompt_tokens"], "completion_tokens": sample["completion_tokens"],
        "finish_reason": sample["finish_reason"], "status": reward["status"], "feedback": reward["feedback"],
        "parses": bool(steps.get("parses", chain[0] if chain else False)),
        "runs": bool(steps.get("runs", chain[1] if len(chain) > 1 else False)),
        "failed_step": reward.get("failed_step") or "",
        "tests_passed": passed, "tests_total": total, "reward": reward["reward"],
        **{f"component_{name}": value for name, value in sorted(reward["components"].items())},
        "bucket": bucket_of(passed, total),
        # The bucket stays what the checks say (the batch validation rebuilds it from them), but a
        # pass people scored below 0.5 (wrong, reward hacking) is not learnt from: grading.py skips it.
        "human_veto": human_veto(reward["components"].get("human")),
        # episodes only (single attempts keep today's rows): the rounds the episode used
        **({"rounds": sample["episode"]["rounds"]} if "episode" in sample else {}),
    }


def human_veto(human: float | None) -> bool:
    """Whether people's labels reject this sample: their mean score is below 0.5."""
    return human is not None and human < 0.5


def summary(graded: list[dict], fixes: list, train_set: list[dict]) -> dict:
    rewards = [row["reward"] for row in graded]
    per_env: dict[str, list[bool]] = defaultdict(list)
    solved: dict[str, bool] = defaultdict(bool)
    for row in graded:
        per_env[row["env"]].append(row["bucket"] == "positive")
        solved[row["task_id"]] |= row["bucket"] == "positive"
    return {
        "samples": len(graded),
        # DVC takes a key named "error" anywhere in a metrics file for a load failure: the bucket is
        # "errored" here (dvc.utils.errored_revisions); graded.jsonl keeps the bucket's own name.
        "buckets": {("errored" if name == "error" else name): n for name, n in bucket_counts(graded).items()},
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "pass_rate": {env: sum(v) / len(v) for env, v in sorted(per_env.items())},
        "tasks_solved": sum(solved.values()),
        "tasks": len(solved),
        "fix_pairs": len(fixes),
        "train_examples": {
            "positive": sum(r["source"] == "positive" for r in train_set),
            "fix": sum(r["source"] == "fix" for r in train_set),
            "unsolved": sum(r["source"] == "unsolved" for r in train_set),
        },
    }
