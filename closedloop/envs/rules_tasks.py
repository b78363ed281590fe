"""The task families of the rules environment: domains, rule specs, and how a spec reads in a prompt.

A spec is plain JSON data, the only thing the verifier's rule engine (rules.RuleEngine) reads::

    {"domain": "loan",
     "case": {"income": 52000, "debts": 1, "score": None, "employed": True},   # None: missing ("?")
     "rules": [{"id": "R1", "if": COND, "then": "approve"},
               {"id": "R2", "if": COND, "then": "deny", "missing": True}],   # what a missing value means
     "order": ["R1", "R2"],    # priority: the first rule in this order that applies decides
     "default": "refer"}       # the decision when no rule applies

    COND = {"attr": "income", "op": ">=", "value": 50000}   # op: >= > <= < = in is
         | {"not": COND} | {"all": [COND, ...]} | {"any": [COND, ...]}

Families sample specs; those whose point depends on what the rules conclude (ties, priority,
default) also have an ``accept(spec, conclusions)`` filter that the environment applies with the
engine's conclusions, so this module needs no evaluator of its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

Spec = dict[str, Any]
Cond = dict[str, Any]


@dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "number", "category" or "flag"
    low: int = 0
    high: int = 0
    step: int = 1
    thresholds: tuple[int, ...] = ()
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Domain:
    title: str
    attributes: tuple[Attribute, ...]
    outcomes: tuple[str, ...]


def _number(name: str, low: int, high: int, thresholds: tuple[int, ...], step: int = 1) -> Attribute:
    return Attribute(name, "number", low, high, step, thresholds)


def _category(name: str, *values: str) -> Attribute:
    return Attribute(name, "category", values=values)


def _flag(name: str) -> Attribute:
    return Attribute(name, "flag")


DOMAINS: dict[str, Domain] = {
    "loan": Domain("Loan", (
        _number("income", 10000, 150000, (30000, 40000, 50000, 60000, 80000), step=1000),
        _number("debts", 0, 8, (1, 2, 3, 4)),
        _number("age", 18, 75, (21, 25, 30, 60, 65)),
        _number("score", 300, 850, (550, 600, 650, 700, 750), step=10),
        _flag("employed"),
    ), ("approve", "deny", "refer")),
    "shipping": Domain("Shipping", (
        _number("weight", 1, 40, (2, 5, 10, 20, 30)),
        _number("distance", 10, 3000, (50, 100, 500, 1000, 2000), step=10),
        _category("zone", "domestic", "eu", "world"),
        _flag("member"),
        _flag("express"),
    ), ("free", "standard", "expedited", "freight")),
    "access": Domain("Access", (
        _category("role", "admin", "editor", "viewer", "guest"),
        _category("resource", "wiki", "reports", "payroll", "servers"),
        _number("hour", 0, 23, (6, 8, 9, 17, 18, 20, 22)),
        _flag("mfa"),
        _flag("on_call"),
    ), ("allow", "deny", "review")),
    "routing": Domain("Ticket routing", (
        _category("priority", "low", "medium", "high", "urgent"),
        _category("category", "billing", "bug", "account", "outage"),
        _category("tier", "free", "pro", "enterprise"),
        _number("age_h", 0, 200, (4, 8, 24, 48, 72)),
        _flag("vip"),
    ), ("billing", "tier2", "oncall", "support")),
}
CITY = _category("city", "Zürich", "Malmö", "Kraków", "São Paulo", "Reykjavík", "Łódź", "Göteborg", "Düsseldorf",
                 "İzmir", "Čačak", "Ñuñoa", "Århus")
INCLUSIVE, EXCLUSIVE = (">=", "<="), (">", "<")


# -- sampling ----------------------------------------------------------------------------------

def _value(attribute: Attribute, rng: random.Random) -> Any:
    if attribute.kind == "flag":
        return rng.random() < 0.5
    if attribute.kind == "category":
        return rng.choice(attribute.values)
    if rng.random() < 0.4:  # near a threshold, where rules are easy to misread
        value = rng.choice(attribute.thresholds) + rng.randint(-2, 2) * attribute.step
        return min(max(value, attribute.low), attribute.high)
    return rng.randrange(attribute.low, attribute.high + 1, attribute.step)


def _atom(attribute: Attribute, rng: random.Random) -> Cond:
    if attribute.kind == "number":
        return {"attr": attribute.name, "op": rng.choice(INCLUSIVE + EXCLUSIVE), "value": rng.choice(attribute.thresholds)}
    if attribute.kind == "flag":
        return {"attr": attribute.name, "op": "is", "value": True}
    if rng.random() < 0.7:
        return {"attr": attribute.name, "op": "=", "value": rng.choice(attribute.values)}
    picked = rng.sample(attribute.values, 2)
    return {"attr": attribute.name, "op": "in", "value": [v for v in attribute.values if v in picked]}


def _condition(attributes: tuple[Attribute, ...], rng: random.Random) -> Cond:
    roll = rng.random()
    if roll < 0.6:
        return _atom(rng.choice(attributes), rng)
    first, second = rng.sample(attributes, 2)
    return {"all" if roll < 0.9 else "any": [_atom(first, rng), _atom(second, rng)]}


HELDOUT_DOMAIN = "routing"  # only the heldout family's tasks are in it: no trained family draws it


def _base(rng: random.Random, domain: str | None = None, rules: tuple[int, int] = (2, 4), city: bool = False) -> Spec:
    domain = domain or rng.choice(sorted(set(DOMAINS) - {HELDOUT_DOMAIN}))
    attributes = DOMAINS[domain].attributes + ((CITY,) if city else ())
    outcomes = DOMAINS[domain].outcomes
    count = rng.randint(*rules)
    conditions: list[Cond] = []
    while len(conditions) < count:  # no rule repeats another's condition
        cond = _condition(attributes, rng)
        if cond not in conditions:
            conditions.append(cond)
    return {
        "domain": domain,
        "case": {a.name: _value(a, rng) for a in attributes},
        "rules": [{"id": f"R{i + 1}", "if": cond, "then": rng.choice(outcomes)} for i, cond in enumerate(conditions)],
        "order": [f"R{i + 1}" for i in range(count)],
        "default": rng.choice(outcomes),
    }


def _unique(spec: Spec) -> Spec | None:
    """``spec`` unless a change made two rules' conditions the same (then: draw again)."""
    conditions = [rule["if"] for rule in spec["rules"]]
    return spec if all(c not in conditions[:i] for i, c in enumerate(conditions)) else None


def atoms(cond: Cond) -> list[Cond]:
    """The comparisons of a condition, in reading order."""
    if "not" in cond:
        return atoms(cond["not"])
    if "all" in cond or "any" in cond:
        return [atom for part in cond.get("all", cond.get("any")) for atom in atoms(part)]
    return [cond]


def _numeric_atoms(spec: Spec) -> list[Cond]:
    return [atom for rule in spec["rules"] for atom in atoms(rule["if"]) if atom["op"] in INCLUSIVE + EXCLUSIVE]


def _at_threshold(ops: tuple[str, ...]) -> Callable[[random.Random], Spec | None]:
    """A spec where a numeric comparison with one of ``ops`` meets the case's value exactly."""
    def sample(rng: random.Random) -> Spec | None:
        spec = _base(rng)
        numeric = _numeric_atoms(spec)
        if not numeric:
            return None
        atom = rng.choice(numeric)
        atom["op"] = rng.choice(ops)
        spec["case"][atom["attr"]] = atom["value"]
        return _unique(spec)
    return sample


def _missing(rng: random.Random) -> Spec | None:
    spec = _base(rng)
    name = rng.choice(sorted({atom["attr"] for rule in spec["rules"] for atom in atoms(rule["if"])}))
    spec["case"][name] = None
    for rule in spec["rules"]:
        if any(atom["attr"] == name for atom in atoms(rule["if"])):
            rule["missing"] = rng.random() < 0.5  # the rule says what a missing value means for it
    return spec


def _unicode(rng: random.Random) -> Spec | None:
    spec = _base(rng, city=True)
    rule = rng.choice(spec["rules"])
    rule["if"] = _atom(CITY, rng)
    if rng.random() < 0.5:  # often the case's city is the one the rule names
        named = rule["if"]["value"]
        spec["case"]["city"] = rng.choice(named) if isinstance(named, list) else named
    return _unique(spec)


def _negation(rng: random.Random) -> Spec | None:
    spec = _base(rng)
    rule = rng.choice(spec["rules"])
    cond = rule["if"]
    if "all" in cond or "any" in cond:
        parts = cond.get("all", cond.get("any"))
        index = rng.randrange(len(parts))
        parts[index] = {"not": parts[index]}
    else:
        rule["if"] = {"not": cond}
    return _unique(spec)


def _priority(rng: random.Random) -> Spec | None:
    spec = _base(rng, rules=(3, 4))
    listed = list(spec["order"])
    while spec["order"] == listed:
        rng.shuffle(spec["order"])
    return spec


def _first_true(spec: Spec, conclusions: list[bool], order: list[str]) -> str | None:
    truth = {rule["id"]: c for rule, c in zip(spec["rules"], conclusions)}
    return next((rule_id for rule_id in order if truth[rule_id]), None)


def _ties(spec: Spec, conclusions: list[bool]) -> bool:
    """At least two rules apply and they disagree: only the stated priority settles it."""
    outcomes = {rule["then"] for rule, c in zip(spec["rules"], conclusions) if c}
    return sum(conclusions) >= 2 and len(outcomes) >= 2


def _priority_matters(spec: Spec, conclusions: list[bool]) -> bool:
    """Reading the rules top to bottom gives a different decision from the stated order."""
    by_listing = _first_true(spec, conclusions, [rule["id"] for rule in spec["rules"]])
    by_priority = _first_true(spec, conclusions, spec["order"])
    then = {rule["id"]: rule["then"] for rule in spec["rules"]}
    return by_priority is not None and by_listing is not None and then[by_listing] != then[by_priority]


@dataclass(frozen=True)
class Family:
    name: str
    slice: str
    sample: Callable[[random.Random], Spec | None]  # None: draw again
    accept: Callable[[Spec, list[bool]], bool] = lambda spec, conclusions: True


def _core(domain: str) -> Callable[[random.Random], Spec]:
    return lambda rng: _base(rng, domain)


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("loan", "core", _core("loan")),
    Family("shipping", "core", _core("shipping")),
    Family("access", "core", _core("access")),
    Family("routing", "heldout", _core(HELDOUT_DOMAIN)),  # a domain train never shows
    Family("boundary", "edge", _at_threshold(INCLUSIVE)),
    Family("ties", "edge", lambda rng: _base(rng, rules=(3, 4)), _ties),
    Family("missing", "edge", _missing),
    Family("unicode", "edge", _unicode),
    Family("negation", "failure_modes", _negation),
    Family("strictness", "failure_modes", _at_threshold(EXCLUSIVE)),
    Family("priority", "failure_modes", _priority, _priority_matters),
    Family("default", "failure_modes", lambda rng: _base(rng, rules=(2, 4)), lambda spec, c: not any(c)),
)}


# -- rendering ---------------------------------------------------------------------------------

def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "?"
    return str(value)


def render_condition(cond: Cond, nested: bool = False) -> str:
    """``income >= 50000 and not employed``; compound parts of a compound get parentheses."""
    if "not" in cond:
        inner = cond["not"]
        if inner.get("op") == "is":
            return f"not {inner['attr']}"
        return f"not ({render_condition(inner)})"
    if "all" in cond or "any" in cond:
        joiner = " and " if "all" in cond else " or "
        text = joiner.join(render_condition(part, nested=True) for part in cond.get("all", cond.get("any")))
        return f"({text})" if nested else text
    if cond["op"] == "is":
        return cond["attr"]
    if cond["op"] == "in":
        return f"{cond['attr']} in ({', '.join(cond['value'])})"
    return f"{cond['attr']} {cond['op']} {cond['value']}"


def render_prompt(spec: Spec) -> str:
    ids = [rule["id"] for rule in spec["rules"]]
    order = "" if spec["order"] == ids else f" in the order {', '.join(spec['order'])}"
    lines = [f"{DOMAINS[spec['domain']].title} rules. Decision: the first rule that applies{order}, else {spec['default']}."]
    for rule in spec["rules"]:
        line = f"{rule['id']}: {render_condition(rule['if'])} -> {rule['then']}"
        if "missing" in rule:
            missing = sorted({a["attr"] for a in atoms(rule["if"]) if spec["case"].get(a["attr"]) is None})
            line += f" (if {missing[0]}=?, {rule['id']} is {_show(rule['missing'])})"
        lines.append(line)
    lines.append("Case: " + ", ".join(f"{name}={_show(value)}" for name, value in spec["case"].items()))
    lines.append(f"Answer {ids[0]}-{ids[-1]} yes/no, then decision:")
    return "\n".join(lines) + "\n"
