"""The trusted test runner: every assert counts, a failed assert does not stop the test, and only runs
of top-level asserts are reordered per job.

The candidate here is a plain function on the trusted side: these tests are about the runner, not
the sandbox (tests/unit/test_sandbox_attacks.py runs check() against sandboxed programs).
"""

from __future__ import annotations

import pytest

from closedloop.sandbox import grader
from closedloop.sandbox.grader import ORDERS_PER_TEST

NESTED = """
def check(candidate):
    assert candidate(1) == 1
    for x in (2, 3):
        assert candidate(x) == x
    if True:
        assert candidate(4) == 0
    with open(__file__ if False else "/dev/null") as handle:
        assert candidate(5) == 5
    try:
        assert candidate(6) == 6
    except KeyError:
        assert False
    def inner():
        assert candidate(7) == 7
    inner()
    match candidate(8):
        case 8:
            assert candidate(9) == 9
    assert candidate(10) == 10
"""


def calls_made(program: grader.TestProgram, seed: int) -> list[int]:
    seen: list[int] = []

    def candidate(x: int) -> int:
        seen.append(x)
        return x

    verdict = program.run(candidate, seed)
    assert (verdict.passed, verdict.total, verdict.completed) == (8, 9, True), verdict  # the loop's assert ran twice
    return seen


def test_asserts_nested_in_statements_all_count_and_a_failure_does_not_stop_the_test():
    program = grader.TestProgram("", NESTED)
    seen = calls_made(program, 0)
    assert sorted(seen) == list(range(1, 11))
    verdict = program.run(lambda x: x, 0)
    assert verdict.error.startswith("test line 7: AssertionError"), verdict.error  # candidate(4) == 0


def recorded_run(program: grader.TestProgram, seed: int) -> tuple[grader.TestVerdict, list[int]]:
    seen: list[int] = []
    return program.run(lambda x: seen.append(x) or x, seed), seen


def test_runs_of_top_level_asserts_are_shuffled_and_everything_else_keeps_its_order():
    first_run = "".join(f"    assert candidate({i}) == {i}\n" for i in range(8))
    loop = "    for x in (8, 9):\n        assert candidate(x) == x\n"
    last_run = "".join(f"    assert candidate({i}) == {i}\n" for i in range(10, 18))
    program = grader.TestProgram("", "def check(candidate):\n" + first_run + loop + last_run)
    orders = set()
    for seed in range(ORDERS_PER_TEST):
        verdict, seen = recorded_run(program, seed)
        assert verdict.passed == verdict.total == 18
        first, loop, last = seen[:8], seen[8:10], seen[10:]
        assert sorted(first) == list(range(8)) and loop == [8, 9] and sorted(last) == list(range(10, 18))
        orders.add(tuple(seen))
        assert program.run(lambda x: x, seed + ORDERS_PER_TEST).passed == 18  # the same order, compiled once
    assert len(orders) > 1, "every seed ran the asserts in the same order"


@pytest.mark.parametrize("seed", [0, 3])
def test_the_same_seed_runs_the_same_order(seed):
    program = grader.TestProgram("", "def check(candidate):\n" + "".join(f"    assert candidate({i}) == {i}\n" for i in range(6)))
    assert recorded_run(program, seed)[1] == recorded_run(program, seed)[1]
