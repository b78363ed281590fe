"""The extract environment: read a short document, output its fields as one JSON object on one line.

Generated documents (invoices, emails, log lines, contracts, orders) state some facts; the prompt lists
the fields to extract with their types. The verifier is three rule validators in a row (reusable ones,
from closedloop.envs.validators): one JSON object → the schema (required fields, types,
enumerations, numeric ranges, dates) → field-level precision and recall against the truth. A chat
reply's JSON (in a ```json block, or after prose) is read first by envs/extraction.py, and its steps
then start with ``extract``.

A field the document does not give is typed "... or null" in the prompt and must be null: every
listed field is required, so omitting it breaks the schema, while null and absent count the same
for field precision / recall.

In an episode (envs/episodes.py) the checks are verified whole: a truth restricted to some fields
would count the others as wrong (field precision is over every field the answer gives). The model
reads a JSON or schema error (the schema is the prompt's field list) and which field is wrong, with
the value the answer gave, never the document's value.

Splits are disjoint by construction: a task belongs to the benchmark iff the hash of its family and
facts (not its wording) falls in the benchmark bucket of base.in_benchmark.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any, Callable, TypedDict

from closedloop.envs import extraction
from closedloop.envs.base import (
    HELDOUT,
    BaseEnvironment,
    Task,
    Verdict,
    check_split,
    draw_until,
    in_benchmark,
    round_robin,
    source_of,
    stable_hash,
)
from closedloop.envs.episodes import between, status_only
from closedloop.envs.extract_tasks import FAMILIES, Field
from closedloop.envs.extraction import extract_json
from closedloop.envs.validators import CHECK_SCHEMA_HELPERS, check_schema, field_scores, parse_json
from closedloop.envs.validators import _show as show_value

if TYPE_CHECKING:
    from closedloop.config import ExtractEnvParams

COMPONENTS = ("format", "schema", "fields")
STEPS = ("valid_json", "schema_valid", "field_precision", "field_recall")
NUMERIC_TOLERANCE = 1e-6  # numbers must be exact; the tolerance only absorbs float noise (1224.50 vs 1224.5)


def json_schema(fields: list[Field]) -> dict:
    """The JSON schema (validators.check_schema's subset) of a field list: every field required, no others."""
    properties = {}
    for name, kind, options in fields:
        prop: dict[str, Any] = {"type": {"date": "string", "enum": "string"}.get(kind, kind)}
        if kind == "date":
            prop["format"] = "date"
        if kind == "enum":
            prop["enum"] = list(options["values"])
        prop.update({k: options[k] for k in ("minimum", "maximum") if k in options})
        if options.get("nullable"):
            prop["type"] = [prop["type"], "null"]
        properties[name] = prop
    return {"type": "object", "properties": properties, "required": [name for name, _, _ in fields],
            "additionalProperties": False}


def field_line(fields: list[Field]) -> str:
    """The prompt's compact schema: ``vendor (string), total (number >=0), currency (EUR|USD|GBP)``."""
    parts = []
    for name, kind, options in fields:
        if kind == "enum":
            text = "|".join(options["values"])
        elif kind == "date":
            text = "date YYYY-MM-DD"
        elif "minimum" in options and "maximum" in options:
            text = f"{kind} {options['minimum']}-{options['maximum']}"
        elif "minimum" in options:
            text = f"{kind} >={options['minimum']}"
        else:
            text = kind
        parts.append(f"{name} ({text}{' or null' if options.get('nullable') else ''})")
    return "Fields: " + ", ".join(parts)


class ExtractChecks(TypedDict):
    """What the verifier reads of a task's checks."""

    schema: dict[str, Any]  # validators.check_schema's JSON-schema subset
    truth: dict[str, Any]  # each field's right value (null: the document does not give it)


class ExtractEnv(BaseEnvironment):
    name = "extract"
    uses_sandbox = False
    sandbox_preload: tuple[str, ...] = ()
    components = COMPONENTS
    # Valid JSON is cheap to learn and says little; getting the values right is the task.
    default_weights = {"format": 0.1, "schema": 0.3, "fields": 0.6}

    task_checks = ExtractChecks

    def __init__(self, params: ExtractEnvParams) -> None:
        self.params = params

    @staticmethod
    def check_task(task: Task) -> list[str]:
        """A schema check_schema can read, which the truth satisfies (else no answer could earn full reward)."""
        try:
            result = check_schema(task.checks["truth"], task.checks["schema"])
        except Exception as error:  # noqa: BLE001 - the schema is data from a file: whatever it trips on is its fault
            return [f"checks.schema cannot be used: {type(error).__name__}: {error}"]
        return [] if result.score == 1.0 else [f"checks.truth does not satisfy checks.schema: {result.message}"]

    def component_sources(self) -> dict[str, tuple[Callable, Any]]:
        # _judge gates format and schema on the fields: its code is part of what they score.
        read = {"extraction": extraction.version(), "judge": source_of(ExtractEnv._judge)}
        # check_schema scores with module-level helpers: their code is part of what it scores.
        schema_helpers = {"helpers": [source_of(helper) for helper in CHECK_SCHEMA_HELPERS]}
        return {"format": (parse_json, read), "schema": (check_schema, {**read, **schema_helpers}),
                "fields": (field_scores, {"numeric_tolerance": NUMERIC_TOLERANCE, **read})}

    # -- episodes (envs/episodes.py) -------------------------------------------------------------

    def split_checks(self, task: Task) -> tuple[dict[str, Any], dict[str, Any]]:
        """No partition (see the module's docstring): the same checks both ways, whose truth no feedback shows."""
        return task.checks, task.checks

    def shown_feedback(self, task: Task, verdict: Verdict) -> str:
        """A JSON or schema error as it is (the schema is the prompt's); for a wrong value, which field
        and what the answer gave there, never the truth."""
        if verdict.passed:
            return f"passed the visible checks: all {len(task.checks['truth'])} fields right"
        if verdict.failed_step in ("extract", "valid_json", "schema_valid"):
            return verdict.feedback  # the reply and the schema's words: nothing of the truth
        truth = task.checks["truth"]
        for key in truth:
            given = between(verdict.feedback, f"fields: field {key!r} is ", f", expected {show_value(truth[key])}")
            if given is not None:
                return f"fields: field {key!r} is {given}: not the document's value"
        unexpected = between(verdict.feedback, "fields: unexpected field ", "")
        if unexpected is not None and not any(unexpected.startswith(f"{key!r}: ") for key in truth):
            return verdict.feedback  # a field the answer made up, with its own value
        return status_only(verdict)

    # -- generation ------------------------------------------------------------------------------

    def generate(self, n: int, seed: int, split: str, slice: str = "core") -> list[Task]:
        """``n`` distinct tasks of ``split``, the same for the same arguments; families in round robin.

        Train mixes every family but the held-out ones (each task tagged with its family's slice); the
        benchmark draws only the families of ``slice``. A held-out family is never trained on, so its
        benchmark tasks come from its whole space, not only the benchmark's share of it.
        """
        check_split(self.name, split, slice, n)
        chosen = [f for f in FAMILIES.values() if (f.slice != HELDOUT if split == "train" else f.slice == slice)]
        rng = random.Random(f"{self.name}/{split}/{seed}" + ("" if split == "train" else f"/{slice}"))
        seen: set[str] = set()

        def draw(family) -> Task | None:
            def attempt() -> Task | None:
                facts = family.sample(rng)
                key = stable_hash([self.name, family.name, facts])
                if key in seen or (family.slice != HELDOUT and in_benchmark(key) != (split == "benchmark")):
                    return None
                seen.add(key)
                return self._build(family.name, facts, key, split)

            return draw_until(attempt)

        return round_robin(self.name, chosen, n, draw, split=split, slice=slice)

    def _build(self, kind: str, facts: dict, key: str, split: str) -> Task:
        family = FAMILIES[kind]
        document, fields, truth = family.render(facts, random.Random(key))  # wording follows from the facts
        return Task(
            task_id=f"{self.name}/{split}/{family.slice}/{key[:10]}",
            env=self.name,
            split=split,
            slice=family.slice,
            kind=kind,
            prompt=f"Document:\n{document}\n{field_line(fields)}\nJSON:\n",
            entry_point="",
            checks={"schema": json_schema(fields), "truth": truth},
            reference=json.dumps(truth, ensure_ascii=False) + "\n",
        )

    # -- verification ----------------------------------------------------------------------------

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: Any = None) -> list[Verdict]:
        """valid JSON → schema → field precision / recall; never raises on bad output."""
        self.check_batch(tasks, completions)
        return [self._judge(task, completion) for task, completion in zip(tasks, completions)]

    @staticmethod
    def _judge(task: Task, completion: str) -> Verdict:
        read = extract_json(completion, task.prompt)  # a raw continuation is read as it is, and its steps get no "extract"
        nothing = {"valid_json": False, "schema_valid": False, "field_precision": 0.0, "field_recall": 0.0}
        if read.failed:
            return Verdict(components={name: 0.0 for name in COMPONENTS}, steps={**read.steps, **nothing}, passed=False,
                           feedback=read.feedback, status="format_error", failed_step="extract")
        value, error = parse_json(read.text)
        if value is None:
            return Verdict(components={name: 0.0 for name in COMPONENTS}, steps={**read.steps, **nothing},
                           passed=False, feedback=f"valid_json: {error}", status="format_error", failed_step="valid_json")
        schema = check_schema(value, task.checks["schema"])
        fields = field_scores(value, task.checks["truth"], numeric_tolerance=NUMERIC_TOLERANCE)
        steps = {**read.steps, "valid_json": True, "schema_valid": schema.score == 1.0,
                 "field_precision": fields.precision, "field_recall": fields.recall}
        failed_step = next((name for name in STEPS[1:] if steps[name] < 1), None)
        passed = failed_step is None
        if passed:
            feedback = f"all {len(task.checks['truth'])} fields right"
        elif failed_step == "schema_valid":
            feedback = f"schema: {schema.message}"
        else:
            feedback = f"fields: {fields.message}"
        # Credit only for what the task asked, the document's values: valid JSON of the right shape
        # with none of them right ({}, a template of nulls or blanks) earns nothing.
        gate = 1.0 if fields.f1 > 0 else 0.0
        return Verdict(components={"format": gate, "schema": gate * schema.score, "fields": fields.f1}, steps=steps,
                       passed=passed, feedback=feedback, status="passed" if passed else "failed", failed_step=failed_step)
