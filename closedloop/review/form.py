"""What a reviewer reads: a review sample row as Markdown (the Prefect pause form shows it above the
fields; `closedloop review --list` prints it)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

_LONGEST = 4000  # characters of a prompt or completion shown; a runaway completion must not bury the form


def _fenced(text: str) -> str:
    text = text if len(text) <= _LONGEST else text[:_LONGEST] + f"\n… ({len(text) - _LONGEST} more characters)"
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text}\n{fence}"


def sample_markdown(row: Mapping[str, Any], number: int | None = None) -> str:
    verdict = row["verifier"]
    head = f"{number}. " if number is not None else ""
    steps = ", ".join(f"{name}={json.dumps(value)}" for name, value in verdict.get("steps", {}).items()) or "none"
    components = ", ".join(f"{name}={'n/a' if value is None else f'{value:g}'}"
                           for name, value in verdict.get("components", {}).items()) or "none"
    lines = [
        f"### {head}`{row['sample_id']}`",
        f"{row['env']} / {row['slice']} · bucket **{row['bucket']}** · drawn as *{row['stratum']}*",
        "", "**Prompt**", _fenced(row["prompt"]), "", "**Completion**", _fenced(row["completion"]), "",
        f"**Verifier**: {'pass' if verdict['passed'] else 'fail'} · reward {verdict['reward']:.3f} · "
        f"status `{verdict['status']}`",
        f"- step signals: {steps}",
        f"- components: {components}",
    ]
    if verdict.get("feedback"):
        lines.append(f"- feedback: {verdict['feedback']}")
    return "\n".join(lines)


def review_markdown(rows: Iterable[Mapping[str, Any]], note: str = "") -> str:
    rows = list(rows)
    intro = (f"## Review of iteration {rows[0]['iteration']}: {len(rows)} samples\n\n"
             "Score each sample you judge from 0 (wrong) to 1 (right), pick a label (correct, wrong, "
             "reward_hacking, formatting, other), and add a comment if useful. Leave a sample empty to skip "
             "it. Your answers are queued for the next iteration's `human` reward component; a "
             "`reward_hacking` label adds the sample to the known hacks every later verifier must fail.")
    parts = ([f"> **{note}**\n"] if note else []) + [intro]
    parts += [sample_markdown(row, number) for number, row in enumerate(rows, start=1)]
    return "\n\n".join(parts)
