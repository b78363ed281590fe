"""Do-nothing earns nothing: every null answer of every built-in environment scores at most 0.1 on
every benchmark task it applies to, while the task's reference scores 1.0 and passes.

The null answers are closedloop/envs/null_answers.py's table (benchmarks/verify.py reports their
mean as null_baseline). Real verifiers, each environment's real sandbox pool (rewards.pools.EnvPools),
benchmark tasks of every slice generated as the benchmark stage does; one batch per environment.
"""

from __future__ import annotations

import pytest

from closedloop.config import Params
from closedloop.envs import reward_weights
from closedloop.envs.base import SLICES
from closedloop.envs.null_answers import ENVIRONMENTS, null_table
from closedloop.rewards.combine import combine
from closedloop.rewards.pools import EnvPools

PER_SLICE = 4  # 12 benchmark tasks per environment: ~1 minute for all five on two shared cores
MAX_NULL_REWARD = 0.1

# Every name the table gives per environment; each must apply to at least one of the tasks, so a
# renamed or dropped entry fails here instead of silently testing nothing.
TABLE = {
    "code": ["empty", "blank_lines", "echo_prompt", "pass", "ellipsis", "comment", "return_none", "bare_return",
             "return_arg1"],
    "data": ["empty", "blank_lines", "echo_prompt", "pass", "comment", "return_arg1", "return_arg1_copy"],
    "script": ["empty", "blank_lines", "echo_prompt", "pass", "comment", "list_files", "rewrite_unchanged",
               "copy_input_to_output"],
    "extract": ["empty", "blank_lines", "echo_prompt", "empty_object", "null_template", "empty_strings"],
    "rules": ["empty", "blank_lines", "echo_prompt", "default_only", "all_no_default", "all_yes_first"],
}
CASES = [(env, name) for env in ENVIRONMENTS for name in TABLE[env]]


@pytest.fixture(scope="module")
def scored():
    """{env: [(task, answer name, completion, verdict, reward)]}: references ("reference") and nulls."""
    params = Params()
    results = {}
    with EnvPools(params) as verifiers:
        for name in ENVIRONMENTS:
            env = verifiers.env(name)
            tasks = [t for s in SLICES for t in env.generate(PER_SLICE, seed=params.project.seed, split="benchmark",
                                                               slice=s)]
            items = [(t, "reference", env.reference(t)) for t in tasks]
            items += [(t, answer, text) for t in tasks for answer, text in null_table(name, t).items()]
            verdicts = verifiers.verify_batch(name, [t for t, _, _ in items], [text for _, _, text in items])
            weights = reward_weights(env, params)
            results[name] = [(t, answer, text, v, combine(v.components, weights))
                             for (t, answer, text), v in zip(items, verdicts)]
    return results


def test_the_table_covers_every_environment():
    assert set(TABLE) == set(ENVIRONMENTS) == {"code", "data", "script", "extract", "rules"}


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_every_reference_earns_full_reward(scored, env):
    references = [(t.task_id, v.status, reward) for t, answer, _, v, reward in scored[env] if answer == "reference"]
    assert len(references) == PER_SLICE * len(SLICES)
    assert all(status == "passed" and reward == 1.0 for _, status, reward in references), references


@pytest.mark.parametrize("env, answer", CASES)
def test_a_null_answer_earns_nothing(scored, env, answer):
    rows = [(t, v, reward) for t, name, _, v, reward in scored[env] if name == answer]
    assert rows, f"{env}: null answer {answer!r} applied to none of the {PER_SLICE * len(SLICES)} tasks"
    over = [(t.task_id, v.status, v.components, round(reward, 3)) for t, v, reward in rows
            if reward > MAX_NULL_REWARD or v.passed]
    assert not over, f"{env}: {answer!r} earns more than {MAX_NULL_REWARD}: {over}"


def test_partial_answers_keep_partial_credit(scored):
    """Doing part of a task still earns part of its reward (rft and grpo learn from the gradient):
    a script whose first line alone of a two-step reference, a rules answer with one conclusion flipped."""
    params = Params()
    with EnvPools(params) as verifiers:
        rules = verifiers.env("rules")
        task = next(t for t, answer, _, _, _ in scored["rules"]
                    if answer == "reference" and len(t.checks["spec"]["rules"]) >= 3
                    and "yes" in t.reference and t.reference.count(": no") >= 2)
        lines = task.reference.splitlines()
        flip = next(i for i, line in enumerate(lines[:-1]) if line.endswith(": no"))
        lines[flip] = lines[flip].replace(": no", ": yes")
        verdict = rules.verify(task, "\n".join(lines) + "\n")
        reward = combine(verdict.components, reward_weights(rules, params))
    assert not verdict.passed and MAX_NULL_REWARD < reward < 1.0, (task.reference, verdict)
