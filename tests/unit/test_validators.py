"""The reusable rule validators: each rule type, scores, and the first-violation messages."""

from __future__ import annotations


import pytest

from closedloop.config import ExtractEnvParams
from closedloop.envs import validators
from closedloop.envs.base import source_of
from closedloop.envs.extract import ExtractEnv
from closedloop.envs.validators import CHECK_SCHEMA_HELPERS, check_schema, field_scores, match_format, parse_json
from closedloop.rewards.combine import source_version

INVOICE = {
    "type": "object",
    "properties": {
        "vendor": {"type": "string"},
        "total": {"type": "number", "minimum": 0, "maximum": 1000},
        "due": {"type": "string", "format": "date"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
        "po": {"type": ["string", "null"]},
    },
    "required": ["vendor", "total", "due", "currency", "po"],
    "additionalProperties": False,
}
GOOD = {"vendor": "Acme", "total": 12.5, "due": "2024-02-29", "currency": "EUR", "po": None}


class TestParseJson:
    @pytest.mark.parametrize("text, expected", [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": [1, {"b": null}]}\n\n', {"a": [1, {"b": None}]}),  # surrounding whitespace is fine
        ('{"name": "Zo\\u00eb", "city": "Łódź"}', {"name": "Zoë", "city": "Łódź"}),  # escapes and raw unicode
        ("{}", {}),
    ])
    def test_accepts_exactly_one_object(self, text, expected):
        assert parse_json(text) == (expected, "")

    @pytest.mark.parametrize("text, fragment", [
        ("", "empty output"),
        ("   \n", "empty output"),
        ("garbage", "not JSON"),
        ('{"a": 1', "not JSON"),  # truncated
        ('{"a": 1} trailing', "trailing text"),
        ('{"a": 1}\n{"b": 2}', "trailing text"),  # a second object
        ('```json\n{"a": 1}\n```', "not JSON"),  # a code fence
        ("[1, 2]", "got array"),
        ('"text"', "got string"),
        ("3", "got number"),
        ("null", "got null"),
        ('{"a": 1, "a": 2}', "duplicate key 'a'"),
        ('{"a": NaN}', "NaN"),
        ('{"a": -Infinity}', "Infinity"),
        ("[" * 100000 + "]" * 100000, "not JSON"),  # nesting deep enough to hit the recursion limit
    ])
    def test_rejects_everything_else_with_a_reason(self, text, fragment):
        value, error = parse_json(text)
        assert value is None and fragment in error

    def test_non_text_is_an_error_not_an_exception(self):
        assert parse_json(None) == (None, "expected text, got NoneType")


class TestCheckSchema:
    def test_a_conforming_value_scores_one(self):
        result = check_schema(GOOD, INVOICE)
        assert result.score == 1.0 and result.message == "" and result.satisfied == result.total

    def test_check_count_depends_only_on_the_schema(self):
        # 5 presence + 5 types + minimum + maximum + format + enum + additionalProperties
        assert check_schema(GOOD, INVOICE).total == check_schema({}, INVOICE).total == 15
        assert check_schema([1], INVOICE).total == 15

    @pytest.mark.parametrize("change, message", [
        ({"total": 1200.5}, "field 'total': 1200.5 above maximum 1000"),
        ({"total": -0.01}, "field 'total': -0.01 below minimum 0"),
        ({"total": "12.50"}, "field 'total': expected number, got string \"12.50\""),  # numbers, not strings
        ({"total": True}, "field 'total': expected number, got boolean true"),  # a bool is no number
        ({"vendor": 7}, "field 'vendor': expected string, got integer 7"),
        ({"currency": "eur"}, "field 'currency': \"eur\" not one of EUR|USD|GBP"),  # enumerations are case-exact
        ({"due": "2023-02-29"}, "field 'due': \"2023-02-29\" is not a date YYYY-MM-DD"),  # not a leap year
        ({"due": "2024-3-5"}, "field 'due': \"2024-3-5\" is not a date YYYY-MM-DD"),
        ({"due": "5 March 2024"}, "field 'due': \"5 March 2024\" is not a date YYYY-MM-DD"),
        ({"po": 12}, "field 'po': expected string or null, got integer 12"),
        ({"extra": 1}, "unexpected field 'extra'"),
    ])
    def test_each_rule_names_its_violation(self, change, message):
        result = check_schema({**GOOD, **change}, INVOICE)
        assert result.message == message
        assert 0.0 < result.score < 1.0

    @pytest.mark.parametrize("total", [0, 1000, 0.0, 1000.0])  # both bounds are inclusive
    def test_bounds_are_inclusive(self, total):
        assert check_schema({**GOOD, "total": total}, INVOICE).score == 1.0

    def test_missing_required_field_fails_all_its_checks(self):
        value = {k: v for k, v in GOOD.items() if k != "total"}
        result = check_schema(value, INVOICE)
        assert result.message == "field 'total': missing (required)"
        assert result.total - result.satisfied == 4  # presence, type, minimum, maximum

    def test_first_violation_follows_the_schema_order(self):
        result = check_schema({**GOOD, "currency": "eur", "vendor": None}, INVOICE)
        assert result.message.startswith("field 'vendor'")

    def test_null_is_fine_where_allowed_and_optional_fields_may_be_absent(self):
        schema = {"type": "object", "properties": {"a": {"type": ["number", "null"], "minimum": 5}, "b": {"type": "string"}}}
        assert check_schema({"a": None}, schema).score == 1.0
        assert check_schema({}, schema).score == 1.0
        assert check_schema({"a": 4}, schema).message == "field 'a': 4 below minimum 5"

    @pytest.mark.parametrize("kind, good, bad", [
        ("integer", 3, 3.5),
        ("integer", 3.0, "3"),  # 3.0 is an integer, as in JSON Schema
        ("boolean", False, 0),
        ("array", [], {}),
        ("string", "", None),
    ])
    def test_types(self, kind, good, bad):
        schema = {"type": "object", "properties": {"x": {"type": kind}}, "required": ["x"]}
        assert check_schema({"x": good}, schema).score == 1.0
        assert check_schema({"x": bad}, schema).message.startswith(f"field 'x': expected {kind}")

    def test_array_items(self):
        schema = {"type": "object", "properties": {"parties": {"type": "array", "items": {"type": "string"}}}}
        assert check_schema({"parties": ["A", "B"]}, schema).score == 1.0
        assert check_schema({"parties": ["A", 2]}, schema).message == "field 'parties': item 1 is not string"

    def test_not_an_object(self):
        result = check_schema(["a"], INVOICE)
        assert result.score == 0.0 and result.message == "expected a JSON object, got array"

    @pytest.mark.parametrize("schema", [
        {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}},  # unsupported keyword
        {"type": "object", "properties": {"x": {"type": "text"}}},  # unknown type
        {"type": "object", "properties": {"x": {"type": "string", "format": "email"}}},
        {"type": "object", "properties": {}, "required": ["x"]},
        {"type": "array"},
    ])
    def test_a_schema_outside_the_subset_is_an_error(self, schema):
        with pytest.raises(ValueError, match="check_schema"):
            check_schema({"x": "a"}, schema)


class TestFieldScores:
    TRUTH = {"vendor": "Acme Corp", "total": 1224.5, "currency": "EUR", "po": None}

    def test_exact_match(self):
        assert field_scores(dict(self.TRUTH), self.TRUTH) == (1.0, 1.0, 1.0, "")

    @pytest.mark.parametrize("predicted", [
        {"vendor": "  Acme   Corp ", "total": 1224.50, "currency": "EUR", "po": None},  # whitespace
        {"vendor": "Acme Corp", "total": 1224.5 + 1e-9, "currency": "EUR"},  # float noise; absent == null
    ])
    def test_equal_under_the_documented_rules(self, predicted):
        assert field_scores(predicted, self.TRUTH).f1 == 1.0

    def test_unicode_normalisation(self):
        assert field_scores({"name": "Zoe\u0308"}, {"name": "Zo\u00eb"}).f1 == 1.0  # decomposed vs composed ë

    @pytest.mark.parametrize("change, precision, recall, message", [
        ({"total": 1224.0}, 2 / 3, 2 / 3, "field 'total' is 1224.0, expected 1224.5"),  # wrong value
        ({"vendor": "acme corp"}, 2 / 3, 2 / 3, "field 'vendor' is \"acme corp\", expected \"Acme Corp\""),  # case
        ({"total": "1224.5"}, 2 / 3, 2 / 3, "field 'total' is \"1224.5\", expected 1224.5"),  # a string is no number
        ({"total": None}, 1.0, 2 / 3, "field 'total' is null, expected 1224.5"),  # nothing given: recall only
        ({"po": "PO-1"}, 3 / 4, 1.0, "field 'po' is \"PO-1\", expected null"),  # invented: precision only
        ({"note": "x"}, 3 / 4, 1.0, "unexpected field 'note': \"x\""),
    ])
    def test_mistakes_and_their_messages(self, change, precision, recall, message):
        result = field_scores({**self.TRUTH, **change}, self.TRUTH)
        assert result.precision == pytest.approx(precision) and result.recall == pytest.approx(recall)
        assert result.f1 == pytest.approx(2 * precision * recall / (precision + recall))
        assert result.message == message and result.score == result.f1

    def test_dropped_field(self):
        result = field_scores({"vendor": "Acme Corp", "currency": "EUR"}, self.TRUTH)
        assert (result.precision, result.recall) == (1.0, pytest.approx(2 / 3))
        assert result.message == "field 'total' is missing, expected 1224.5"

    def test_empty_prediction_and_empty_truth(self):
        assert field_scores({}, self.TRUTH)[:3] == (1.0, 0.0, 0.0)  # says nothing wrong, finds nothing
        assert field_scores({}, {"po": None})[:3] == (1.0, 1.0, 1.0)
        assert field_scores("not a dict", self.TRUTH).f1 == 0.0

    @pytest.mark.parametrize("a, b, same", [
        (True, 1, False), (1, True, False), (True, True, True),
        ([1, "a"], [1.0, " a"], True), ([1, 2], [2, 1], False),  # lists keep their order
        ({"x": 1}, {"x": 1.0}, True), ({"x": 1}, {"y": 1}, False),
        (10 ** 400, 1.0, False),  # too large for a float: no exception
    ])
    def test_value_rules(self, a, b, same):
        assert (field_scores({"f": a}, {"f": b}).f1 == 1.0) is same

    def test_tolerance_is_absolute(self):
        assert field_scores({"x": 10.004}, {"x": 10.0}, numeric_tolerance=0.005).f1 == 1.0
        assert field_scores({"x": 10.006}, {"x": 10.0}, numeric_tolerance=0.005).f1 == 0.0


class TestMatchFormat:
    PATTERNS = [r"R1: (yes|no)", r"R2: (yes|no)", r"decision: (\S+)"]

    def test_all_lines_match(self):
        result = match_format("R1: yes\nR2: no\ndecision: approve\n", self.PATTERNS)
        assert result == (1.0, "", (("yes",), ("no",), ("approve",)))

    def test_surrounding_whitespace_and_crlf_are_ignored(self):
        assert match_format("\n R1: yes  \r\nR2: no\r\ndecision: deny\n\n", self.PATTERNS).score == 1.0

    @pytest.mark.parametrize("text, score, message", [
        ("R1: yes\nR2: maybe\ndecision: deny", 2 / 3, "line 2: 'R2: maybe' does not match R2: (yes|no)"),
        ("R1: yes\nR2: no", 2 / 3, r"missing line 3 (expected decision: (\S+))"),
        ("R1: yes\nR2: no\ndecision: deny\nthanks", 3 / 4, "extra line 4: 'thanks'"),
        ("R1: yes\n\nR2: no\ndecision: deny", 1 / 4, "line 2: '' does not match R2: (yes|no)"),  # no blank lines between
        ("", 0.0, "missing line 1 (expected R1: (yes|no))"),
        ("R1: Yes\nR2: no\ndecision: deny", 2 / 3, "line 1: 'R1: Yes' does not match R1: (yes|no)"),  # case-exact
    ])
    def test_problems(self, text, score, message):
        result = match_format(text, self.PATTERNS)
        assert result.score == pytest.approx(score) and result.message == message

    def test_groups_are_none_where_a_line_does_not_match(self):
        assert match_format("R1: yes\nwhat", self.PATTERNS).groups == (("yes",), None, None)


FORMATTERS = {"_show", "_json_type", "_SHOW_CHARS"}  # they only write messages


def module_helpers(validator) -> set[str]:
    """The module-level private names a validator reaches, through the helpers it calls (formatters aside)."""
    reached: set[str] = set()
    todo = [validator]
    while todo:
        obj = todo.pop()
        functions = [f for f in vars(obj).values() if callable(f)] if isinstance(obj, type) else [obj]
        codes = [f.__code__ for f in functions if hasattr(f, "__code__")]
        while codes:
            code = codes.pop()
            codes += [c for c in code.co_consts if hasattr(c, "co_names")]  # nested functions
            for name in code.co_names:
                if name.startswith("_") and not name.startswith("__") and name not in FORMATTERS | reached:
                    reached.add(name)
                    todo += [getattr(validators, name)] if callable(getattr(validators, name, None)) else []
    return reached


@pytest.mark.parametrize("validator", [parse_json, check_schema, field_scores, match_format])
def test_each_validator_is_its_own_versioned_source(validator):
    """component_sources hashes the function's source: its scoring helpers live inside it, or (check_schema)
    are listed in CHECK_SCHEMA_HELPERS, whose sources the extract env adds to the component's config."""
    listed = {helper.__name__ for helper in CHECK_SCHEMA_HELPERS} if validator is check_schema else set()
    unversioned = module_helpers(validator) - listed
    assert not unversioned, f"{validator.__name__} calls module helpers {unversioned}: they would not be versioned"
    assert source_version(validator, {}) != source_version(validator, {"numeric_tolerance": 1})


def test_check_schema_helpers_version_the_schema_component():
    code, config = ExtractEnv(ExtractEnvParams()).component_sources()["schema"]
    assert code is check_schema
    assert config["helpers"] == [source_of(helper) for helper in CHECK_SCHEMA_HELPERS]
