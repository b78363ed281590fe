"""Buckets, failure→fix pairs and the training set."""

import pytest

from closedloop.grading import (
    ERROR, PARTIAL, POSITIVE, bucket_counts, bucket_of, build_fix_pairs, fix_prompt, training_records,
)


class TestBucketOf:
    @pytest.mark.parametrize(
        "passed, total, bucket",
        [
            (4, 4, POSITIVE),  # every test passes
            (1, 4, PARTIAL),  # some pass
            (0, 4, ERROR),  # none pass
            (0, 0, ERROR),  # crashed before any test ran
        ],
    )
    def test_table(self, passed, total, bucket):
        assert bucket_of(passed, total) == bucket


def row(task, index, bucket, completion, status="failed", feedback="f([1]) returned 2, expected 1"):
    return {"sample_id": f"{task}#{index}", "task_id": task, "sample_index": index, "bucket": bucket,
            "completion": completion, "status": status, "feedback": feedback}


PROMPTS = {"t1": "# Return x.\ndef f(x):\n", "t2": "# Return y.\ndef f(y):\n"}


class TestFixPairs:
    def test_pairs_failures_with_passes_of_the_same_task(self):
        graded = [row("t1", 0, ERROR, "    return 0\n"), row("t1", 1, POSITIVE, "    return x\n", "passed"),
                  row("t2", 0, ERROR, "    return 1\n")]  # t2 has no pass: no pair
        pairs = build_fix_pairs(graded, PROMPTS, per_task=2)
        assert len(pairs) == 1
        pair = pairs[0]
        assert (pair.failed_sample_id, pair.fixed_sample_id, pair.completion) == ("t1#0", "t1#1", "    return x\n")
        assert pair.prompt.startswith(PROMPTS["t1"] + "    return 0\n# Error: f([1]) returned 2")
        assert pair.prompt.endswith("# Corrected:\n" + PROMPTS["t1"])

    def test_duplicate_failures_and_infra_errors_are_not_paired(self):
        graded = [row("t1", 0, ERROR, "    return 0\n"), row("t1", 1, ERROR, "    return 0\n"),
                  row("t1", 2, ERROR, "    return 9\n", status="infra_error"),
                  row("t1", 3, POSITIVE, "    return x\n", "passed")]
        assert [p.failed_sample_id for p in build_fix_pairs(graded, PROMPTS, per_task=5)] == ["t1#0"]

    def test_per_task_cap(self):
        graded = [row("t1", i, PARTIAL, f"    return {i}\n") for i in range(5)] + [
            row("t1", 9, POSITIVE, "    return x\n", "passed")]
        assert len(build_fix_pairs(graded, PROMPTS, per_task=2)) == 2

    def test_feedback_is_one_line(self):
        assert "\n# Error: a b\n" in fix_prompt("p\n", "c", "a\n   b")


class TestTrainingRecords:
    def test_positives_deduplicated_and_fixes_capped(self):
        graded = [row("t1", i, POSITIVE, "    return x\n", "passed") for i in range(3)] + [
            row("t2", 0, POSITIVE, "    return y\n", "passed"), row("t2", 1, ERROR, "    return 0\n")]
        fixes = build_fix_pairs(graded, PROMPTS, per_task=2)
        records = training_records(graded, PROMPTS, fixes, include_fixes=True, max_fix_fraction=0.5)
        assert [r["source"] for r in records] == ["positive", "positive", "fix"]
        assert training_records(graded, PROMPTS, fixes, include_fixes=False, max_fix_fraction=0.5)[-1]["source"] == "positive"
        assert bucket_counts(graded) == {POSITIVE: 4, PARTIAL: 0, ERROR: 1}

    def test_fix_fraction_never_exceeded(self):
        graded = [row("t1", 0, POSITIVE, "    return x\n", "passed")] + [
            row("t1", i, ERROR, f"    return {i}\n") for i in range(1, 9)]
        fixes = build_fix_pairs(graded, PROMPTS, per_task=8)
        records = training_records(graded, PROMPTS, fixes, include_fixes=True, max_fix_fraction=0.25)
        share = sum(r["source"] == "fix" for r in records) / len(records)
        assert share <= 0.25

    def test_positives_only_from_tasks_at_or_under_the_pass_rate(self):
        """t1 passed 3 of 3 (always solved: nothing new to learn), t2 1 of 2: only t2's positive stays."""
        graded = [row("t1", i, POSITIVE, "    return x\n", "passed") for i in range(3)] + [
            row("t2", 0, POSITIVE, "    return y\n", "passed"), row("t2", 1, ERROR, "    return 0\n")]
        records = training_records(graded, PROMPTS, [], include_fixes=False, max_fix_fraction=0.0,
                                   max_task_pass_rate=0.5)
        assert [r["task_id"] for r in records] == ["t2"]
        assert len(training_records(graded, PROMPTS, [], include_fixes=False, max_fix_fraction=0.0)) == 2

    def test_references_only_for_tasks_no_sample_solved(self):
        """t1 was solved once, so its own positive is what it teaches; t2 never was, so its reference
        joins the set; a task without a reference adds nothing."""
        prompts = {**PROMPTS, "t3": "# Return z.\ndef f(z):\n"}
        graded = [row("t1", 0, POSITIVE, "    return x\n", "passed"), row("t1", 1, ERROR, "    return 0\n"),
                  row("t2", 0, ERROR, "    return 1\n"), row("t2", 1, PARTIAL, "    return 2\n"),
                  row("t3", 0, ERROR, "    return 3\n")]
        references = {"t1": "    return x  # ref\n", "t2": "    return y\n", "t3": ""}
        records = training_records(graded, prompts, [], include_fixes=False, max_fix_fraction=0.0,
                                   references=references)
        assert [(r["source"], r["task_id"], r["completion"]) for r in records] == [
            ("positive", "t1", "    return x\n"), ("unsolved", "t2", "    return y\n")]
        assert records[1]["prompt"] == PROMPTS["t2"]
        assert [r["source"] for r in training_records(graded, prompts, [], include_fixes=False,
                                                       max_fix_fraction=0.0)] == ["positive"]

    def test_unsolved_references_do_not_raise_the_fix_cap(self):
        graded = [row("t1", 0, POSITIVE, "    return x\n", "passed")] + [
            row("t1", i, ERROR, f"    return {i}\n") for i in range(1, 9)] + [row("t2", 0, ERROR, "    return 0\n")]
        fixes = build_fix_pairs(graded, PROMPTS, per_task=8)
        records = training_records(graded, PROMPTS, fixes, include_fixes=True, max_fix_fraction=0.5,
                                   references={"t2": "    return y\n"})
        assert [r["source"] for r in records] == ["positive", "unsolved", "fix"]



def test_a_pass_people_scored_wrong_is_not_learnt_from():
    from closedloop.grading import training_records
    from closedloop.stages.grade import human_veto

    assert human_veto(0.0) and not human_veto(0.5) and not human_veto(None)
    rows = [{"sample_id": f"t#{i}", "task_id": "t", "completion": text, "bucket": "positive", "status": "ok",
             "sample_index": i, "human_veto": veto} for i, (text, veto) in enumerate((("a", True), ("b", False)))]
    records = training_records(rows, {"t": "p"}, [], include_fixes=False, max_fix_fraction=0.0)
    assert [r["completion"] for r in records if r["source"] == "positive"] == ["b"]


def test_a_fix_pair_prompt_is_a_one_attempt_episode_transcript() -> None:
    from closedloop.grading import fix_prompt
    from closedloop.models.prompts import episode_prompt

    task = "# Return x doubled.\ndef f(x):\n"
    assert fix_prompt(task, "    return x", "f(2) returned 2, expected 4") == \
        episode_prompt(task, [("    return x", "f(2) returned 2, expected 4")]) == \
        f"{task}    return x\n# Error: f(2) returned 2, expected 4\n# Corrected:\n{task}"
    two = episode_prompt(task, [("    return x", "wrong"), ("    return x + x\n", "")])
    assert two == f"{task}    return x\n# Error: wrong\n# Corrected:\n{task}    return x + x\n" \
                  f"# Error: the tests failed\n# Corrected:\n{task}"
