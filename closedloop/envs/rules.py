"""The rules environment: apply an explicit rule set to a case, showing each rule's conclusion and the decision.

The prompt lists 2-4 numbered rules (a condition on the case's attributes → an outcome), how they
combine (the first that applies, in the listed or a stated priority order; else a default) and the
case. The completion answers, one line each::

    R1: yes
    R2: no
    decision: approve

The verifier's rule engine derives the true chain from the structured spec kept in the task's
checks (rules_tasks describes it); it evaluates data and never evals text. Steps: format → each
rule's conclusion → the decision; a chat reply's lines (in markdown bold, bullets, a table or a
fence) are read first by envs/extraction.py, and its steps then start with ``extract``. Splits are disjoint by construction: a task belongs to the
benchmark iff the hash of its family and spec falls in base.in_benchmark's bucket.

In an episode (envs/episodes.py) the checks are verified whole and never reveal a right verdict: the
model reads a format error (which line, in what form) or how many of the rule conclusions and the
decision are wrong, never which ones, nor a right conclusion or decision.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypedDict

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
from closedloop.envs.episodes import status_only
from closedloop.envs.extraction import extract_rule_lines
from closedloop.envs.rules_tasks import FAMILIES, render_prompt
from closedloop.envs.validators import match_format

if TYPE_CHECKING:
    from closedloop.config import RulesEnvParams

COMPONENTS = ("format", "steps", "decision")
# "R1: yes", or with the work shown (rules.show_work): "R1: age 52 is not <= 30: no"; only the last word is read.
RULE_LINE = "{id}: (?:[^\\n]*: )?(yes|no)"
DECISION_LINE = r"decision: (\S+)"


# What the verifier reads of a task's checks: the spec rules_tasks describes ("order" and a rule's
# "missing" are optional; the rule engine's own run checks the conditions).
Rule = TypedDict("Rule", {"id": str, "if": dict[str, Any], "then": str})


class RuleSpec(TypedDict):
    case: dict[str, Any]  # the record the rules are applied to: attribute -> value
    rules: list[Rule]  # in listing order; the first that applies decides
    default: str  # the decision when no rule applies


class RulesChecks(TypedDict):
    """A rules task's checks: the spec the trusted rule engine runs to get each rule's verdict and the decision."""

    spec: RuleSpec  # the case, the rules and the default decision


class Chain(NamedTuple):
    conclusions: tuple[bool, ...]  # whether each rule applies, in listing order
    reasons: tuple[str, ...]  # why, e.g. "income 52000 >= 50000"
    decision: str
    decision_reason: str


class RuleEngine:
    """Derives whether each rule applies, and the decision, from a rule spec (see rules_tasks)."""

    COMPARE: dict[str, Callable[[Any, Any], bool]] = {
        ">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b,
    }

    @staticmethod
    def word(truth: bool) -> str:
        return "yes" if truth else "no"

    @classmethod
    def attributes(cls, cond: dict) -> list[str]:
        if "not" in cond:
            return cls.attributes(cond["not"])
        if "all" in cond or "any" in cond:
            return [name for part in cond.get("all", cond.get("any")) for name in cls.attributes(part)]
        return [cond["attr"]]

    @classmethod
    def holds(cls, cond: dict, case: dict) -> tuple[bool, str]:
        """(whether ``cond`` holds for ``case``, the comparison(s) that settle it)."""
        if "not" in cond:
            truth, reason = cls.holds(cond["not"], case)
            return not truth, reason
        if "all" in cond or "any" in cond:
            want_all = "all" in cond
            results = [cls.holds(part, case) for part in cond["all" if want_all else "any"]]
            deciding = [reason for truth, reason in results if truth != want_all]
            if deciding:  # one false part sinks "all"; one true part carries "any"
                return not want_all, deciding[0]
            return want_all, " and ".join(reason for _, reason in results)
        name, op, value = cond["attr"], cond["op"], cond["value"]
        actual = case[name]
        if op in cls.COMPARE:
            truth = cls.COMPARE[op](actual, value)
            return truth, f"{name} {actual} {'' if truth else 'is not '}{op} {value}"
        if op == "is":
            return actual == value, f"{name} is {cls.word(actual)}"
        if op == "=":
            return actual == value, f"{name} is {actual}" + ("" if actual == value else f", not {value}")
        if op == "in":
            truth = actual in value
            return truth, f"{name} {actual} is {'' if truth else 'not '}in ({', '.join(value)})"
        raise ValueError(f"rules env: unknown operator {op!r} in {cond}")

    @staticmethod
    def informedness(answers: list[bool], truth: tuple[bool, ...]) -> float:
        """The steps credit: how much better than a constant the conclusions are (Youden's J, clipped at 0).

        The share of the rules that apply said to apply, plus the share of those that do not said
        not to, minus 1: saying "no" (or "yes") to every rule scores 0 whatever the case, as does
        guessing, while every conclusion right scores 1. When every rule concludes alike, only that
        one share can be measured, and it is the credit.
        """
        applies = [answer for answer, true in zip(answers, truth) if true]
        not_applies = [not answer for answer, true in zip(answers, truth) if not true]
        if not applies or not not_applies:
            return sum(applies or not_applies) / len(truth)
        return max(0.0, sum(applies) / len(applies) + sum(not_applies) / len(not_applies) - 1.0)

    @classmethod
    def evaluate(cls, spec: dict) -> Chain:
        case = spec["case"]
        conclusions, reasons = [], []
        for rule in spec["rules"]:
            missing = [name for name in cls.attributes(rule["if"]) if case.get(name) is None]
            if missing:  # the rule says what a missing value means; unsaid, a rule on it does not apply
                truth = bool(rule.get("missing", False))
                reason = f"{missing[0]} is ?, and the rule says {rule['id']} is {cls.word(truth)}"
            else:
                truth, reason = cls.holds(rule["if"], case)
            conclusions.append(truth)
            reasons.append(reason)
        applies = {rule["id"]: truth for rule, truth in zip(spec["rules"], conclusions)}
        then = {rule["id"]: rule["then"] for rule in spec["rules"]}
        listed = [rule["id"] for rule in spec["rules"]]
        order = spec.get("order", listed)
        first = next((rule_id for rule_id in order if applies[rule_id]), None)
        in_order = "" if order == listed else f" in the order {', '.join(order)}"
        if first is None:
            decision, why = spec["default"], f"no rule applies, so the default {spec['default']}"
        else:
            decision, why = then[first], f"{first} is the first rule that applies{in_order}"
        return Chain(tuple(conclusions), tuple(reasons), decision, why)


class RulesEnv(BaseEnvironment):
    name = "rules"
    uses_sandbox = False
    sandbox_preload: tuple[str, ...] = ()
    components = COMPONENTS
    # The decision is what matters; the intermediate conclusions are the process reward that gets it there.
    default_weights = {"format": 0.1, "steps": 0.4, "decision": 0.5}
    task_checks = RulesChecks

    @staticmethod
    def check_task(task: Task) -> list[str]:
        """Rule ids that name one rule each, an order made of them, and a spec the rule engine can evaluate."""
        spec = task.checks["spec"]
        ids = [rule["id"] for rule in spec["rules"]]
        if not ids:
            return ["checks.spec.rules must hold at least one rule"]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            return [f"checks.spec.rules: rule id(s) {repeated} repeat"]
        order = spec.get("order", ids)
        if type(order) is not list or not all(type(i) is str and i in ids for i in order):
            return [f"checks.spec.order must be a list of rule ids (of {ids}), got {order!r:.80}"]
        try:
            RuleEngine.evaluate(spec)
        except Exception as error:  # noqa: BLE001 - the spec is data from a file: whatever it trips on is its fault
            return [f"checks.spec cannot be evaluated: {type(error).__name__}: {error}"]
        return []

    def __init__(self, params: RulesEnvParams) -> None:
        self.params = params

    def component_sources(self) -> dict[str, tuple[Callable | type, Any]]:
        # _judge gates format and the decision on the steps credit: its code is part of what they score.
        lines = {"rule_line": RULE_LINE, "decision_line": DECISION_LINE, "extraction": extraction.version(),
                 "judge": source_of(RulesEnv._judge)}
        return {"format": (match_format, lines), "steps": (RuleEngine, lines), "decision": (RuleEngine, lines)}

    # -- episodes (envs/episodes.py) -------------------------------------------------------------

    def split_checks(self, task: Task) -> tuple[dict[str, Any], dict[str, Any]]:
        """No partition: the same checks both ways, whose right verdicts no feedback shows."""
        return task.checks, task.checks

    def shown_feedback(self, task: Task, verdict: Verdict) -> str:
        """A format error says which line and the form it must have (never quoting it); wrong answers
        are only counted: never which rule, nor the right conclusion or decision."""
        ids = [rule["id"] for rule in task.checks["spec"]["rules"]]
        if verdict.passed:
            return f"passed the visible checks: all {len(ids)} rule conclusions and the decision right"
        if verdict.failed_step == "extract":
            return verdict.feedback  # names the rule-line form, nothing of the verdicts
        if verdict.failed_step == "format_ok":
            found = re.match(r"format: (missing line|line|extra line) ([1-9]\d*)\b", verdict.feedback)
            if not found:
                return status_only(verdict)
            what, number = found.group(1), int(found.group(2))
            form = f"{ids[number - 1]}: yes|no" if number <= len(ids) else "decision: <outcome>"
            if what == "extra line":
                return f"format: extra line {number} after the decision line"
            return f"format: line {number} {'is missing' if what == 'missing line' else 'is wrong'}; it must read '{form}'"
        wrong = sum(verdict.steps.get(i) is False for i in ids) + (verdict.steps.get("decision") is False)
        answers = f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else ids[0]
        return f"{wrong} of the {len(ids) + 1} answers ({answers} and the decision) {'is' if wrong == 1 else 'are'} wrong"

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
                spec = family.sample(rng)
                if spec is None:
                    return None
                key = stable_hash([self.name, family.name, spec])
                if key in seen or (family.slice != HELDOUT and in_benchmark(key) != (split == "benchmark")):
                    return None
                chain = RuleEngine.evaluate(spec)
                if not family.accept(spec, list(chain.conclusions)):
                    return None
                seen.add(key)
                return self._build(family.name, spec, chain, key, split)

            return draw_until(attempt)

        return round_robin(self.name, chosen, n, draw, split=split, slice=slice)

    def _build(self, kind: str, spec: dict, chain: Chain, key: str, split: str) -> Task:
        family = FAMILIES[kind]
        work = getattr(self.params, "show_work", False)
        answers = [f"{rule['id']}: {reason + ': ' if work else ''}{RuleEngine.word(truth)}"
                   for rule, truth, reason in zip(spec["rules"], chain.conclusions, chain.reasons)]
        return Task(
            task_id=f"{self.name}/{split}/{family.slice}/{key[:10]}",
            env=self.name,
            split=split,
            slice=family.slice,
            kind=kind,
            prompt=render_prompt(spec),
            entry_point="",
            checks={"spec": spec},
            reference="\n".join(answers + [f"decision: {chain.decision}"]) + "\n",
        )

    # -- verification ----------------------------------------------------------------------------

    def verify_batch(self, tasks: list[Task], completions: list[str], pool: Any = None) -> list[Verdict]:
        """format → each rule's conclusion → the decision; never raises on bad output."""
        self.check_batch(tasks, completions)
        return [self._judge(task, completion) for task, completion in zip(tasks, completions)]

    @staticmethod
    def _judge(task: Task, completion: str) -> Verdict:
        spec = task.checks["spec"]
        ids = [rule["id"] for rule in spec["rules"]]
        chain = RuleEngine.evaluate(spec)
        outcomes = sorted({rule["then"] for rule in spec["rules"]} | {spec["default"]})
        read = extract_rule_lines(completion, ids, outcomes)  # a raw continuation is read as it is, no "extract" step
        nothing = {**read.steps, "format_ok": False, **{i: False for i in ids}, "decision": False}
        if read.failed:
            return Verdict(components={name: 0.0 for name in COMPONENTS}, steps=nothing, passed=False,
                           feedback=read.feedback, status="format_error", failed_step="extract")
        form = match_format(read.text, [RULE_LINE.format(id=re.escape(i)) for i in ids] + [DECISION_LINE])
        if form.score < 1.0:
            return Verdict(components={name: 0.0 for name in COMPONENTS}, steps=nothing, passed=False,
                           feedback=f"format: {form.message}", status="format_error", failed_step="format_ok")
        answers = [groups[0] == "yes" for groups in form.groups[:-1]]
        decision = form.groups[-1][0]
        right = [answer == truth for answer, truth in zip(answers, chain.conclusions)]
        steps = {**read.steps, "format_ok": True, **dict(zip(ids, right)), "decision": decision == chain.decision}
        wrong = next((index for index, ok in enumerate(right) if not ok), None)
        if wrong is not None:
            failed_step = ids[wrong]
            feedback = f"{ids[wrong]} is {RuleEngine.word(chain.conclusions[wrong])}: {chain.reasons[wrong]}"
        elif not steps["decision"]:
            failed_step, feedback = "decision", f"decision is {chain.decision}, not {decision}: {chain.decision_reason}"
        else:
            failed_step, feedback = None, f"all {len(ids)} rules and the decision right"
        passed = failed_step is None
        # Credit only for conclusions that say something about this case (RuleEngine.informedness); a
        # decision reached from conclusions no better than a constant ("no" to every rule, then the
        # default) is right by luck, so it earns nothing, and neither does the format around it.
        credit = 1.0 if passed else RuleEngine.informedness(answers, chain.conclusions)
        gate = 1.0 if credit > 0 else 0.0
        return Verdict(components={"format": gate, "steps": credit, "decision": gate * float(steps["decision"])},
                       steps=steps, passed=passed, feedback=feedback, status="passed" if passed else "failed",
                       failed_step=failed_step)
