"""Reading the answer out of instruct-style replies: what each kind of reply yields, and why it fails."""

from __future__ import annotations

import pytest

from closedloop.envs.extraction import (
    AS_IS, FAILED, FENCED, JSON_OBJECT, MARKDOWN, SIGNATURE, STEP, Extraction, extract_json, extract_program,
    extract_rule_lines, fenced_blocks, first_json_object, preamble,
)

PROMPT = "# Return the sum of xs.\ndef f(xs):\n"
BODY = "    return sum(xs)\n"
DEF = "def f(xs):\n    return sum(xs)\n"
HUMANEVAL = 'from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    """Sum."""\n'


class TestProgram:
    @pytest.mark.parametrize("completion, program, how", [
        (BODY, PROMPT + BODY, AS_IS),  # the built-in's raw continuation: prompt + completion, untouched
        ("", PROMPT, AS_IS),  # blank: as is (the verifier says it does not parse)
        ("return sum(xs)\n", PROMPT + "return sum(xs)\n", AS_IS),  # unindented but no def: as is, fails to parse
        (BODY + "def f(xs):\n    return 0\n", PROMPT + BODY + "def f(xs):\n    return 0\n", AS_IS),  # starts indented: a continuation
        ("    return x ** 2\n", PROMPT + "    return x ** 2\n", AS_IS),  # ** in code is not markdown
        (DEF, "# Return the sum of xs.\n" + DEF, SIGNATURE),  # the def restated, no fence: preamble + def
        (DEF + "\nThis works because sum adds them.\n", "# Return the sum of xs.\n" + DEF + "\n", SIGNATURE),  # prose after it is dropped
        ("Here it is:\n" + DEF, PROMPT + "Here it is:\n" + DEF, AS_IS),  # unfenced prose before a def is not read
        ("# Sum.\n" + DEF, PROMPT + "# Sum.\n" + DEF, AS_IS),  # nor a comment first: a continuation that copies the prompt
        ("import math\n\n" + DEF + "\ndef g(y):\n    return y\n\nprint(f([1]))\n",
         "# Return the sum of xs.\nimport math\n\n" + DEF + "\ndef g(y):\n    return y\n\n", SIGNATURE),  # imports above, helpers after; a call is not kept
        ("```python\n" + DEF + "```\n", "# Return the sum of xs.\n" + DEF, FENCED),  # the typical reply: a python block with the def
        ("Sure!\n```py\n" + DEF + "```\nExample:\n```python\nprint(f([1, 2]))\n```\n",
         "# Return the sum of xs.\n" + DEF, FENCED),  # the block that defines f, not the usage example
        ("```python\nprint(f([1, 2]))\n```\n```python\n" + DEF + "```\n",
         "# Return the sum of xs.\n" + DEF, FENCED),  # ... wherever it comes
        ("```python\n" + DEF + "```\n```python\ndef f(xs):\n    return 0\n```\n",
         "# Return the sum of xs.\n" + DEF, FENCED),  # two defs: the first (later blocks are alternatives, tests)
        ("```\n" + DEF + "```\n", "# Return the sum of xs.\n" + DEF, FENCED),  # an untagged block counts
        ("```text\nf([1]) == 1\n```\n```python\n" + DEF + "```\n", "# Return the sum of xs.\n" + DEF, FENCED),  # other tags are skipped
        ("```python\n" + BODY + "```\n", PROMPT + BODY, FENCED),  # only the body, fenced: appended to the prompt
        ("1. Write it:\n   ```python\n   " + DEF.replace("\n    ", "\n       ") + "   ```\n",
         "# Return the sum of xs.\n" + DEF, FENCED),  # a block indented in a list loses the list's indent
        ("```python\n" + DEF + "```\n```python\nprint(f([1\n",
         "# Return the sum of xs.\n" + DEF, FENCED),  # a cut-off block after a good one is ignored
    ])
    def test_what_is_run(self, completion, program, how):
        assert extract_program(completion, PROMPT, "f") == Extraction(program, how)

    @pytest.mark.parametrize("completion, fragment", [
        ("```python\n" + DEF, "fence opened on line 1 is never closed"),  # cut off inside the only block
        ("Here:\n\n```python\ndef f(xs):\n", "opened on line 3"),  # the line is the fence's
        ("```bash\necho hi\n```\n", "code blocks are ```bash, expected a ```python block"),  # wrong language
        ("```python\n\n```\n", "the ```python block is empty"),  # nothing in it
        ("```python\nprint(f([1]))\n```\n", "no ```python block defines f(...) or continues its body"),  # usage only
        ("```python\ndef g(xs):\n    return 0\n```\n", "no ```python block defines f(...)"),  # renamed function
    ])
    def test_failures_say_why(self, completion, fragment):
        read = extract_program(completion, PROMPT, "f")
        assert read.failed and read.text == "" and fragment in read.error
        assert read.steps == {STEP: False} and read.feedback == f"extract: {read.error}"

    def test_a_restated_def_keeps_the_prompts_imports(self):
        # HumanEval prompts import what their signature uses: a reply that restates only the def keeps them.
        reply = "```python\ndef f(xs: List[int]) -> int:\n    return sum(xs)\n```"
        assert extract_program(reply, HUMANEVAL, "f").text == "from typing import List\n\n\n" + reply[10:-3]
        assert preamble(HUMANEVAL, "f") == "from typing import List\n\n\n"
        assert preamble("x = 1\n", "f") == "x = 1\n"  # no def in the prompt: all of it

    @pytest.mark.parametrize("completion, program, how", [
        ("for n in []:\n    pass\n", "# Goal\nimport os\nfor n in []:\n    pass\n", AS_IS),  # a raw script continuation
        ("```python\nimport os\nos.remove('a')\n```\n", "# Goal\nimport os\nimport os\nos.remove('a')\n", FENCED),  # run after the prompt
        ("```bash\nrm a\n```\n```python\nos.remove('a')\n```", "# Goal\nimport os\nos.remove('a')\n", FENCED),  # the python block
        ("def f(x):\n    pass\n", "# Goal\nimport os\ndef f(x):\n    pass\n", AS_IS),  # no entry point: no signature rule
    ])
    def test_scripts_have_no_entry_point(self, completion, program, how):
        assert extract_program(completion, "# Goal\nimport os\n") == Extraction(program, how)

    def test_steps_of_each_outcome(self):
        assert extract_program(BODY, PROMPT, "f").steps == {}  # a raw continuation's verdict gets no extract step
        assert extract_program(DEF, PROMPT, "f").steps == {STEP: SIGNATURE}
        assert extract_program("```bash\nx\n```", PROMPT, "f").steps == {STEP: False}


class TestFences:
    def test_blocks_and_an_unclosed_fence(self):
        text = "a\n```Python title\nx = 1\n```\n````\n```\n````\n```json\n{"
        blocks, unclosed = fenced_blocks(text)
        assert [(b.lang, b.code, b.line) for b in blocks] == [("python", "x = 1\n", 2), ("", "```\n", 5)]
        assert unclosed == 8

    def test_code_keeps_form_feeds_and_crlf_lines_read(self):
        blocks, _ = fenced_blocks("```python\r\nx = '\x0c'\r\n```\r\n")
        assert blocks[0].code == "x = '\x0c'\n"  # a form feed in a string is not a line break

    def test_inline_backticks_are_not_fences(self):
        assert fenced_blocks("use `f` or ``g``") == ([], None)


OBJ = '{"vendor": "Acme", "total": 1.5}'


class TestJson:
    @pytest.mark.parametrize("completion, text, how", [
        (OBJ + "\n", OBJ + "\n", AS_IS),  # the built-in's raw continuation
        ("  \n" + OBJ, "  \n" + OBJ, AS_IS),  # whitespace first: still as is
        ("", "", AS_IS),  # blank: the verifier says so
        (OBJ + "\nThe total is 1.5.", OBJ + "\nThe total is 1.5.", AS_IS),  # starts with {: strict, trailing prose stays an error
        ("garbage", "garbage", AS_IS),  # no object at all
        ("[" + OBJ + "]", "[" + OBJ + "]", AS_IS),  # an array is not prose around an object
        ("x " + OBJ, "x " + OBJ, AS_IS),  # one stray word is not prose
        ('["two words", ' + OBJ + "]", '["two words", ' + OBJ + "]", AS_IS),  # inside an array: not prose before it
        ('"vendor": "Acme"}\n' + OBJ, '"vendor": "Acme"}\n' + OBJ, AS_IS),  # a broken object first: not prose either
        ("```json\n" + OBJ + "\n```", OBJ + "\n", FENCED),  # the typical reply
        ("Here you go:\n```\n" + OBJ + "\n```\nDone.", OBJ + "\n", FENCED),  # untagged block
        ("```python\nx = 1\n```\n```json\n" + OBJ + "\n```", OBJ + "\n", FENCED),  # the json block, not the python one
        ("Here is the JSON:\n" + OBJ + "\nI read the total from line 3.", OBJ, JSON_OBJECT),  # prose around
        ("The fields are: " + OBJ + ".", OBJ, JSON_OBJECT),  # inline
        ('Fields like {name} are filled: {"a": "}"}', '{"a": "}"}', JSON_OBJECT),  # a brace in a string; {name} is not JSON
        ('Here it is: {"a": 1,}', 'Here it is: {"a": 1,}', AS_IS),  # broken: not taken, verified as written
        ("ÜjjÇ (Ł£v qiWrTa {s雷W}üd", "ÜjjÇ (Ł£v qiWrTa {s雷W}üd", AS_IS),  # noise with balanced braces: as written
        ("Here it is: {unclosed", "Here it is: {unclosed", AS_IS),  # no balanced object
        ("total (number)\nJSON:\n" + OBJ, "total (number)\nJSON:\n" + OBJ, AS_IS),  # the prompt's own text run on: not prose
        ("Other fields here\nJSON:\n" + OBJ, "Other fields here\nJSON:\n" + OBJ, AS_IS),  # ending with the prompt's last line: another prompt's
    ])
    def test_what_is_parsed(self, completion, text, how):
        assert extract_json(completion, prompt="Document:\nAcme\nFields: total (number)\nJSON:\n") == Extraction(text, how)

    @pytest.mark.parametrize("completion, fragment", [
        ("```json\n" + OBJ, "never closed"),  # cut off
        ("```python\nx = {}\n```", "code blocks are ```python, expected a ```json block"),  # wrong language
        ("Here:\n```json\n\n```", "the ```json block is empty"),  # nothing in it
    ])
    def test_failures_say_why(self, completion, fragment):
        read = extract_json(completion)
        assert read.failed and fragment in read.error and read.steps == {STEP: False}

    def test_the_scan_is_bounded(self):
        assert first_json_object("{" * 5000) is None
        assert first_json_object("{x} " * 50 + OBJ) is None  # past the starts tried
        assert first_json_object("{x} " * 5 + OBJ) == OBJ


IDS = ["R1", "R2"]
OUTCOMES = ["approve", "deny", "refer"]
CANON = "R1: yes\nR2: no\ndecision: approve\n"


class TestRuleLines:
    @pytest.mark.parametrize("completion, text, how", [
        (CANON, CANON, AS_IS),  # the built-in's raw continuation
        ("R1: yes\n*R2: no\n|decision: approve", "R1: yes\n*R2: no\n|decision: approve", AS_IS),  # stray characters are not markdown
        ("R1: **no\nR2: no", "R1: **no\nR2: no", AS_IS),  # nor is unpaired bold
        ("- R1: no\nR2: yes\ndecision: deny", "- R1: no\nR2: yes\ndecision: deny", AS_IS),  # one marked line is a slip, not markdown
        ("R1: yes\nR2: maybe\ndecision: x", "R1: yes\nR2: maybe\ndecision: x", AS_IS),  # wrong but unmarked: as is
        ("Let me check.\n" + CANON, "Let me check.\n" + CANON, AS_IS),  # plain prose without markdown: as is
        ("Decision: Approve\nR1: Yes", "Decision: Approve\nR1: Yes", AS_IS),  # capitals alone are not a mark
        ("**R1:** yes\n**R2:** no\n**Decision:** approve", CANON, MARKDOWN),  # bold keys
        ("- R1: Yes, income 52000 >= 50000\n- R2: No\n\nDecision: **Approve**.", CANON, MARKDOWN),  # bullets, explanations, case
        ("1. R1 (employed): yes\n2. R2 (score < 700): no\n\n### Decision\ndecision: approve", CANON, MARKDOWN),  # numbers, a parenthesis
        ("| Rule | Applies |\n|---|---|\n| R1 | yes |\n| R2 | no |\n\n**Decision: approve**", CANON, MARKDOWN),  # a table
        ("```\nR1: yes\nR2: no\ndecision: approve\n```", CANON, FENCED),  # a fence
        ("**R2:** no\n**R1:** yes\n**Final decision:** approve", CANON, MARKDOWN),  # out of order: the task's order
        ("**R1:** no, wait\n**R1:** yes\n**R2:** no\n**Decision:** approve", CANON, MARKDOWN),  # twice: the last
        ("**R1:** employed=yes and age <= 25 -> **No**\n**R2:** no\n**Decision:** R1 fails, so deny",
         "R1: no\nR2: no\ndecision: deny\n", MARKDOWN),  # the rule restated: its last yes/no word; the outcome named
        ("**R1:** applies\n**Decision:** approve", "R1: applies\ndecision: approve\n", MARKDOWN),  # read as written: the format check reports it
        ("**R1:** yes\n**R3:** no\n**Decision:** approve", "R1: yes\nR3: no\ndecision: approve\n", MARKDOWN),  # an id the task lacks stays
    ])
    def test_what_is_checked(self, completion, text, how):
        assert extract_rule_lines(completion, IDS, OUTCOMES) == Extraction(text, how)

    def test_custom_ids_keep_their_spelling(self):
        assert extract_rule_lines("- **age:** YES\n- decision: ok", ["age"], ["ok"]).text == "age: yes\ndecision: ok\n"

    @pytest.mark.parametrize("completion", [
        "```\nsome text\n```",  # a fence with no rule line
        "- **R1** and R2 both apply\n- **R3** does too",  # marked, but no key is followed by its answer
    ])
    def test_failures_say_why(self, completion):
        read = extract_rule_lines(completion, IDS, OUTCOMES)
        assert read.how == FAILED and "no 'R1: yes|no' or 'decision: ...' line" in read.error
