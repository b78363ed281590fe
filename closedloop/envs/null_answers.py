"""Null answers: completions that do nothing the task asked, per built-in environment.

A verifier that rewards one of these teaches a policy under RL pressure to do nothing. The tests
(tests/unit/test_null_answers.py) hold every one to a reward of at most 0.1 on every benchmark task,
and benchmarks/verify.py reports their mean reward as each environment's ``null_baseline``. They are
built from what the prompt shows (the function's parameters, the starting files, the field names,
the rule ids and the default), never from the hidden checks: a policy could write each of them.
The verifiers do not look for these strings; they credit only what a task asked to change. An
answer that does what the task asks on its data (the reference, a constant that is the case's
answer, a copy whose text is the output's) is left out of that task's table.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from closedloop.envs.base import Task
from closedloop.envs.rules import RuleEngine

# A completion continues the prompt, so a function body is indented; a script or JSON answer is not.
_COMMON: dict[str, Callable[[Task], str]] = {
    "empty": lambda task: "",
    "blank_lines": lambda task: "\n\n",
    "echo_prompt": lambda task: task.prompt,
}


def _params(task: Task) -> list[str]:
    """The parameter names of the prompt's last ``def`` line."""
    found = re.findall(r"^def \w+\((.*)\):\s*$", task.prompt, flags=re.M)
    return [p.split("=")[0].split(":")[0].strip() for p in found[-1].split(",") if p.strip()] if found else []


def _code(task: Task) -> dict[str, str]:
    table = {"pass": "    pass\n", "ellipsis": "    ...\n", "comment": "    # TODO\n    pass\n",
             "return_none": "    return None\n", "bare_return": "    return\n"}
    for index, name in enumerate(_params(task), 1):  # returning an argument unchanged
        table[f"return_arg{index}"] = f"    return {name}\n"
    return table


def _data(task: Task) -> dict[str, str]:
    table = {"pass": "    pass\n", "comment": "    # TODO\n    pass\n"}
    for index, name in enumerate(_params(task), 1):  # df, other: an input table unchanged
        table[f"return_arg{index}"] = f"    return {name}\n"
        table[f"return_arg{index}_copy"] = f"    return {name}.copy()\n"
    return table


def _script(task: Task) -> dict[str, str]:
    start = sorted(task.checks["start"])
    # What the prompt names as the goal's output, copied from an input: the right file, wrong content.
    outputs = sorted(path for path in task.checks["expected"] if path not in task.checks["start"])
    copy = "import os, shutil\n" + "".join(
        f"os.makedirs(os.path.dirname({path!r}) or '.', exist_ok=True)\nshutil.copy({start[0]!r}, {path!r})\n"
        for path in outputs) if outputs and start else "pass\n"
    rewrite = ("import os\nfor root, _, names in os.walk('.'):\n    for name in names:\n"
               "        path = os.path.join(root, name)\n        text = open(path).read()\n"
               "        open(path, 'w').write(text)\n")
    table = {"pass": "pass\n", "comment": "# nothing to do\n", "list_files": "import os\nprint(os.listdir('.'))\n",
             "rewrite_unchanged": rewrite}
    # Where the goal is a copy, copying is the task; where the copied text is what the output must
    # hold (a concatenation of one non-empty part), the copy is the answer, by the data's luck.
    lucky = any(task.checks["expected"][path] == task.checks["start"][start[0]] for path in outputs) if start else False
    if task.checks.get("op") != "copy" and not lucky:
        table["copy_input_to_output"] = copy
    if task.checks["expected"] == task.checks["start"]:
        # Nothing matches the goal (an edge case): leaving the tree alone is the right answer, and
        # only the answers that write no script at all are null here.
        return {"pass": "", "comment": "", "list_files": "", "rewrite_unchanged": "", "echo_prompt": ""}
    return table


def _extract(task: Task) -> dict[str, str]:
    fields = list(task.checks["schema"]["properties"])
    return {"empty_object": "{}\n", "null_template": json.dumps({name: None for name in fields}) + "\n",
            "empty_strings": json.dumps({name: "" for name in fields}) + "\n"}


def _rules(task: Task) -> dict[str, str]:
    spec = task.checks["spec"]
    ids = [rule["id"] for rule in spec["rules"]]
    table = {"default_only": f"decision: {spec['default']}\n"}
    truth = RuleEngine.evaluate(spec).conclusions
    # A constant answer: the same conclusion for every rule, then the decision it leads to. Where
    # every rule does conclude alike, that constant is the case's answer, not a null one.
    if any(truth):
        table["all_no_default"] = "".join(f"{i}: no\n" for i in ids) + f"decision: {spec['default']}\n"
    if not all(truth):
        order = spec.get("order", ids)
        first = next(rule["then"] for rule in spec["rules"] if rule["id"] == order[0])
        table["all_yes_first"] = "".join(f"{i}: yes\n" for i in ids) + f"decision: {first}\n"
    return table


_TABLES: dict[str, Callable[[Task], dict[str, str]]] = {
    "code": _code, "data": _data, "script": _script, "extract": _extract, "rules": _rules}
ENVIRONMENTS = tuple(_TABLES)


def null_table(env_name: str, task: Task) -> dict[str, str]:
    """{name: completion} of the null answers of ``task`` in built-in environment ``env_name``.

    An answer that is the task's own reference (a rules task whose answer is "no rule applies, so
    the default") is left out: there, doing nothing is the right answer.
    """
    if env_name not in _TABLES:
        raise ValueError(f"no null answers for environment {env_name!r}; built-in: {list(_TABLES)}")
    table = {name: make(task) for name, make in _COMMON.items()} | _TABLES[env_name](task)
    # "" from an environment's table: that answer is not null for this task (it does what was asked).
    return {name: text for name, text in table.items()
            if text.strip() != task.reference.strip() and (text or name in ("empty",))}


def null_answers(env_name: str, task: Task) -> list[str]:
    """The completions of :func:`null_table`, in its order."""
    return list(null_table(env_name, task).values())
