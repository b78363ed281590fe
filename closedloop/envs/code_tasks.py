"""The task families of the code environment: specs, prompts, reference bodies and test inputs.

A spec is a small tuple of JSON data (``("cond", "label", ["gt", 7], ["big", "small"])``); everything
else (comment line, signature, reference body, inputs) is rendered from it. Each family keeps one
idiomatic style, since the policy learns the style from ~100 references.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

# ---------------------------------------------------------------------------------------------
# Shared pieces of the two list families: a filter and a map over ``x for x in xs``

# name -> (constant range or None, phrase of the selected numbers, condition)
FILTERS: dict[str, tuple[range | None, str, str]] = {
    "all": (None, "the numbers in xs", ""),
    "even": (None, "the even numbers in xs", "x % 2 == 0"),
    "odd": (None, "the odd numbers in xs", "x % 2 == 1"),
    "pos": (None, "the positive numbers in xs", "x > 0"),
    "neg": (None, "the negative numbers in xs", "x < 0"),
    "gt": (range(1, 10), "the numbers in xs greater than {k}", "x > {k}"),
    "lt": (range(1, 10), "the numbers in xs less than {k}", "x < {k}"),
    "div": (range(3, 6), "the numbers in xs divisible by {k}", "x % {k} == 0"),
}
# name -> (constant range or None, phrase wrapping the filter phrase F, expression)
MAPS: dict[str, tuple[range | None, str, str]] = {
    "id": (None, "{F}", "x"),
    "square": (None, "the squares of {F}", "x * x"),
    "times": (range(2, 6), "{F}, each times {k}", "x * {k}"),
    "plus": (range(1, 10), "{F}, each plus {k}", "x + {k}"),
    "abs": (None, "the absolute values of {F}", "abs(x)"),
}


def _pick(table: dict[str, tuple[range | None, str, str]], rng: random.Random) -> list:
    name = rng.choice(sorted(table))
    constants = table[name][0]
    return [name, rng.choice(constants)] if constants else [name]


def _fill(table: dict[str, tuple[range | None, str, str]], part: list, column: int, **extra: str) -> str:
    k = part[1] if len(part) > 1 else ""
    return table[part[0]][column].format(k=k, **extra)


def _generator(m: list, f: list) -> tuple[str, str, str]:
    """(phrase, element expression, ' if cond' clause) of ``m(x) for x in xs if f(x)``."""
    phrase = _fill(MAPS, m, 1, F=_fill(FILTERS, f, 1))
    cond = _fill(FILTERS, f, 2)
    return phrase, _fill(MAPS, m, 2), f" if {cond}" if cond else ""


def _list_inputs(spec: tuple, rng: random.Random, count: int) -> list[list]:
    # Lists around the filter's constant come first, so an off-by-one constant fails a test even
    # under max/min: [K+1, K, K-1] (descending, so order matters too) and [K]. Then the empty list
    # (defaults of max/min), then random lists with negatives and zeros.
    f = spec[3]  # ("reduce" | "transform", aggregate | order, map, filter)
    k = f[1] if len(f) > 1 else (0 if f[0] in ("pos", "neg") else rng.randint(-3, 6))
    cases = [[[k + 1, k, k - 1]], [[k]], [[]]]
    while len(cases) < count:
        cases.append([[rng.randint(-12, 12) for _ in range(rng.randint(2, 8))]])
    return cases[:count]


# ---------------------------------------------------------------------------------------------
# Families: sample a spec, render it, draw its test inputs

AGGREGATES = {
    "sum": ("Return the sum of {M}.", "sum({e} for x in xs{c})", "sum(xs)"),
    "max": ("Return the largest of {M}, or 0 if there are none.", "max(({e} for x in xs{c}), default=0)", "max(xs, default=0)"),
    "min": ("Return the smallest of {M}, or 0 if there are none.", "min(({e} for x in xs{c}), default=0)", "min(xs, default=0)"),
    "count": ("Return the count of {F}.", "sum(1 for x in xs{c})", "len(xs)"),
}
ORDERS = {
    "keep": ("", "[{e} for x in xs{c}]", None),
    "asc": (", sorted in ascending order", "sorted({e} for x in xs{c})", "sorted(xs)"),
    "desc": (", sorted in descending order", "sorted(({e} for x in xs{c}), reverse=True)", "sorted(xs, reverse=True)"),
    "rev": (", in reverse order", "[{e} for x in xs{c}][::-1]", "xs[::-1]"),
}


def _reduce_sample(rng: random.Random) -> tuple:
    aggregate = rng.choice(sorted(AGGREGATES))
    m = ["id"] if aggregate == "count" else _pick(MAPS, rng)
    return ("reduce", aggregate, m, _pick(FILTERS, rng))


def _reduce_render(spec: tuple) -> tuple[str, str]:
    _, aggregate, m, f = spec
    template, code, plain = AGGREGATES[aggregate]
    phrase, element, cond = _generator(m, f)
    comment = template.format(M=phrase, F=_fill(FILTERS, f, 1))
    body = plain if (m == ["id"] and not cond) else code.format(e=element, c=cond)
    return comment, body


def _transform_sample(rng: random.Random) -> tuple:
    while True:
        spec = ("transform", rng.choice(sorted(ORDERS)), _pick(MAPS, rng), _pick(FILTERS, rng))
        if spec[1:] != ("keep", ["id"], ["all"]):  # the identity is not a task
            return spec


def _transform_render(spec: tuple) -> tuple[str, str]:
    _, order, m, f = spec
    suffix, code, plain = ORDERS[order]
    phrase, element, cond = _generator(m, f)
    body = plain if (m == ["id"] and not cond and plain) else code.format(e=element, c=cond)
    return f"Return a list of {phrase}{suffix}.", body


# name -> (phrase, code, range of K, range of M); M is None for one-constant formulas
FORMULAS: dict[str, tuple[str, str, range, range | None]] = {
    "lin": ("a times {k} plus b times {m}", "a * {k} + b * {m}", range(2, 10), range(2, 10)),
    "linm": ("a times {k} minus b times {m}", "a * {k} - b * {m}", range(2, 10), range(2, 10)),
    "sum": ("the sum of a and b, times {k}, plus {m}", "(a + b) * {k} + {m}", range(2, 10), range(1, 10)),
    "diff": ("the difference of a and b, times {k}, plus {m}", "(a - b) * {k} + {m}", range(2, 10), range(1, 10)),
    "max": ("the larger of a and b, times {k}, plus {m}", "max(a, b) * {k} + {m}", range(2, 10), range(1, 10)),
    "min": ("the smaller of a and b, times {k}, plus {m}", "min(a, b) * {k} + {m}", range(2, 10), range(1, 10)),
    "absd": ("the absolute difference of a and b, times {k}, plus {m}", "abs(a - b) * {k} + {m}", range(2, 10), range(1, 10)),
    "prodp": ("the product of a and b, plus {k}", "a * b + {k}", range(1, 10), None),
    "prodm": ("the product of a and b, minus {k}", "a * b - {k}", range(1, 10), None),
    "summod": ("the sum of a and b modulo {k}", "(a + b) % {k}", range(2, 10), None),
    "prodmod": ("the product of a and b modulo {k}", "(a * b) % {k}", range(2, 10), None),
    "sq": ("a squared plus b times {k}", "a * a + b * {k}", range(2, 10), None),
    "sqm": ("a squared minus b times {k}", "a * a - b * {k}", range(2, 10), None),
    "div": ("the sum of a and b divided by {k}", "(a + b) / {k}", range(2, 10), None),
    "floordiv": ("a floor-divided by {k}, plus b", "a // {k} + b", range(2, 10), None),
}


def _arith_sample(rng: random.Random) -> tuple:
    name = rng.choice(sorted(FORMULAS))
    _, _, ks, ms = FORMULAS[name]
    return ("arith", name, [rng.choice(ks)] + ([rng.choice(ms)] if ms else []))


def _arith_render(spec: tuple) -> tuple[str, str]:
    _, name, constants = spec
    phrase, code, _, _ = FORMULAS[name]
    values = dict(zip("km", constants))
    return f"Return {phrase.format(**values)}.", code.format(**values)


def _arith_inputs(spec: tuple, rng: random.Random, count: int) -> list[list]:
    cases = [[0, rng.randint(1, 15)], [-rng.randint(1, 15), rng.randint(-15, 15)]]
    while len(cases) < count:
        cases.append([rng.randint(-20, 20), rng.randint(-20, 20)])
    return cases[:count]


CHARS = "abeox"  # the letters string tasks name; inputs mix them with others and capitals
# name -> (phrase, code suffix applied to the expression so far, constant ranges)
STRING_OPS: dict[str, tuple[str, str, tuple]] = {
    "upper": ("in upper case", ".upper()", ()),
    "lower": ("in lower case", ".lower()", ()),
    "capitalize": ("capitalized", ".capitalize()", ()),
    "reverse": ("reversed", "[::-1]", ()),
    "replace": ('with every "{0}" replaced by "{1}"', '.replace("{0}", "{1}")', (CHARS, CHARS)),
    "remove": ('with every "{0}" removed', '.replace("{0}", "")', (CHARS,)),
    "first": ("cut to its first {0} characters", "[:{0}]", (range(1, 6),)),
    "last": ("cut to its last {0} characters", "[-{0}:]", (range(1, 6),)),
    "repeat": ("repeated {0} times", " * {0}", (range(2, 4),)),
}
_CASE_OPS = {"upper", "lower", "capitalize"}


def _string_op(rng: random.Random, names: list[str]) -> list:
    name = rng.choice(names)
    while True:
        args = [rng.choice(list(choices)) for choices in STRING_OPS[name][2]]
        if name != "replace" or args[0] != args[1]:
            return [name, *args]


def _string_sample(rng: random.Random) -> tuple:
    roll = rng.random()
    if roll < 0.2:  # counting: plain, ignoring case, or the length after a removal
        return ("string", rng.choice(["count", "count_nocase", "len_removed"]), [rng.choice(CHARS)])
    first = _string_op(rng, sorted(set(STRING_OPS) - {"repeat"}))  # `s * 2` would need parentheses
    if roll < 0.55:
        return ("string", "ops", [_string_op(rng, sorted(STRING_OPS))])
    while True:
        second = _string_op(rng, sorted(STRING_OPS))
        if not _redundant(first, second):
            return ("string", "ops", [first, second])


def _redundant(first: list, second: list) -> bool:
    """Pairs whose second step does nothing or undoes the first (their task would teach noise)."""
    a, b = first[0], second[0]
    if a == b or {a, b} <= _CASE_OPS:
        return True
    if a == "upper" and b in ("replace", "remove"):
        return True  # the letters named are lower case: nothing left to replace
    if a in ("replace", "remove") and b in ("replace", "remove") and second[1] == first[1]:
        return True  # the letter is already gone
    return (a, b) in (("first", "last"), ("last", "first")) and second[1] >= first[1]


def _string_render(spec: tuple) -> tuple[str, str]:
    _, variant, detail = spec
    if variant == "count":
        return f'Return how many times "{detail[0]}" occurs in s.', f's.count("{detail[0]}")'
    if variant == "count_nocase":
        return f'Return how many times "{detail[0]}" occurs in s, ignoring case.', f's.lower().count("{detail[0]}")'
    if variant == "len_removed":
        return f'Return the length of s with every "{detail[0]}" removed.', f'len(s.replace("{detail[0]}", ""))'
    phrases, code = [], "s"
    for name, *args in detail:
        phrase, suffix, _ = STRING_OPS[name]
        phrases.append(phrase.format(*args))
        code += suffix.format(*args)
    return f"Return s {', then '.join(phrases)}.", code


def _string_inputs(spec: tuple, rng: random.Random, count: int) -> list[list]:
    # The letters the task names, so replacements and counts have something to act on.
    if spec[1] == "ops":
        named = "".join(a for _, *args in spec[2] for a in args if isinstance(a, str))
    else:
        named = spec[2][0]
    alphabet = (named or "a") + CHARS + CHARS.upper() + "xyz "
    rich = "".join(rng.choice(alphabet) for _ in range(9))
    cases = [[rich + (named or "a").upper()], [""]]
    while len(cases) < count:
        cases.append(["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))])
    return cases[:count]


LABELS = [("big", "small"), ("yes", "no"), ("high", "low"), ("hot", "cold"), ("on", "off"), ("up", "down")]
TRIPLES = [("low", "mid", "high"), ("cold", "warm", "hot"), ("small", "medium", "large")]
# name -> (constant range or None, phrase, condition), as FILTERS
CONDITIONS: dict[str, tuple[range | None, str, str]] = {
    "gt": (range(-3, 13), "n is greater than {k}", "n > {k}"),
    "lt": (range(-3, 13), "n is less than {k}", "n < {k}"),
    "div": (range(3, 10), "n is divisible by {k}", "n % {k} == 0"),
    "even": (None, "n is even", "n % 2 == 0"),
    "odd": (None, "n is odd", "n % 2 == 1"),
}
# name -> (constant range or None, phrase, expression), as MAPS
VALUES: dict[str, tuple[range | None, str, str]] = {
    "times": (range(2, 6), "n times {k}", "n * {k}"),
    "plus": (range(1, 10), "n plus {k}", "n + {k}"),
    "minus": (range(1, 10), "n minus {k}", "n - {k}"),
    "square": (None, "n squared", "n * n"),
    "neg": (None, "minus n", "-n"),
    "zero": (None, "0", "0"),
}


def _cond_sample(rng: random.Random) -> tuple:
    roll = rng.random()
    if roll < 0.2:
        low = rng.randint(-3, 8)
        return ("cond", "three", [low, low + rng.randint(2, 8)], list(rng.choice(TRIPLES)))
    condition = _pick(CONDITIONS, rng)
    if roll < 0.6:
        return ("cond", "label", condition, list(rng.sample(rng.choice(LABELS), 2)))
    while True:
        values = [_pick(VALUES, rng), _pick(VALUES, rng)]
        if values[0] != values[1]:
            return ("cond", "value", condition, values)


def _cond_render(spec: tuple) -> tuple[str, str]:
    _, variant, condition, outcome = spec
    if variant == "three":
        (k, m), (a, b, c) = condition, outcome
        comment = f'Return "{a}" if n is less than {k}, "{b}" if n is less than {m}, otherwise "{c}".'
        return comment, f'"{a}" if n < {k} else "{b}" if n < {m} else "{c}"'
    phrase, test = _fill(CONDITIONS, condition, 1), _fill(CONDITIONS, condition, 2)
    if variant == "label":
        a, b = outcome
        return f'Return "{a}" if {phrase}, otherwise "{b}".', f'"{a}" if {test} else "{b}"'
    (pa, ea), (pb, eb) = ((_fill(VALUES, v, 1), _fill(VALUES, v, 2)) for v in outcome)
    return f"Return {pa} if {phrase}, otherwise {pb}.", f"{ea} if {test} else {eb}"


def _cond_inputs(spec: tuple, rng: random.Random, count: int) -> list[list]:
    if spec[1] == "three":
        edges = [spec[2][0] - 1, spec[2][0], spec[2][1] - 1, spec[2][1]]
    else:
        k = spec[2][1] if len(spec[2]) > 1 else 2
        edges = [k, k + 1, k - 1, -rng.randint(1, 20)]
    cases = [[n] for n in edges] + [[0]]
    while len(cases) < count:
        cases.append([rng.randint(-20, 20)])
    return cases[:count]


@dataclass(frozen=True)
class Family:
    kind: str
    params: str  # the signature's parameter list
    sample: Callable[[random.Random], tuple]
    render: Callable[[tuple], tuple[str, str]]  # -> (comment sentence, returned expression)
    inputs: Callable[[tuple, random.Random, int], list[list]]


FAMILIES: dict[str, Family] = {
    family.kind: family
    for family in (
        Family("reduce", "xs", _reduce_sample, _reduce_render, _list_inputs),
        Family("transform", "xs", _transform_sample, _transform_render, _list_inputs),
        Family("arith", "a, b", _arith_sample, _arith_render, _arith_inputs),
        Family("string", "s", _string_sample, _string_render, _string_inputs),
        Family("cond", "n", _cond_sample, _cond_render, _cond_inputs),
    )
}


def probe_inputs(params: str) -> list[list[Any]]:
    """A fixed, rich set of inputs per signature; equal outputs on it mean "the same function"."""
    rng = random.Random(f"code/probes/{params}")
    if params == "xs":
        lists = [[], [0], [-1], [1], [2], list(range(-12, 13)), list(range(12, -13, -1))]
        lists += [[rng.randint(-15, 15) for _ in range(rng.randint(1, 10))] for _ in range(25)]
        return [[xs] for xs in lists]
    if params == "a, b":
        grid = [-20, -13, -7, -5, -2, -1, 0, 1, 2, 3, 5, 8, 13, 17, 21]
        return [[a, b] for a in grid for b in grid]
    if params == "s":
        words = ["", "a", "A", "abeox", "ABEOX", "Hello World", "xyz aBe OOx", "bob", "eExX oO"]
        alphabet = CHARS + CHARS.upper() + "xyz "
        words += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(20)]
        return [[w] for w in words]
    if params == "n":
        return [[n] for n in range(-25, 26)]
    raise ValueError(f"no probe inputs for signature ({params})")


# ---------------------------------------------------------------------------------------------
# Benchmark slices: which specs are failure modes, and the edge-case inputs of each signature

def is_heldout(spec: tuple) -> bool:
    """Compositions the train split never emits, for the benchmark's ``heldout`` slice: the squares of
    a list sorted ascending, and their sum. Train has every part (squares under other orders and
    aggregates, ascending sorts and sums of other maps), never these wholes: a policy that learned the
    parts, not the prompts, solves them."""
    return spec[0] in ("transform", "reduce") and spec[1] in ("asc", "sum") and spec[2] == ["square"]


def is_failure_mode(spec: tuple) -> bool:
    """Specs of the shapes small models typically get wrong: chained string operations (the second
    step is dropped or applied first), three-way conditions (a boundary is off by one), descending or
    reversed orders (the direction is ignored), and max/min over a filter (the empty default is lost)."""
    kind = spec[0]
    if kind == "string":
        return spec[1] == "ops" and len(spec[2]) == 2
    if kind == "cond":
        return spec[1] == "three"
    if kind == "transform":
        return spec[1] in ("desc", "rev")
    if kind == "reduce":
        return spec[1] in ("max", "min") and spec[3] != ["all"]
    return kind == "arith" and spec[1] in ("floordiv", "summod", "prodmod", "absd")


def edge_inputs(spec: tuple, rng: random.Random, count: int) -> list[list]:
    """Edge cases first (empty inputs, ties, unicode, zero and boundary numbers), then ordinary ones."""
    params = FAMILIES[spec[0]].params
    if params == "xs":
        cases = [[[]], [[0]], [[5, 5, 5]], [[-7, -7, 0, 7, 7]], [[10**6, -10**6]]]
    elif params == "a, b":
        cases = [[0, 0], [-1, -1], [10**6, -10**6], [7, 7], [-9, 0]]
    elif params == "s":
        cases = [[""], [" "], ["ÉéÜü ß"], ["aAa AaA"], ["ooooo"]]
    else:  # n: the boundaries of the condition, zero and large magnitudes
        cases = [[0], [-10**6], [10**6]] + _cond_inputs(spec, rng, 2)
    ordinary = FAMILIES[spec[0]].inputs(spec, rng, count)
    return (cases + ordinary)[: max(count, len(cases))]
