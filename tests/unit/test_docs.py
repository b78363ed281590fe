"""The guide names only what exists: README.md and docs/*.md checked against the CLI parser, config.py
and the repository's files. A renamed key or flag fails here instead of misleading a newcomer."""

from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md")]
# docs/benchmarks.md is a lab notebook: its older sections quote the flags and keys of their commit.
PLACEHOLDER = re.compile(r"^<[^>]+>$")  # envs.<env>.weights, monitors.thresholds.<name>
NOT_PARAMS = {"model.fingerprint"}  # an MLflow tag of each model version, named like a key


def code_spans(path: Path, fenced_too: bool = True) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span and (``fenced_too``) every line of a fenced block."""
    spans, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if fenced_too:
                spans.append((number, line))
        else:
            spans += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return spans


def param_keys(path: Path) -> list[tuple[int, str]]:
    from closedloop.config import Params

    sections = set(Params.model_fields)
    found = []
    # Inline spans only: fenced blocks hold YAML (nested keys) and quoted error output.
    for number, span in code_spans(path, fenced_too=False):
        for token in re.findall(r"(?<![\w./-])([a-z_]+(?:\.(?:[a-z_0-9]+|<[^>]+>))+)", span):
            is_file = token.endswith((".py", ".yaml", ".json", ".jsonl", ".md"))
            if token.split(".")[0] in sections and token not in NOT_PARAMS and not is_file:
                found.append((number, token))
    return found


ANY, LEAF = "any key", "a value"


def kind_of(annotation: object) -> object:
    """What a field holds: a section (its model class), a free mapping (ANY) or a plain value (LEAF)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is dict:
        return ANY
    if origin is typing.Annotated:
        return kind_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = [kind_of(a) for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
        return ANY if any(m is not LEAF for m in members) else LEAF  # a union of backends: keys per member
    return LEAF


def resolves(parts: list[str], node: object = None) -> bool:
    """Whether ``section.key[.key…]`` names a field of Params; a placeholder (``<env>``) matches any
    field under which the rest resolves, and a free mapping any key."""
    from closedloop.config import Params

    node = Params if node is None else node
    if not parts or node is ANY:
        return True
    if node is LEAF:
        return False
    fields = node.model_fields
    head, rest = parts[0], parts[1:]
    if PLACEHOLDER.match(head):
        return any(resolves(rest, kind_of(field.annotation)) for field in fields.values())
    return head in fields and resolves(rest, kind_of(fields[head].annotation))


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_params_key_the_guide_names_exists(path):
    missing = [f"{path.name}:{number}: {key}" for number, key in param_keys(path) if not resolves(key.split("."))]
    assert not missing, "keys not in config.py:\n" + "\n".join(missing)


def cli_commands() -> dict[str, set[str]]:
    """{subcommand (or "tasks export"): its option strings}."""
    from closedloop.cli import build_parser

    found: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
        found[prefix] = {opt for action in parser._actions for opt in action.option_strings}

    walk(build_parser(), "")
    return found


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_closedloop_command_and_flag_the_guide_names_exists(path):
    commands = cli_commands()
    wrong = []
    for number, span in code_spans(path):
        for match in re.finditer(r"(?:^|[\s;&|(])closedloop ((?:[a-z]+)(?: [a-z]+)?)([^|;&#`]*)", span):
            words = match.group(1).split()
            name = " ".join(words) if " ".join(words) in commands else words[0]
            if name not in commands:
                wrong.append(f"{path.name}:{number}: closedloop {words[0]} is not a command")
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", match.group(2)):
                if flag not in commands[name] | commands[""]:
                    wrong.append(f"{path.name}:{number}: closedloop {name} has no {flag}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository_and_resolve(path):
    bad = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"https?://(127\.0\.0\.1|localhost)", target) or target.startswith("#"):
                continue
            if re.match(r"[a-z]+://", target):
                bad.append(f"{path.name}:{number}: {target} leaves the repository")
                continue
            resolved = (path.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(ROOT):
                bad.append(f"{path.name}:{number}: {target} points outside the repository")
            elif not resolved.exists():
                bad.append(f"{path.name}:{number}: {target} does not exist")
        if "../shared" in line:
            bad.append(f"{path.name}:{number}: names ../shared, which a clone does not have")
    assert not bad, "\n".join(bad)


def test_the_readme_stays_a_short_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    fenced = (ROOT / "README.md").read_text().split("```")[1]
    commands = [line.split("#")[0].strip() for line in fenced.splitlines()[1:] if line.strip()]
    assert commands == ["make run", "make test"], commands  # the two first commands
