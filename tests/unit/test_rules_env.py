"""The rules environment: the rule engine, seeded generation, disjoint splits, step-by-step verdicts."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from closedloop.config import RulesEnvParams
from closedloop.envs import environment_class
from closedloop.envs.base import HELDOUT, SLICES, Environment, Task
from closedloop.envs.rules import COMPONENTS, RuleEngine, RulesEnv
from closedloop.envs.rules_tasks import DOMAINS, EXCLUSIVE, FAMILIES, INCLUSIVE, Family, atoms, render_condition
from closedloop.rewards.combine import source_version

STOP_STRINGS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
FAMILIES_OF = {s: sorted(name for name, f in FAMILIES.items() if f.slice == s) for s in SLICES}


@pytest.fixture(scope="module")
def env() -> RulesEnv:
    return RulesEnv(RulesEnvParams())


@pytest.fixture(scope="module")
def tasks(env) -> list[Task]:
    """160 train tasks + 40 of each benchmark slice."""
    return env.generate(160, seed=5, split="train") + [t for s in SLICES for t in env.generate(40, 5, "benchmark", s)]


def records(tasks: list[Task]) -> str:
    return json.dumps([t.to_record() for t in tasks], sort_keys=True)


def lines(task: Task) -> list[str]:
    return task.reference.splitlines()


def flip(line: str) -> str:
    name, value = line.split(": ")
    return f"{name}: {'no' if value == 'yes' else 'yes'}"


def spec(rules: list[tuple[dict, str]], case: dict, default: str = "refer", order: list[str] | None = None,
         **extra: dict) -> dict:
    """A loan spec from (condition, outcome) pairs; ``R2={"missing": True}`` adds to rule R2."""
    ids = [f"R{i + 1}" for i in range(len(rules))]
    listed = [{"id": i, "if": c, "then": t, **extra.get(i, {})} for i, (c, t) in zip(ids, rules)]
    return {"domain": "loan", "case": case, "rules": listed, "order": order or ids, "default": default}


INCOME = {"attr": "income", "op": ">=", "value": 50000}
EMPLOYED = {"attr": "employed", "op": "is", "value": True}


class TestRuleEngine:
    @pytest.mark.parametrize("cond, case, truth, reason", [
        (INCOME, {"income": 52000}, True, "income 52000 >= 50000"),
        (INCOME, {"income": 50000}, True, "income 50000 >= 50000"),  # inclusive at the threshold
        ({**INCOME, "op": ">"}, {"income": 50000}, False, "income 50000 is not > 50000"),  # exclusive
        ({**INCOME, "op": "<"}, {"income": 49000}, True, "income 49000 < 50000"),
        ({**INCOME, "op": "<="}, {"income": 50001}, False, "income 50001 is not <= 50000"),
        (EMPLOYED, {"employed": False}, False, "employed is no"),
        ({"not": EMPLOYED}, {"employed": False}, True, "employed is no"),
        ({"attr": "role", "op": "=", "value": "admin"}, {"role": "guest"}, False, "role is guest, not admin"),
        ({"attr": "role", "op": "in", "value": ["admin", "editor"]}, {"role": "editor"}, True, "role editor is in (admin, editor)"),
        ({"attr": "city", "op": "=", "value": "Zürich"}, {"city": "Zurich"}, False, "city is Zurich, not Zürich"),  # unicode exact
        ({"all": [INCOME, EMPLOYED]}, {"income": 60000, "employed": False}, False, "employed is no"),  # the failing part
        ({"all": [INCOME, EMPLOYED]}, {"income": 60000, "employed": True}, True, "income 60000 >= 50000 and employed is yes"),
        ({"any": [INCOME, EMPLOYED]}, {"income": 10000, "employed": True}, True, "employed is yes"),  # the carrying part
        ({"any": [INCOME, EMPLOYED]}, {"income": 10000, "employed": False}, False,
         "income 10000 is not >= 50000 and employed is no"),
        ({"not": {"all": [INCOME, EMPLOYED]}}, {"income": 60000, "employed": False}, True, "employed is no"),
    ])
    def test_conditions(self, cond, case, truth, reason):
        assert RuleEngine.holds(cond, case) == (truth, reason)

    def test_unknown_operator_is_an_error(self):
        with pytest.raises(ValueError, match="unknown operator"):
            RuleEngine.holds({"attr": "x", "op": "~", "value": 1}, {"x": 1})

    def test_first_rule_that_applies_decides(self):
        chain = RuleEngine.evaluate(spec([(EMPLOYED, "deny"), (INCOME, "approve"), ({"not": EMPLOYED}, "refer")],
                                         {"income": 52000, "employed": False}))
        assert chain.conclusions == (False, True, True)
        assert chain.decision == "approve" and chain.decision_reason == "R2 is the first rule that applies"
        assert chain.reasons[1] == "income 52000 >= 50000"

    def test_stated_priority_overrides_the_listing(self):
        chain = RuleEngine.evaluate(spec([(INCOME, "approve"), (EMPLOYED, "deny")], {"income": 52000, "employed": True},
                                         order=["R2", "R1"]))
        assert chain.decision == "deny" and chain.decision_reason == "R2 is the first rule that applies in the order R2, R1"

    def test_default_when_nothing_applies(self):
        chain = RuleEngine.evaluate(spec([(INCOME, "approve")], {"income": 100}, default="refer"))
        assert chain == ((False,), ("income 100 is not >= 50000",), "refer", "no rule applies, so the default refer")

    def test_the_rule_says_what_missing_means(self):
        case = {"income": None, "employed": True}
        stated = RuleEngine.evaluate(spec([(INCOME, "approve"), ({"not": INCOME}, "deny")], case,
                                          R1={"missing": True}, R2={"missing": True}))
        assert stated.conclusions == (True, True)  # a negation does not flip what the rule says
        assert stated.reasons[0] == "income is ?, and the rule says R1 is yes"
        unsaid = RuleEngine.evaluate(spec([(INCOME, "approve")], case))
        assert unsaid.conclusions == (False,) and unsaid.decision == "refer"


class TestGenerate:
    def test_is_an_environment(self, env):
        assert isinstance(env, Environment)
        assert environment_class("rules") is RulesEnv
        assert env.name == "rules" and env.uses_sandbox is False
        assert set(env.default_weights) == set(COMPONENTS)

    def test_same_arguments_give_identical_tasks(self, env):
        for split, slice in (("train", "core"), ("benchmark", "failure_modes")):
            again = RulesEnv(RulesEnvParams()).generate(50, 11, split, slice)
            assert records(env.generate(50, 11, split, slice)) == records(again)
        assert records(env.generate(50, 11, "train")) != records(env.generate(50, 12, "train"))

    def test_train_ignores_the_slice_and_mixes_every_family(self, env):
        trained = [name for name, family in FAMILIES.items() if family.slice != HELDOUT]  # never the held-out ones
        n = 4 * len(trained)
        train = env.generate(n, 3, "train", "failure_modes")
        assert records(train) == records(env.generate(n, 3, "train"))
        assert Counter(t.kind for t in train) == {name: 4 for name in trained}
        assert all(t.slice == FAMILIES[t.kind].slice for t in train)

    @pytest.mark.parametrize("slice", SLICES)
    def test_benchmark_slices_draw_only_their_families(self, env, slice):
        tasks = env.generate(40, 3, "benchmark", slice)
        assert sorted({t.kind for t in tasks}) == FAMILIES_OF[slice]
        assert all(t.slice == slice and t.split == "benchmark" for t in tasks)

    def test_train_and_benchmark_are_disjoint_whatever_the_seeds(self, env):
        train = [t for seed in range(6) for t in env.generate(120, seed, "train")]
        bench = [t for seed in range(6) for s in SLICES for t in env.generate(30, seed, "benchmark", s)]
        assert not {t.prompt for t in train} & {t.prompt for t in bench}
        specs = lambda chosen: {json.dumps(t.checks["spec"], sort_keys=True) for t in chosen}  # noqa: E731
        assert not specs(train) & specs(bench)

    def test_ids_unique_and_tasks_distinct(self, tasks):
        assert len({t.task_id for t in tasks}) == len(tasks)
        for split in ("train", "benchmark"):
            chosen = [t for t in tasks if t.split == split]
            assert len({t.prompt for t in chosen}) == len(chosen)
            assert all(t.task_id.startswith(f"rules/{split}/{t.slice}/") for t in chosen)

    def test_sizes_format_and_stop_strings(self, tasks):
        for task in tasks:
            rules = task.checks["spec"]["rules"]
            assert 2 <= len(rules) <= 4
            assert len(task.prompt) <= 500 and len(task.reference) <= 200, task.task_id
            assert task.reference.endswith("\n") and lines(task)[-1].startswith("decision: ")
            assert [line.split(":")[0] for line in lines(task)[:-1]] == [r["id"] for r in rules]
            assert not any(stop in task.prompt + task.reference for stop in STOP_STRINGS)
            assert task.entry_point == "" and json.loads(json.dumps(task.checks)) == task.checks
            conditions = [json.dumps(r["if"], sort_keys=True) for r in rules]
            assert len(set(conditions)) == len(conditions), task.prompt  # no rule repeats another

    def test_bad_arguments(self, env):
        for args in ((5, 0, "test"), (5, 0, "train", "hard"), (-1, 0, "train")):
            with pytest.raises(ValueError, match="rules env"):
                env.generate(*args)

    def test_an_exhausted_space_is_a_clear_error(self, monkeypatch):
        fixed = {"domain": "loan", "case": {"income": 1}, "rules": [{"id": "R1", "if": INCOME, "then": "approve"}],
                 "order": ["R1"], "default": "deny"}
        for name in FAMILIES:
            monkeypatch.setitem(FAMILIES, name, Family(name, FAMILIES[name].slice, lambda rng: json.loads(json.dumps(fixed))))
        # Each family has one task at most (the key names the family); a used-up family passes its
        # turn on, so the error comes once every family is used up.
        with pytest.raises(ValueError, match="space is nearly exhausted"):
            RulesEnv(RulesEnvParams()).generate(len(FAMILIES) + 1, 0, "train")


class TestFamilies:
    """Each edge and failure-mode family holds what it is named for."""

    @pytest.fixture(scope="class")
    def chosen(self, env):
        tasks = env.generate(120, 9, "benchmark", "edge") + env.generate(120, 9, "benchmark", "failure_modes")
        return {kind: [t for t in tasks if t.kind == kind] for kind in FAMILIES_OF["edge"] + FAMILIES_OF["failure_modes"]}

    @staticmethod
    def at_threshold(task: Task, ops: tuple[str, ...]) -> bool:
        spec = task.checks["spec"]
        return any(a["op"] in ops and spec["case"][a["attr"]] == a["value"] for r in spec["rules"] for a in atoms(r["if"]))

    def test_boundary_and_strictness(self, chosen):
        assert all(self.at_threshold(t, INCLUSIVE) for t in chosen["boundary"])
        assert all(self.at_threshold(t, EXCLUSIVE) for t in chosen["strictness"])

    def test_ties_priority_default(self, chosen):
        for task in chosen["ties"]:
            chain = RuleEngine.evaluate(task.checks["spec"])
            fired = [r["then"] for r, c in zip(task.checks["spec"]["rules"], chain.conclusions) if c]
            assert len(fired) >= 2 and len(set(fired)) >= 2
        for task in chosen["priority"]:
            assert "in the order" in task.prompt and "in the order" in RuleEngine.evaluate(task.checks["spec"]).decision_reason
        for task in chosen["default"]:
            spec = task.checks["spec"]
            assert lines(task)[-1] == f"decision: {spec['default']}" and "yes" not in task.reference

    def test_missing_unicode_negation(self, chosen):
        for task in chosen["missing"]:
            assert "=?" in task.prompt and ("is yes)" in task.prompt or "is no)" in task.prompt)
        assert all(not t.prompt.isascii() for t in chosen["unicode"])
        assert all("not " in t.prompt for t in chosen["negation"])

    def test_rendering(self):
        cond = {"all": [INCOME, {"not": EMPLOYED}, {"any": [{"attr": "role", "op": "in", "value": ["a", "b"]}, EMPLOYED]}]}
        assert render_condition(cond) == "income >= 50000 and not employed and (role in (a, b) or employed)"
        assert render_condition({"not": {"attr": "role", "op": "=", "value": "admin"}}) == "not (role = admin)"
        assert set(DOMAINS) == {"loan", "shipping", "access", "routing"}


class TestVerdicts:
    def test_every_reference_gets_full_reward(self, env, tasks):
        assert len(tasks) >= 200
        for task, verdict in zip(tasks, env.verify_batch(tasks, [t.reference for t in tasks], None)):
            ids = [r["id"] for r in task.checks["spec"]["rules"]]
            assert verdict.passed and verdict.status == "passed" and verdict.failed_step is None, (task.task_id, verdict)
            assert verdict.components == {"format": 1.0, "steps": 1.0, "decision": 1.0}
            assert list(verdict.steps) == ["format_ok", *ids, "decision"] and all(verdict.steps.values())

    def test_a_wrong_intermediate_conclusion(self, env, tasks):
        for task in tasks:
            ref = lines(task)
            for index in range(len(ref) - 1):
                rule_id = ref[index].split(":")[0]
                verdict = env.verify(task, "\n".join(ref[:index] + [flip(ref[index])] + ref[index + 1:]) + "\n")
                assert not verdict.passed and verdict.status == "failed" and verdict.failed_step == rule_id
                # Credit: the conclusions' informedness (0 when the flip leaves them all alike, a
                # constant); the right decision and the format earn only beside it.
                answers = [line.endswith("yes") for line in ref[:index] + [flip(ref[index])] + ref[index + 1:-1]]
                credit = RuleEngine.informedness(answers, RuleEngine.evaluate(task.checks["spec"]).conclusions)
                assert verdict.steps[rule_id] is False and verdict.components["steps"] == pytest.approx(credit)
                assert verdict.components["decision"] == verdict.components["format"] == float(credit > 0)
                assert verdict.feedback.startswith(f"{rule_id} is {ref[index].split(': ')[1]}: ")

    def test_a_wrong_decision(self, env, tasks):
        for task in tasks:
            spec = task.checks["spec"]
            right = lines(task)[-1].split(": ")[1]
            wrong = next(o for o in DOMAINS[spec["domain"]].outcomes if o != right)
            verdict = env.verify(task, task.reference.replace(f"decision: {right}", f"decision: {wrong}"))
            assert not verdict.passed and verdict.failed_step == "decision" and verdict.steps["decision"] is False
            assert verdict.components == {"format": 1.0, "steps": 1.0, "decision": 0.0}
            assert verdict.feedback.startswith(f"decision is {right}, not {wrong}: ")

    def test_feedback_gives_the_reason(self, env):
        task = Task("rules/x", "rules", "train", "core", "loan", "", "",
                    {"spec": spec([(EMPLOYED, "deny"), (INCOME, "approve")], {"income": 52000, "employed": False})},
                    "R1: no\nR2: yes\ndecision: approve\n")
        verdict = env.verify(task, "R1: no\nR2: no\ndecision: refer\n")
        assert verdict.feedback == "R2 is yes: income 52000 >= 50000" and verdict.failed_step == "R2"

    @pytest.mark.parametrize("make", [
        lambda ref: "",
        lambda ref: "garbage",
        lambda ref: "\n".join(ref.splitlines()[:-1]),  # truncated: no decision
        lambda ref: ref[: len(ref) // 2],
        lambda ref: "\n".join(reversed(ref.splitlines())),  # wrong order
        lambda ref: ref.replace(": yes", ": maybe").replace(": no", ": maybe"),
        lambda ref: ref + "Because the rules say so.\n",  # prose after the answer
        lambda ref: ref.replace("decision: ", "Decision = "),
    ])
    def test_malformed_output_gets_zero(self, env, tasks, make):
        for task in tasks[::5]:
            verdict = env.verify(task, make(task.reference))
            assert verdict.components == {name: 0.0 for name in COMPONENTS}, (task.reference, verdict)
            assert verdict.failed_step == "format_ok" and verdict.status == "format_error" and not verdict.passed
            assert verdict.steps["format_ok"] is False and verdict.feedback.startswith("format: ")

    def test_deterministic_and_batch_equals_single(self, env, tasks):
        completions = [t.reference if i % 3 else flip(lines(t)[0]) + "\n" + "\n".join(lines(t)[1:]) for i, t in enumerate(tasks)]
        first = env.verify_batch(tasks, completions, None)
        assert first == env.verify_batch(tasks, completions, None)
        assert first[:20] == [env.verify(t, c) for t, c in zip(tasks[:20], completions[:20])]

    def test_length_mismatch_is_an_error(self, env, tasks):
        with pytest.raises(ValueError, match="2 tasks but 1 completions"):
            env.verify_batch(tasks[:2], ["R1: yes"], None)

    def test_component_sources_version_the_engine_and_format(self, env):
        sources = env.component_sources()
        assert set(sources) == set(COMPONENTS) and sources["steps"][0] is RuleEngine
        assert source_version(*sources["format"]) != source_version(*sources["steps"])


def _markdown(ref: str) -> str:
    """The reference as an instruct model writes it: reasoning, bold keys, capitals, a final decision."""
    lines = ref.strip().splitlines()
    rules = [f"- **{line.split(': ')[0]}:** {line.split(': ')[1].capitalize()}" for line in lines[:-1]]
    return "Let me check each rule against the case.\n\n" + "\n".join(rules) + f"\n\n**Decision:** {lines[-1].split(': ')[1]}"


class TestChatReplies:
    """An instruct model's reply: the rule lines are read out of its markdown first (envs/extraction.py)."""

    @pytest.mark.parametrize("wrap, how", [
        (_markdown, "markdown"),
        (lambda ref: f"Here is my answer:\n```\n{ref}```\n", "fenced"),
        (lambda ref: "| Rule | Applies |\n|---|---|\n" + "".join(f"| {line.replace(': ', ' | ')} |\n" for line in ref.splitlines()[:-1])
         + f"\n**{ref.splitlines()[-1]}**", "markdown"),
    ])
    def test_a_wrapped_reference_gets_full_reward(self, env, tasks, wrap, how):
        for task in tasks[::5]:
            verdict = env.verify(task, wrap(task.reference))
            assert verdict.passed and verdict.components == {name: 1.0 for name in COMPONENTS}, (wrap(task.reference), verdict)
            assert list(verdict.steps)[:2] == ["extract", "format_ok"] and verdict.steps["extract"] == how

    def test_raw_completions_get_no_extract_step(self, env, tasks):
        assert all(list(env.verify(t, t.reference).steps)[0] == "format_ok" for t in tasks[::5])

    def test_a_wrong_conclusion_in_markdown_fails_at_that_rule(self, env, tasks):
        for task in tasks[::7]:
            wrong = flip(lines(task)[0]) + "\n" + "\n".join(lines(task)[1:]) + "\n"
            raw, chat = env.verify(task, wrong), env.verify(task, _markdown(wrong))
            assert (chat.failed_step, chat.components, chat.feedback) == (raw.failed_step, raw.components, raw.feedback)

    def test_a_reply_with_no_rule_lines_fails_at_the_extract_step(self, env, tasks):
        verdict = env.verify(tasks[0], "```\nI am not sure.\n```")
        assert verdict.failed_step == "extract" and verdict.status == "format_error" and not verdict.passed
        assert verdict.feedback == "extract: no 'R1: yes|no' or 'decision: ...' line in the reply"
        assert verdict.components == {name: 0.0 for name in COMPONENTS}
        assert verdict.steps["extract"] is False and not any(verdict.steps.values())


class TestShowWork:
    """envs.rules.show_work: references that show each rule's comparison before its answer."""

    @pytest.fixture(scope="class")
    def worked(self) -> list[Task]:
        return RulesEnv(RulesEnvParams(show_work=True)).generate(200, seed=3, split="train")

    def test_the_work_is_the_rule_s_reason_and_the_answer_is_unchanged(self, env, worked):
        plain = env.generate(200, seed=3, split="train")
        assert [t.task_id for t in plain] == [t.task_id for t in worked]  # the same tasks, only the reference
        for bare, shown in zip(plain, worked):
            chain = RuleEngine.evaluate(shown.checks["spec"])
            work_lines, bare_lines = lines(shown), lines(bare)
            assert work_lines[-1] == bare_lines[-1]  # the decision
            for line, reason, answer in zip(work_lines, chain.reasons, bare_lines):
                rule_id, word = answer.split(": ")
                assert line == f"{rule_id}: {reason}: {word}"

    def test_both_forms_pass_and_only_the_last_word_counts(self, env, worked):
        for verdict in env.verify_batch(worked, [t.reference for t in worked]):
            assert verdict.passed and verdict.components == {"format": 1.0, "steps": 1.0, "decision": 1.0}
        for task in worked[:50]:
            ref = lines(task)
            work, _, word = ref[0].rpartition(": ")
            wrong = [f"{work}: {'no' if word == 'yes' else 'yes'}"] + ref[1:]  # the work kept, the answer flipped
            verdict = env.verify(task, "\n".join(wrong) + "\n")
            assert not verdict.passed and verdict.failed_step == ref[0].split(":")[0]
