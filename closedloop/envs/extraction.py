"""Reading the answer out of an instruct-style reply, before an environment verifies it.

The built-in policy continues a prompt: it writes a function's body after the prompt's ``def``, one
JSON object after ``JSON:``, the ``R1: yes`` lines after the rules. A chat model replies instead:
prose around a fenced block (often restating the whole ``def``), JSON in a ```json block or after a
sentence, rule lines in markdown bold or bullets. Each function here takes a completion (and what
its environment knows: the prompt, the entry point, the rule ids) and returns an :class:`Extraction`:
the text to verify and ``how`` it was found.

``how`` is ``"as_is"`` whenever the completion shows none of the marks of an instruct reply (a ```
fence, a restated signature, prose before a JSON object, markdown around a rule line). That is
everything the built-in writes, and the text is then exactly what the environment verified before
extraction existed (``prompt + completion`` for code), so its verdicts do not change by a byte. The
marks are chosen to be ones a raw continuation does not make: no task prompt or reference holds a
backtick, a code completion starts indented, an extract completion starts with ``{``. When a mark is
there and no answer can be read, ``how`` is ``"failed"`` and ``error`` says why, in words the
failure→fix prompt can show the model.

Rules per answer kind (the first that applies wins):

``extract_program`` (code, data: a function ``entry_point``; script: a whole script, no entry point)
  1. No ``` fence line: if ``entry_point`` is given and the completion starts (after blank lines,
     imports and decorators) with ``def <entry_point>(``, the reply restated the signature:
     ``"signature"``, and the program is the prompt's preamble (all before its own ``def`` line:
     imports, helpers, comments) + the reply's code: from its start through the def's body and the
     top-level defs, classes, imports and comments after it, up to the first other unindented line
     (prose after the code is dropped). Otherwise ``"as_is"``: the program is ``prompt + completion``
     (prose *before* an unfenced def is not read: a raw continuation can look the same).
  2. Fenced blocks: only closed ones tagged python / py / python3 (those first) or untagged count;
     the *first* that fits is the answer (the solution comes before usage examples and tests). With
     an entry point: the first block that defines it (program = preamble + block), else the first
     whose first line is indented, a body (program = prompt + block). Without one (script): the
     first non-empty block (program = prompt + block: the prompt's ``import os`` stays).
  3. Failures: a fence never closed (the reply was cut off) when no closed block fits; only blocks
     in other languages (```bash); empty blocks; blocks that neither define the entry point nor
     continue its body.

``extract_json`` (extract)
  1. The completion starts with ``{`` (after whitespace) or is blank: ``"as_is"`` (one JSON object,
     strictly, as before: prose after the object stays an error).
  2. A fence: the first closed block tagged json, else the first untagged one: ``"fenced"``.
     Failures: an unclosed fence and no closed block; only blocks in other languages; an empty block.
  3. Prose first: at least two words before the object, and not JSON (no ``":``, no ``[`` or ``,``
     just before it: a broken object or an array) nor the prompt's text run on (a copy of it, or
     text ending with the prompt's last line): the first balanced ``{...}`` that parses as a JSON
     object: ``"json_object"``; prose after it is dropped. Otherwise (no such object: a broken one
     is not taken, noise holds balanced braces too) ``"as_is"``.

``extract_rule_lines`` (rules)
  Marks: a fence line, or two rule / decision keys in markdown (``**R1:** yes``, ``R1: **yes**``,
  ```R1```, ``- R1:``, ``1. R1``, ``### Decision``, ``| R1 | yes |``); a single stray ``*`` or ``|``
  is not markdown, nor is one marked line (a raw continuation can slip one in). Without: ``"as_is"``. With one,
  every line is read for ``<key>: <value>`` once the markdown is stripped (an optional parenthesis
  after the key is allowed, ``R1 (income >= 50000): no``). The answer is the value's first word when
  it is yes / no (a decision: one of the task's outcomes), in any case; else the last such word the
  value names on its own (``R1: employed=yes and age <= 25 -> **No**`` is no); else the first word as
  written, for the format check to report. A key given twice keeps its last value (the conclusion
  after the reasoning). What is checked is the canonical lines: rule ids in the task's order, then
  other keys, then the decision; ``"fenced"`` when the reply has a fence, else ``"markdown"``.
  Failure: no such line at all.

In a verdict (see ``Extraction.steps``): nothing for ``as_is``; else the steps start with
``"extract"``, ``how`` as a string when an answer was read (shaping and check counts skip strings,
so a chat reply earns what the same answer written raw earns), False when none could be read (then
the failed step is ``"extract"``, nothing runs and every component is 0).

What is not read: a reply that is prose without any mark (no fence, no markdown) is verified as it
is, since a raw continuation can look the same; an unclosed fence is never completed; ``~~~`` fences
and inline backtick spans are not fences.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple, Sequence

STEP = "extract"  # the step signal's name; it comes first in a verdict's steps when present
AS_IS, FENCED, SIGNATURE, JSON_OBJECT, MARKDOWN, FAILED = "as_is", "fenced", "signature", "json_object", "markdown", "failed"
PYTHON_TAGS = ("python", "py", "python3", "py3")
JSON_TAGS = ("json", "jsonc", "json5")
_PROSE = re.compile(r"[^\W\d_]{2,}\W+[^\W\d_]{2,}")  # two words: what comes before a JSON object in a chat reply
_MAX_OBJECT_STARTS = 20  # "{" positions tried for a JSON object in prose: bounds the scan on adversarial text

_OPEN = re.compile(r"^([ \t]*)(`{3,})[ \t]*([^`]*)$")  # a fence line: indent, backticks, info string
_HEADER = re.compile(r"(?:import\s|from\s+\S+\s+import\s|@)")  # lines a restated def may start after
_TOP_LEVEL = re.compile(r"(?:(?:async\s+)?def\s|class\s|@|import\s|from\s+\S+\s+import\s|#)")  # kept after it


class Extraction(NamedTuple):
    text: str  # what the environment verifies (a program, a JSON text, rule lines); "" when failed
    how: str  # as_is | fenced | signature | json_object | markdown | failed
    error: str = ""  # why nothing could be read ("" unless failed)

    @property
    def failed(self) -> bool:
        return self.how == FAILED

    @property
    def steps(self) -> dict[str, str | bool]:
        """The step signal that goes first in a verdict's steps: none for ``as_is`` (so verdicts of raw
        continuations are as before), ``how`` (a string) when an answer was read, False when not.

        A string is not a judged step: reward shaping and check counts skip it, so reading a fenced
        reply earns nothing over writing the raw continuation; a False counts, and fails the chain.
        """
        if self.how == AS_IS:
            return {}
        return {STEP: False if self.failed else self.how}

    @property
    def feedback(self) -> str:
        return f"extract: {self.error}"


class Block(NamedTuple):
    lang: str  # the first word of the info string, lowercased ("" when untagged)
    code: str  # the lines between the fences, with the opening fence's indent removed
    line: int  # the 1-based line of the opening fence


def _lines(text: str) -> list[str]:
    """The lines of ``text`` as Python source has them: split at \\n, \\r\\n and \\r only (str.splitlines
    would also split at form feeds and the like, which a string literal in the code may hold)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _failed(error: str) -> Extraction:
    return Extraction("", FAILED, error)


def has_fence(text: str) -> bool:
    """Whether any line of ``text`` is a ``` fence."""
    return "```" in text and any(_OPEN.match(line) for line in _lines(text))


def fenced_blocks(text: str) -> tuple[list[Block], int | None]:
    """(the closed ``` blocks in order, the line of a fence opened and never closed, or None).

    A block closes at a line of only backticks, at least as many as opened it (CommonMark); its lines
    lose up to the opening fence's indentation, so a block inside a list item reads as top-level code.
    """
    blocks: list[Block] = []
    lines = _lines(text)
    index = 0
    while index < len(lines):
        opened = _OPEN.match(lines[index])
        if not opened:
            index += 1
            continue
        indent, ticks, info = len(opened.group(1)), len(opened.group(2)), opened.group(3).strip()
        lang = info.split()[0].lower() if info else ""
        body: list[str] = []
        for end in range(index + 1, len(lines)):
            stripped = lines[end].strip()
            if stripped and set(stripped) == {"`"} and len(stripped) >= ticks:
                blocks.append(Block(lang, "".join(_dedent(line, indent) + "\n" for line in body), index + 1))
                index = end + 1
                break
            body.append(lines[end])
        else:
            return blocks, index + 1
    return blocks, None


def _dedent(line: str, indent: int) -> str:
    width = len(line) - len(line.lstrip(" \t"))
    return line[min(width, indent):]


def _def_pattern(entry_point: str) -> re.Pattern[str]:
    return re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)


def preamble(prompt: str, entry_point: str) -> str:
    """What the prompt holds before its own ``def <entry_point>(`` line (imports, helpers, comments):
    kept in front of a reply that restates the def. The whole prompt when it has no such line."""
    found = list(_def_pattern(entry_point).finditer(prompt)) if entry_point else []
    return prompt[: found[-1].start()] if found else prompt


def _first_line(text: str) -> str:
    return next((line for line in _lines(text) if line.strip()), "")


def _restated_def(completion: str, entry_point: str) -> str | None:
    """The code of a reply that *starts* with the def of ``entry_point`` (after imports or decorators): the
    def with its body and the top-level defs, classes and imports after it, up to the first other
    unindented line (prose). None when the reply does not start so."""
    lines = _lines(completion)
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    at = start
    while at < len(lines) and (not lines[at].strip() or _HEADER.match(lines[at])):
        at += 1
    if at == len(lines) or not _def_pattern(entry_point).match(lines[at]):
        return None
    end = at + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in (" ", "\t") or _TOP_LEVEL.match(lines[end])):
        end += 1
    return "".join(line + "\n" for line in lines[start:end])


def _languages(blocks: list[Block]) -> str:
    return ", ".join(sorted({f"```{b.lang}" if b.lang else "```" for b in blocks}))


def _unclosed(line: int) -> str:
    return f"the ``` fence opened on line {line} is never closed (was the reply cut off?)"


def extract_program(completion: str, prompt: str, entry_point: str = "") -> Extraction:
    """The program a code-writing reply makes (see the module's rules); ``prompt + completion`` as is."""
    if not has_fence(completion):
        code = _restated_def(completion, entry_point) if entry_point else None
        if code is not None:
            return Extraction(preamble(prompt, entry_point) + code, SIGNATURE)
        return Extraction(prompt + completion, AS_IS)
    blocks, unclosed = fenced_blocks(completion)
    python = [b for b in blocks if b.lang in PYTHON_TAGS] + [b for b in blocks if b.lang == ""]
    if entry_point:
        definition = _def_pattern(entry_point)
        for block in python:
            if definition.search(block.code):
                return Extraction(preamble(prompt, entry_point) + block.code, FENCED)
        for block in python:
            if _first_line(block.code)[:1] in (" ", "\t"):
                return Extraction(prompt + block.code, FENCED)
    else:
        for block in python:
            if block.code.strip():
                return Extraction(prompt + block.code, FENCED)
    if unclosed is not None:
        return _failed(_unclosed(unclosed))
    if not python:
        return _failed(f"the reply's code blocks are {_languages(blocks)}, expected a ```python block")
    if not any(block.code.strip() for block in python):
        return _failed("the ```python block is empty")
    return _failed(f"no ```python block defines {entry_point}(...) or continues its body (indented lines)")


def _matching_brace(text: str, start: int) -> int | None:
    """The index of the ``}`` closing the ``{`` at ``start`` (JSON strings skipped), None if none does."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def first_json_object(text: str) -> str | None:
    """The first balanced ``{...}`` of ``text`` that parses as a JSON object; None when none does (a
    broken one is not taken: noise holds balanced braces too, and is verified as written)."""
    start = text.find("{")
    for _ in range(_MAX_OBJECT_STARTS):
        if start < 0:
            break
        end = _matching_brace(text, start)
        if end is not None:
            candidate = text[start:end + 1]
            try:
                if isinstance(json.loads(candidate), dict):
                    return candidate
            except (ValueError, RecursionError):
                pass
        start = text.find("{", start + 1)
    return None


def _runs_on(before: str, prompt: str) -> bool:
    """Whether the text before an object is the prompt's, as a continuation that ran on writes it: a
    copy of the prompt's text, or ending with the prompt's own last line (``JSON:``)."""
    last = _first_line("\n".join(reversed(_lines(prompt)))).strip()
    written = _first_line("\n".join(reversed(_lines(before)))).strip()
    return before.strip() in prompt or (bool(last) and written == last)


def extract_json(completion: str, prompt: str = "") -> Extraction:
    """The JSON text of a reply (see the module's rules); the completion as is when it starts with ``{``."""
    stripped = completion.strip()
    if not stripped or stripped.startswith("{"):
        return Extraction(completion, AS_IS)
    if has_fence(completion):
        blocks, unclosed = fenced_blocks(completion)
        for block in [b for b in blocks if b.lang in JSON_TAGS] + [b for b in blocks if b.lang == ""]:
            if block.code.strip():
                return Extraction(block.code, FENCED)
        if unclosed is not None:
            return _failed(_unclosed(unclosed))
        if any(b.lang in JSON_TAGS or b.lang == "" for b in blocks):
            return _failed("the ```json block is empty")
        return _failed(f"the reply's code blocks are {_languages(blocks)}, expected a ```json block")
    found = first_json_object(completion)
    before = completion[:completion.find(found)] if found is not None else ""
    if (found is None or not _PROSE.search(before) or '":' in before or before.rstrip().endswith(("[", ","))
            or _runs_on(before, prompt)):
        return Extraction(completion, AS_IS)  # not prose (a stray word, broken JSON, the prompt run on): as written
    return Extraction(found, JSON_OBJECT)


_WORD = re.compile(r"[^\W_]\w*(?:-\w+)*")


def _key_pattern(ids: Sequence[str]) -> str:
    return rf"(?:{''.join(re.escape(i) + '|' for i in ids)}R\d+|(?:final\s+)?decision)"


def _marked_key(ids: Sequence[str]) -> re.Pattern[str]:
    """A rule or decision key in markdown: paired bold or backticks around the key or the value, a list
    item, a heading, a table row. Single stray characters (``*R2: yes``, ``|R1``) are not marks: a raw
    continuation can slip one in."""
    key = _key_pattern(ids)
    bold = r"(?:\*\*|__)"
    return re.compile(
        rf"{bold}[ \t]*{key}\b[^\n]*?{bold}"  # **R1:** yes, **Decision: approve**
        rf"|`{key}\b[^`\n]*`"  # `R1`: yes
        rf"|^[ \t]*{key}[ \t]*:[ \t]*(?:{bold}[^*_\n]+{bold}|`[^`\n]+`)"  # R1: **yes**
        rf"|^[ \t]*(?:[-*+•]|\d+[.)]|#{{1,6}})[ \t]+(?:{bold}|`)?{key}\b"  # - R1: yes, 1. R1, ## Decision
        rf"|^[ \t]*\|[ \t]*(?:{bold}|`)?{key}(?:{bold}|`)?[ \t]*\|[^\n]*\|[ \t]*$",  # | R1 | yes |
        re.IGNORECASE | re.MULTILINE)


def _rule_line(line: str, key_line: re.Pattern[str]) -> tuple[str, str] | None:
    """(key as written, value word) of one line once its markdown is stripped; None when it holds no key."""
    text = line.strip()
    if text.startswith("|"):  # a table row: | R1 | yes | why |
        cells = [cell.strip() for cell in text.strip("|").split("|")]
        text = f"{cells[0]}: {cells[1]}" if len(cells) >= 2 else cells[0]
    text = re.sub(r"^(?:>\s*)+", "", text)
    text = re.sub(r"^(?:[-*+•]|\d+[.)]|#+)\s+", "", text)
    text = text.replace("**", "").replace("__", "").replace("`", "").strip("*_ \t")
    found = key_line.match(text)
    if not found:
        return None
    return found.group(1), found.group(2)


def _answer_word(value: str, choices: Sequence[str]) -> str:
    """The answer in a value: its first word when that is one of ``choices`` (any case), else the last of
    them it names as a word of its own (not ``employed=yes``), else its first word as written."""
    words = [m.group(0) for m in _WORD.finditer(value)]
    lower = {choice.lower(): choice for choice in choices}
    if words and words[0].lower() in lower:
        return lower[words[0].lower()]
    named = [m.group(0) for m in _WORD.finditer(value)
             if m.group(0).lower() in lower and "=" not in value[max(0, m.start() - 1):m.end() + 1]]
    return lower[named[-1].lower()] if named else (words[0] if words else "")


def extract_rule_lines(completion: str, ids: Sequence[str], outcomes: Sequence[str] = ()) -> Extraction:
    """Canonical ``R1: yes`` / ``decision: x`` lines read from a markdown reply (see the module's rules)."""
    fenced = has_fence(completion)
    if not fenced and len(_marked_key(ids).findall(completion)) < 2:
        return Extraction(completion, AS_IS)  # one marked line can be a slip of a raw continuation
    key_line = re.compile(rf"({_key_pattern(ids)})\s*(?:\([^)]*\))?\s*(?::|=|->|→|–|—|-)\s*(.*)$", re.IGNORECASE)
    spelling = {i.lower(): i for i in ids}
    found: dict[str, str] = {}
    for line in completion.splitlines():
        parsed = None if _OPEN.match(line) else _rule_line(line, key_line)
        if parsed is None:
            continue
        key, value = parsed
        if key.lower().endswith("decision"):
            key, value = "decision", _answer_word(value, outcomes)
        else:
            key, value = spelling.get(key.lower(), key.upper()), _answer_word(value, ("yes", "no"))
        found[key] = value  # a key given twice keeps its last value
    if not found:
        return _failed(f"no '{ids[0] if ids else 'R1'}: yes|no' or 'decision: ...' line in the reply")
    order = [i for i in ids if i in found] + [k for k in found if k not in ids and k != "decision"]
    order += ["decision"] if "decision" in found else []
    return Extraction("".join(f"{key}: {found[key]}\n" for key in order), FENCED if fenced else MARKDOWN)


def version() -> str:
    """A hash of this module's code: part of every reward component's config, as it decides what is verified."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
