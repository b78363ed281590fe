"""The extract environment: seeded generation, disjoint splits, references, rule-validator verdicts."""

from __future__ import annotations

import datetime
import json
from collections import Counter

import pytest

from closedloop.config import ExtractEnvParams
from closedloop.envs import environment_class
from closedloop.envs.base import HELDOUT, SLICES, Environment, Task
from closedloop.envs.extract import COMPONENTS, STEPS, ExtractEnv, field_line, json_schema
from closedloop.envs.extract_tasks import FAMILIES
from closedloop.rewards.combine import source_version

STOP_STRINGS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(")
FAMILIES_OF = {s: sorted(name for name, f in FAMILIES.items() if f.slice == s) for s in SLICES}


@pytest.fixture(scope="module")
def env() -> ExtractEnv:
    return ExtractEnv(ExtractEnvParams())


@pytest.fixture(scope="module")
def tasks(env) -> list[Task]:
    """160 train tasks + 40 of each benchmark slice."""
    return env.generate(160, seed=5, split="train") + [t for s in SLICES for t in env.generate(40, 5, "benchmark", s)]


def records(tasks: list[Task]) -> str:
    return json.dumps([t.to_record() for t in tasks], sort_keys=True)


def answer(task: Task, **changes) -> str:
    """The reference with some fields changed (a value of ... drops the field)."""
    value = {**json.loads(task.reference), **changes}
    return json.dumps({k: v for k, v in value.items() if v is not ...}, ensure_ascii=False) + "\n"


def wrong_value(name: str, value, schema: dict):
    """A value of the right type and range that is not ``value``."""
    prop = schema["properties"][name]
    if "enum" in prop:
        return next(option for option in prop["enum"] if option != value)
    if prop.get("format") == "date":
        return (datetime.date.fromisoformat(value) + datetime.timedelta(days=1)).isoformat()
    if isinstance(value, str):
        return value + "x"
    return value - 1 if value + 1 > prop.get("maximum", float("inf")) else value + 1


class TestGenerate:
    def test_is_an_environment(self, env):
        assert isinstance(env, Environment)
        assert environment_class("extract") is ExtractEnv
        assert env.name == "extract" and env.uses_sandbox is False
        assert set(env.default_weights) == set(COMPONENTS)

    def test_same_arguments_give_identical_tasks(self, env):
        for split, slice in (("train", "core"), ("benchmark", "edge")):
            again = ExtractEnv(ExtractEnvParams()).generate(50, 11, split, slice)
            assert records(env.generate(50, 11, split, slice)) == records(again)
        assert records(env.generate(50, 11, "train")) != records(env.generate(50, 12, "train"))

    def test_train_ignores_the_slice_and_mixes_every_family(self, env):
        trained = [name for name, family in FAMILIES.items() if family.slice != HELDOUT]  # never the held-out ones
        n = 4 * len(trained)
        train = env.generate(n, 3, "train", "edge")
        assert records(train) == records(env.generate(n, 3, "train", "core"))
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
        assert not {t.task_id.rsplit("/", 1)[1] for t in train} & {t.task_id.rsplit("/", 1)[1] for t in bench}
        # what is asked, not only how: the same facts never show up in both splits
        facts = lambda t: (t.kind, json.dumps(t.checks, sort_keys=True))  # noqa: E731
        assert not {facts(t) for t in train} & {facts(t) for t in bench}

    def test_ids_unique_and_tasks_distinct(self, tasks):
        assert len({t.task_id for t in tasks}) == len(tasks)
        for split in ("train", "benchmark"):
            chosen = [t for t in tasks if t.split == split]
            assert len({t.prompt for t in chosen}) == len(chosen)
            assert all(t.task_id.startswith(f"extract/{split}/{t.slice}/") for t in chosen)

    def test_sizes_and_stop_strings(self, tasks):
        for task in tasks:
            assert len(task.prompt) <= 500 and len(task.reference) <= 200, task.task_id
            assert task.prompt.endswith("JSON:\n") and task.reference.endswith("\n")
            assert "\n" not in task.reference.rstrip("\n")  # one JSON line
            assert not any(stop in task.prompt + task.reference for stop in STOP_STRINGS)
            assert task.entry_point == "" and json.loads(json.dumps(task.checks)) == task.checks  # plain JSON

    def test_prompt_lists_the_schema(self, tasks):
        for task in tasks:
            schema = task.checks["schema"]
            assert set(schema["required"]) == set(schema["properties"]) == set(task.checks["truth"])
            for name in schema["properties"]:
                assert f"{name} (" in task.prompt

    def test_bad_arguments(self, env):
        for args in ((5, 0, "test"), (5, 0, "train", "hard"), (-1, 0, "train")):
            with pytest.raises(ValueError, match="extract env"):
                env.generate(*args)

    def test_families_cover_their_cases(self, env):
        edge = env.generate(80, 2, "benchmark", "edge")
        failure = env.generate(80, 2, "benchmark", "failure_modes")
        optional = [t.checks["truth"] for t in edge if t.kind == "optional"]
        assert all(t["po"] is None or t["due"] is None for t in optional)
        assert any(t["po"] is not None for t in optional) and any(t["due"] is not None for t in optional)
        assert all(not t.prompt.isascii() for t in edge if t.kind == "unicode")
        assert any("." in t.prompt and "," in t.prompt and t.checks["truth"]["currency"] == "EUR"
                   for t in edge if t.kind == "thousands")  # 12.450,75 EUR
        assert all(0 in t.checks["truth"].values() for t in edge if t.kind == "zero")
        assert all(t.checks["truth"]["due" if "due" in t.checks["truth"] else "meeting"] not in t.prompt
                   for t in failure if t.kind == "date_words" and "start" not in t.checks["truth"])
        assert all(not any(level in t.prompt.split("\nFields:")[0] for level in ("DEBUG", "INFO", "WARN", "ERROR"))
                   for t in failure if t.kind == "enum_case" and "level" in t.checks["truth"])


class TestReferences:
    def test_every_reference_gets_full_reward(self, env, tasks):
        assert len(tasks) >= 200
        for task, verdict in zip(tasks, env.verify_batch(tasks, [t.reference for t in tasks], None)):
            assert verdict.passed and verdict.status == "passed" and verdict.failed_step is None, (task.task_id, verdict)
            assert verdict.components == {"format": 1.0, "schema": 1.0, "fields": 1.0}
            assert list(verdict.steps) == list(STEPS)
            assert verdict.steps == {"valid_json": True, "schema_valid": True, "field_precision": 1.0, "field_recall": 1.0}

    def test_equivalent_json_also_passes(self, env, tasks):
        task = tasks[0]
        value = json.loads(task.reference)
        compact = json.dumps(dict(reversed(list(value.items()))), separators=(",", ":"), ensure_ascii=True)
        assert env.verify(task, f"  {compact}  \n\n").passed


class TestPerturbations:
    def test_a_wrong_value_fails_the_fields(self, env, tasks):
        for task in tasks:
            truth, schema = task.checks["truth"], task.checks["schema"]
            name = next(k for k, v in truth.items() if v is not None)
            verdict = env.verify(task, answer(task, **{name: wrong_value(name, truth[name], schema)}))
            assert not verdict.passed and verdict.status == "failed", task.task_id
            assert verdict.components["schema"] == 1.0 and verdict.components["fields"] < 1.0
            assert verdict.failed_step == "field_precision"
            assert verdict.feedback.startswith(f"fields: field '{name}' is ")

    def test_a_dropped_field_fails_the_schema(self, env, tasks):
        for task in tasks:
            name = list(task.checks["truth"])[-1]
            verdict = env.verify(task, answer(task, **{name: ...}))
            assert not verdict.passed and verdict.failed_step == "schema_valid"
            assert verdict.components["format"] == 1.0 and verdict.components["schema"] < 1.0
            assert verdict.feedback == f"schema: field '{name}': missing (required)"

    def test_a_number_written_as_a_string(self, env, tasks):
        for task in tasks:
            numbers = [k for k, v in task.checks["truth"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if not numbers:
                continue
            verdict = env.verify(task, answer(task, **{numbers[0]: str(task.checks["truth"][numbers[0]])}))
            assert verdict.failed_step == "schema_valid" and "expected" in verdict.feedback
            assert verdict.components["fields"] < 1.0

    def test_an_extra_field(self, env, tasks):
        verdict = env.verify(tasks[0], answer(tasks[0], note="paid"))
        assert verdict.failed_step == "schema_valid" and verdict.feedback == "schema: unexpected field 'note'"

    def test_null_and_invented_values_of_optional_fields(self, env):
        optional = [t for t in env.generate(60, 4, "benchmark", "edge") if t.kind == "optional"]
        invented = {"due": "2024-01-01", "po": "PO-1"}
        for task in optional:
            truth = task.checks["truth"]
            given = [k for k in ("po", "due") if truth[k] is not None]
            absent = [k for k in ("po", "due") if truth[k] is None]
            for name in given:  # null where the document gives a value: only recall suffers
                verdict = env.verify(task, answer(task, **{name: None}))
                assert verdict.failed_step == "field_recall" and verdict.steps["field_precision"] == 1.0
            for name in absent:  # a value the document does not give: only precision suffers
                verdict = env.verify(task, answer(task, **{name: invented[name]}))
                assert verdict.failed_step == "field_precision" and verdict.steps["field_recall"] == 1.0
                assert verdict.feedback == f"fields: field '{name}' is \"{invented[name]}\", expected null"

    @pytest.mark.parametrize("make", [
        lambda ref: "",
        lambda ref: "garbage",
        lambda ref: ref[: len(ref) // 2],  # truncated
        lambda ref: ref.rstrip("\n") + " and more",  # trailing junk
        lambda ref: ref + ref,  # two objects
        lambda ref: ref + "```",  # a closing fence after a raw object (a ```json block is read: TestChatReplies)
        lambda ref: "[" + ref.strip() + "]",
    ])
    def test_malformed_output_gets_zero(self, env, tasks, make):
        for task in tasks[::7]:
            verdict = env.verify(task, make(task.reference))
            assert verdict.components == {name: 0.0 for name in COMPONENTS}
            assert verdict.failed_step == "valid_json" and verdict.status == "format_error" and not verdict.passed
            assert verdict.feedback.startswith("valid_json: ")


class TestVerdicts:
    def test_deterministic_and_batch_equals_single(self, env, tasks):
        completions = [t.reference if i % 3 else answer(t, **{list(t.checks["truth"])[0]: ...}) for i, t in enumerate(tasks)]
        first = env.verify_batch(tasks, completions, None)
        assert first == env.verify_batch(tasks, completions, None)
        assert first[:20] == [env.verify(t, c) for t, c in zip(tasks[:20], completions[:20])]

    def test_length_mismatch_is_an_error(self, env, tasks):
        with pytest.raises(ValueError, match="2 tasks but 1 completions"):
            env.verify_batch(tasks[:2], ["{}"], None)

    def test_component_sources_version_the_validators(self, env):
        sources = env.component_sources()
        assert set(sources) == set(COMPONENTS)
        versions = {name: source_version(code, config) for name, (code, config) in sources.items()}
        assert len(set(versions.values())) == len(COMPONENTS)


def test_schema_helpers():
    fields = [("total", "number", {"minimum": 0}), ("due", "date", {"nullable": True}),
              ("currency", "enum", {"values": ["EUR", "USD"]}), ("room", "integer", {"minimum": 1, "maximum": 30})]
    assert field_line(fields) == ("Fields: total (number >=0), due (date YYYY-MM-DD or null), currency (EUR|USD), "
                                  "room (integer 1-30)")
    assert json_schema(fields)["properties"] == {
        "total": {"type": "number", "minimum": 0}, "due": {"type": ["string", "null"], "format": "date"},
        "currency": {"type": "string", "enum": ["EUR", "USD"]}, "room": {"type": "integer", "minimum": 1, "maximum": 30}}


class TestChatReplies:
    """An instruct model's reply: its JSON is read out of it first (envs/extraction.py)."""

    @pytest.mark.parametrize("wrap, how", [
        (lambda ref: f"```json\n{ref}```", "fenced"),
        (lambda ref: f"Here is the extracted data:\n\n```json\n{ref}```\n\nAll fields come from the document.", "fenced"),
        (lambda ref: f"Here is the JSON:\n{ref}\nI read the total from the second line.", "json_object"),
        (lambda ref: "The fields are: " + json.dumps(json.loads(ref), indent=2), "json_object"),  # pretty-printed
    ])
    def test_a_wrapped_reference_gets_full_reward(self, env, tasks, wrap, how):
        for task in tasks[::5]:
            verdict = env.verify(task, wrap(task.reference))
            assert verdict.passed and verdict.components == {name: 1.0 for name in COMPONENTS}, verdict
            assert list(verdict.steps) == ["extract", *STEPS] and verdict.steps["extract"] == how

    def test_raw_completions_get_no_extract_step(self, env, tasks):
        assert all(list(env.verify(t, t.reference).steps) == list(STEPS) for t in tasks[::5])

    def test_a_wrapped_wrong_answer_fails_where_the_raw_one_does(self, env, tasks):
        for task in tasks[::9]:
            wrong = answer(task, **{list(task.checks["truth"])[0]: ...})
            raw, chat = env.verify(task, wrong), env.verify(task, f"```json\n{wrong}\n```")
            assert (chat.failed_step, chat.components, chat.feedback) == (raw.failed_step, raw.components, raw.feedback)

    @pytest.mark.parametrize("completion, error", [
        ('```json\n{"vendor": "Acme"', "fence opened on line 1 is never closed"),  # cut off
        ("```python\nprint('hi')\n```", "expected a ```json block"),
    ])
    def test_a_broken_fence_fails_at_the_extract_step(self, env, tasks, completion, error):
        verdict = env.verify(tasks[0], completion)
        assert verdict.failed_step == "extract" and verdict.status == "format_error" and not verdict.passed
        assert verdict.feedback.startswith("extract: ") and error in verdict.feedback
        assert verdict.components == {name: 0.0 for name in COMPONENTS}
        assert verdict.steps == {"extract": False, "valid_json": False, "schema_valid": False,
                                 "field_precision": 0.0, "field_recall": 0.0}
