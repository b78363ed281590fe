"""The data environment's task space: table schemas, operations, families, and the tables they get.

A task is an *operation* on a *schema* (filter sales by qty > 5, total pay per team, ...). The
operation renders to a one-line request and a one-line pandas reference; the schema says which
columns the generated CSV has. Everything here is pure: specs are plain dicts, tables are lists of
rows, and the same spec always gets the same table (its rng is seeded by the task's key).

Families group operations by slice: core (typical requests), edge (empty results, ties, unicode,
missing values, zero and negative numbers) and failure_modes (the usual slips: dropping the group
key, integer results where a float is due, ascending for descending, > for >=, wrong columns).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

Rows = list[list[Any]]  # None marks a missing cell
Tables = dict[str, tuple[list[str], Rows]]  # file name -> (columns, rows)


@dataclass(frozen=True)
class Schema:
    """A table of four columns (an id, a category, an int, a float) and another table to join with."""

    name: str
    key: str
    keys: tuple[str, ...]
    cat: str
    cats: tuple[str, ...]
    num: str
    nums: tuple[int, int, int]  # lo, hi, step
    real: str
    reals: tuple[float, float, float]
    key_attr: tuple[str, tuple[str, ...]]  # other.csv's column when joining on the key
    cat_attr: tuple[str, tuple[str, ...]]  # ... when joining on the category
    absent: str  # a category value that never occurs (empty filters)

    @property
    def columns(self) -> list[str]:
        return [self.key, self.cat, self.num, self.real]

    def num_values(self) -> list[int]:
        lo, hi, step = self.nums
        return list(range(lo, hi + 1, step))

    def real_values(self) -> list[float]:
        lo, hi, step = self.reals
        return [round(lo + i * step, 2) for i in range(int(round((hi - lo) / step)) + 1)]

    def values(self, col: str) -> list:
        return self.num_values() if col == self.num else self.real_values()


def _schema(name, key, keys, cat, cats, num, nums, real, reals, key_attr, cat_attr, absent) -> Schema:
    def words(text: str) -> tuple[str, ...]:
        return tuple(word.replace("_", " ") for word in text.split())  # "São_Paulo" is one value

    return Schema(name, key, words(keys), cat, words(cats), num, nums, real, reals,
                  (key_attr[0], words(key_attr[1])), (cat_attr[0], words(cat_attr[1])), absent)


# Column names avoid DataFrame attributes (mode, size, count...) and values avoid pandas' NA strings.
# name, id column and values, category column and values, int column (lo, hi, step), float column
# (lo, hi, step), other.csv's column per id and per category, a category value that never occurs.
CORE = (
    _schema("sales", "item", "apple pear plum fig kiwi lime lemon mango peach grape", "region", "north south east west",
            "qty", (0, 20, 1), "price", (0.5, 9.5, 0.5),
            ("color", "red green yellow purple"), ("boss", "kim lee max ola"), "central"),
    _schema("staff", "name", "ana ben cy dan eve fay gus hal ivy jo", "team", "red blue green",
            "age", (18, 65, 1), "pay", (10.0, 40.0, 0.5),
            ("desk", "d1 d2 d3 d4 d5"), ("floor", "ground first second"), "black"),
    _schema("books", "title", "dune emma ulysses beloved ivanhoe hamlet rebecca carrie heidi matilda",
            "genre", "sci art war pop", "pages", (50, 500, 10), "rating", (1.0, 5.0, 0.1),
            ("author", "ada bo cal dee eli"), ("shelf", "top mid low base"), "jazz"),
    _schema("trips", "city", "rome oslo lima kyiv doha baku riga bern nice cork", "via", "bus car rail ship",
            "days", (1, 14, 1), "cost", (50.0, 900.0, 12.5),
            ("country", "it no pe ua qa az"), ("speed", "slow fast"), "bike"),
    _schema("games", "player", "ari bea col dex fin gia hugo isa jon kai", "club", "lions bears hawks",
            "goals", (0, 9, 1), "mins", (10.0, 90.0, 0.5),
            ("shirt", "s1 s2 s3 s4"), ("coach", "ron sue tom"), "eagles"),
)
UNICODE = (  # "_" stands for a space inside a value
    _schema("places", "city", "Zürich Kraków Malmö São_Paulo Reykjavík Tōkyō Αθήνα Москва Genève Çorum",
            "zone", "nörd süd øst vest", "pop", (1, 99, 1), "temp", (-10.0, 35.0, 0.5),
            ("land", "ch pl se br is"), ("täg", "ä ö ü"), "mitte"),
    _schema("dishes", "dish", "crème_brûlée jalapeño smörgås açaí phở 寿司 paëlla crêpe tōfu ñoquis",
            "origin", "France México Sverige Brasil 日本", "kcal", (50, 900, 10), "euro", (1.0, 30.0, 0.5),
            ("chef", "zoë rené józef"), ("küche", "kalt warm"), "Ελλάδα"),
)
BOUNDARY = (  # zero, negative numbers, values either side of zero
    _schema("ledger", "acct", "acme bolt core dart echo flux gold halo iris jade", "kind", "cash card wire",
            "delta", (-9, 9, 1), "rate", (-2.0, 2.0, 0.25), ("bank", "b1 b2 b3"), ("fee", "low high"), "gift"),
    _schema("weather", "town", "york bath hull ely ayr wick deal rye looe bude", "sky", "sun rain snow",
            "low", (-15, 15, 1), "wind", (0.0, 20.0, 0.5), ("county", "kent devon fife"), ("alert", "green amber red"),
            "fog"),
)
SCHEMAS = {s.name: s for s in CORE + UNICODE + BOUNDARY}


def lit(value: Any) -> str:
    """A Python literal as the reference writes it: double-quoted strings, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _cols(cols: list[str]) -> str:
    return "[" + ", ".join(lit(c) for c in cols) + "]"


# -- operations: spec -> (request, reference expression, row order rule) -----------------------------

_AGG_WORD = {"sum": "sum of", "mean": "mean of", "max": "max of", "min": "min of", "count": "count of non-missing"}
_WORDS = {">=": "at least", "<=": "at most"}
_APPLY = {"strip": (".str.strip()", "strip spaces around"), "lower": (".str.lower()", "lowercase"),
          "upper": (".str.upper()", "uppercase"), "abs": (".abs()", "absolute value of")}


def render(spec: dict[str, Any]) -> tuple[str, str, str]:
    """(request, the expression ``solve`` returns, "exact" or "any" row order) of an operation spec."""
    op = spec["op"]
    if op not in _RENDERERS:
        raise ValueError(f"data env: unknown operation {op!r}")
    return _RENDERERS[op](spec)


def _render_rows(spec: dict[str, Any]) -> tuple[str, str, str]:
    """Operations that keep some rows, all columns, in df order: filter, isna, dropna, dedupe."""
    op = spec["op"]
    if op == "filter":
        col, cmp, value = spec["col"], spec["cmp"], spec["value"]
        cond = f"{col} is {_WORDS[cmp]} {lit(value)}" if spec.get("words") else f"{col} {cmp} {lit(value)}"
        return f"rows where {cond} (all columns, df order).", f'df[df["{col}"] {cmp} {lit(value)}]', "exact"
    if op == "isna":
        method, word = ("notna", "is not missing") if spec["negate"] else ("isna", "is missing")
        return f"rows where {spec['col']} {word} (df order).", f'df[df["{spec["col"]}"].{method}()]', "exact"
    if op == "dropna":
        return f"drop rows where {spec['col']} is missing.", f'df.dropna(subset=["{spec["col"]}"])', "exact"
    return "drop duplicate rows, keeping the first.", "df.drop_duplicates()", "exact"  # dedupe


def _render_order(spec: dict[str, Any]) -> tuple[str, str, str]:
    """Operations that reorder rows: sort (optionally keeping some columns), top."""
    if spec["op"] == "top":
        col, k, high = spec["col"], spec["k"], spec["high"]
        word = "highest" if high else "lowest"
        expr = f"df.sort_values({lit(col)}" + (", ascending=False" if high else "") + f").head({k})"
        return f"the {k} rows with the {word} {col}, {word} first.", expr, "exact"
    cols, asc = spec["cols"], spec["asc"]
    words = " then ".join(f"{c} {'ascending' if a else 'descending'}" for c, a in zip(cols, asc))
    if len(cols) == 1:
        expr = f"df.sort_values({lit(cols[0])}" + ("" if asc[0] else ", ascending=False") + ")"
    else:
        expr = f"df.sort_values({_cols(cols)}" + ("" if all(asc) else f", ascending={asc!r}") + ")"
    keep = spec.get("keep")
    if keep:
        return f"columns {','.join(keep)} of all rows sorted by {words}.", f"{expr}[{_cols(keep)}]", "exact"
    return f"all rows sorted by {words}.", expr, "exact"


def _render_columns(spec: dict[str, Any]) -> tuple[str, str, str]:
    """Operations that pick columns: select (optionally of some rows), drop."""
    cols = spec["cols"]
    if spec["op"] == "drop":
        return f"all columns except {','.join(cols)}, all rows.", f"df.drop(columns={_cols(cols)})", "exact"
    where = spec.get("where")
    if where:
        col, cmp, value = where
        return (f"columns {','.join(cols)} (in that order) of rows where {col} {cmp} {lit(value)}.",
                f'df.loc[df["{col}"] {cmp} {lit(value)}, {_cols(cols)}]', "exact")
    return f"columns {','.join(cols)} (in that order), all rows.", f"df[{_cols(cols)}]", "exact"


def _render_values(spec: dict[str, Any]) -> tuple[str, str, str]:
    """Operations that write a column's values, all rows: fillna, apply, divide."""
    op, col = spec["op"], spec["col"]
    if op == "fillna":
        value = spec["value"]
        return f"fill missing {col} with {value}.", f'df.fillna({{"{col}": {value}}})', "exact"
    if op == "apply":  # a column-wise cleaning or arithmetic function, written back to the column
        call, word = _APPLY[spec["fn"]]
        return f"{word} {col} values, all rows.", f'df.assign({col}=df["{col}"]{call})', "exact"
    k, name = spec["k"], spec["name"]  # divide
    return f"all rows plus a column {name} = {col} / {k}.", f'df.assign({name}=df["{col}"] / {k})', "exact"


def _render_aggregate(spec: dict[str, Any]) -> tuple[str, str, str]:
    """Operations that aggregate rows: group, pivot, mean_all."""
    op = spec["op"]
    if op == "pivot":
        index, columns, values, agg = spec["index"], spec["columns"], spec["values"], spec["agg"]
        return (f"pivot: a row per {index} (sorted), a column per {columns}, {_AGG_WORD[agg]} {values}, 0 if none.",
                f'df.pivot_table(index="{index}", columns="{columns}", values="{values}", aggfunc="{agg}", '
                f"fill_value=0).reset_index()", "exact")
    if op == "mean_all":
        return (f"a one-row table, column {spec['name']} = mean of {spec['col']}.",
                f'pd.DataFrame({{"{spec["name"]}": [df["{spec["col"]}"].mean()]}})', "exact")
    by, col, agg, name = spec["by"], spec.get("col"), spec["agg"], spec.get("name")  # group
    if agg == "size":
        return f"number of rows per {by}; columns {by},size; sorted by {by}.", \
            f'df.groupby("{by}", as_index=False).size()', "exact"
    if name:
        expr = f'df.groupby("{by}", as_index=False).agg({name}=("{col}", "{agg}"))'
    else:
        expr = f'df.groupby("{by}", as_index=False)["{col}"].{agg}()'
    digits = spec.get("round")
    rounded = f", rounded to {digits} decimals" if digits else ""
    if digits:
        expr += f".round({digits})"
    out = name or col
    return f"{_AGG_WORD[agg]} {col} per {by}{rounded}; columns {by},{out}; sorted by {by}.", expr, "exact"


def _render_join(spec: dict[str, Any]) -> tuple[str, str, str]:
    """A merge of df with the second table ``other``, in any row order."""
    on, how, keep = spec["on"], spec["how"], spec.get("keep")
    expr = f'df.merge(other, on="{on}"' + (', how="left"' if how == "left" else "") + ")"
    what = "left join of df with other" if how == "left" else "inner join of df and other"
    if keep:
        return f"{what} on {on}; columns {','.join(keep)}; any row order.", f"{expr}[{_cols(keep)}]", "any"
    return f"{what} on {on}; all columns; any row order.", expr, "any"


_RENDERERS = {
    "filter": _render_rows, "isna": _render_rows, "dropna": _render_rows, "dedupe": _render_rows,
    "sort": _render_order, "top": _render_order,
    "select": _render_columns, "drop": _render_columns,
    "fillna": _render_values, "apply": _render_values, "divide": _render_values,
    "group": _render_aggregate, "pivot": _render_aggregate, "mean_all": _render_aggregate,
    "join": _render_join,
}


# -- tables ------------------------------------------------------------------------------------------


def base_table(s: Schema, rng: random.Random, rows: int | None = None, unique: tuple[str, ...] = ()) -> Rows:
    """``rows`` rows (5-9 by default), distinct ids, at least two categories; ``unique`` columns distinct."""
    n = rows or rng.randint(5, 9)
    columns = {s.key: rng.sample(s.keys, n)}
    cats = rng.sample(s.cats, min(len(s.cats), 2))
    columns[s.cat] = [cats[i] if i < len(cats) else rng.choice(s.cats) for i in range(n)]
    rng.shuffle(columns[s.cat])
    for col in (s.num, s.real):
        pool = s.values(col)
        columns[col] = rng.sample(pool, n) if col in unique else [rng.choice(pool) for _ in range(n)]
    return [[columns[c][i] for c in s.columns] for i in range(n)]


def _blank(rows: Rows, index: int, rng: random.Random, count: int) -> None:
    """Make ``count`` cells of column ``index`` missing, never all of them."""
    for i in rng.sample(range(len(rows)), min(count, len(rows) - 1)):
        rows[i][index] = None


def make_tables(family: str, spec: dict[str, Any], s: Schema, rng: random.Random) -> Tables:
    """The CSV tables a family's task runs on; the family decides what the data must contain."""
    op = spec["op"]
    unique = tuple(spec.get("cols", ())) if op == "sort" and family != "sort_ties" else ()
    if op == "top":
        unique = (spec["col"],)
    if family == "sort_ties":
        unique = (s.real,)
    rows = base_table(s, rng, unique=unique)
    index = {c: i for i, c in enumerate(s.columns)}
    if family == "sort_ties" and spec["cols"][0] == s.num:  # force ties in the first sort key
        for i in rng.sample(range(len(rows)), 3)[1:]:
            rows[i][index[s.num]] = rows[0][index[s.num]]
    if op in ("dropna", "fillna") or family == "missing":
        _blank(rows, index[spec.get("col") or s.num], rng, rng.randint(1, 3))
    if op == "apply" and spec["fn"] in ("strip", "lower"):
        col = index[spec["col"]]
        for i in rng.sample(range(len(rows)), 3):
            rows[i][col] = f" {rows[i][col]}  " if spec["fn"] == "strip" else rows[i][col].capitalize()
    if op == "dedupe":
        for _ in range(rng.randint(1, 2)):
            rows.insert(rng.randint(1, len(rows)), list(rng.choice(rows)))
    if op == "pivot":  # ids repeat so that the pivot has several columns with several values
        ids = rng.sample(s.keys, 3)
        for row in rows:
            row[index[s.key]] = rng.choice(ids)
    if op == "filter" and spec.get("words"):  # the threshold itself occurs, so >= and > differ
        rows[rng.randrange(len(rows))][index[spec["col"]]] = spec["value"]
    tables: Tables = {"data.csv": (s.columns, rows)}
    if op == "join":
        tables["other.csv"] = _other_table(spec, s, rows, rng)
    return tables


def _other_table(spec: dict[str, Any], s: Schema, rows: Rows, rng: random.Random) -> tuple[list[str], Rows]:
    """other.csv: some of df's join values (so a left join leaves gaps) plus some df lacks."""
    on = spec["on"]
    attr, pool = s.key_attr if on == s.key else s.cat_attr
    present = sorted({row[s.columns.index(on)] for row in rows})
    universe = s.keys if on == s.key else s.cats + (s.absent,)
    kept = rng.sample(present, max(1, len(present) - rng.randint(1, 2)))
    extra = rng.sample([v for v in universe if v not in present], min(2, len(universe) - len(present)))
    values = kept + extra
    rng.shuffle(values)
    return [on, attr], [[v, rng.choice(pool)] for v in values]


def to_csv(columns: list[str], rows: Rows) -> str:
    """CSV text pandas reads back to the same cells: missing cells are empty, floats in repr."""
    def cell(value: Any) -> str:
        return "" if value is None else str(value)
    return "\n".join(",".join(cell(v) for v in line) for line in [columns, *rows]) + "\n"


# -- families ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    kind: str
    slice: str
    specs: Callable[[], list[dict[str, Any]]]  # the whole operation space of the family
    accept: Callable[[dict[str, Any], list[list], int], bool]  # (spec, expected rows, input rows) -> usable


def _interior(s: Schema, col: str) -> list:
    return s.values(col)[1:-1]


def _some(values: list, count: int) -> list:
    """``count`` values spread evenly over ``values`` (a fixed subset, to keep a family's space small)."""
    step = max(1, len(values) // count)
    return values[step // 2::step][:count]


def _proper(spec, rows, n) -> bool:
    return 0 < len(rows) < n


def _any(spec, rows, n) -> bool:
    return len(rows) > 0


def _groups(spec, rows, n) -> bool:
    return len(rows) > 1


def _fraction(spec, rows, n) -> bool:
    """Some result is not a whole number, so integer arithmetic shows in the values, not just the dtype."""
    return any(isinstance(v, float) and v != int(v) for row in rows for v in row[-1:])


def _filter_specs(schemas, cmps, values, **extra) -> list[dict]:
    return [{"schema": s.name, "op": "filter", "col": col, "cmp": cmp, "value": v, **extra}
            for s in schemas for col in (s.num, s.real) for cmp in cmps for v in values(s, col)]


def _core_filter():
    return _filter_specs(CORE, (">", "<"), _interior) + [
        {"schema": s.name, "op": "filter", "col": s.cat, "cmp": "==", "value": c} for s in CORE for c in s.cats]


def _sort():
    return [{"schema": s.name, "op": "sort", "cols": [c], "asc": [a], "keep": keep}
            for s in CORE for c in (s.key, s.num, s.real) for a in (True, False)
            for keep in ([], [s.key, c] if c != s.key else [c, s.cat])]


def _group(schemas, aggs, **extra):
    return [{"schema": s.name, "op": "group", "by": s.cat, "col": c, "agg": a, **extra}
            for s in schemas for c in (s.num, s.real) for a in aggs]


def _select():
    return [{"schema": s.name, "op": "select", "cols": list(pair), "where": where}
            for s in CORE for pair in itertools.permutations(s.columns, 2)
            for where in [None] + [[col, cmp, v] for col in (s.num, s.real) for cmp in (">", "<")
                                   for v in _some(_interior(s, col), 4)]]


def _clean():
    specs = []
    for s in CORE:
        specs += [{"schema": s.name, "op": "dropna", "col": c} for c in (s.num, s.real)]
        specs += [{"schema": s.name, "op": "fillna", "col": c, "value": v} for c in (s.num, s.real) for v in (0, -1)]
        specs += [{"schema": s.name, "op": "apply", "col": c, "fn": fn}
                  for c in (s.key, s.cat) for fn in ("strip", "lower")]
        specs.append({"schema": s.name, "op": "dedupe"})
    return specs


def _join():
    specs = []
    for s in CORE:
        for on, attr in ((s.key, s.key_attr[0]), (s.cat, s.cat_attr[0])):
            for how in ("inner", "left"):
                for keep in ([], [on, attr], [attr, s.num]):
                    specs.append({"schema": s.name, "op": "join", "on": on, "how": how, "keep": keep})
    return specs


def _pivot():
    return [{"schema": s.name, "op": "pivot", "index": s.cat, "columns": s.key, "values": v, "agg": a}
            for s in CORE for v in (s.num, s.real) for a in ("sum", "max", "min", "count")]


def _beyond(s: Schema, col: str, side: int) -> list:
    """Values past the top (side 1) or bottom (side -1) of a column's range: a filter on them keeps nothing."""
    values, step = s.values(col), s.nums[2] if col == s.num else s.reals[2]
    edge = values[-1] if side > 0 else values[0]
    return [round(edge + side * step * i, 2) for i in (1, 2, 5)]


def _empty_filter():
    return (_filter_specs(CORE, (">",), lambda s, col: _beyond(s, col, 1))
            + _filter_specs(CORE, ("<",), lambda s, col: _beyond(s, col, -1))
            + [{"schema": s.name, "op": "filter", "col": s.cat, "cmp": "==", "value": s.absent} for s in CORE])


def _sort_ties():
    return [{"schema": s.name, "op": "sort", "cols": [first, second], "asc": [a1, a2]}
            for s in CORE for first in (s.cat, s.num) for second in (s.key, s.real)
            for a1 in (True, False) for a2 in (True, False)]


def _unicode():
    specs = []
    for s in UNICODE:
        specs += [{"schema": s.name, "op": "filter", "col": s.cat, "cmp": "==", "value": c} for c in s.cats]
        specs += [{"schema": s.name, "op": "sort", "cols": [s.key], "asc": [a], "keep": []} for a in (True, False)]
        specs += [{"schema": s.name, "op": "apply", "col": c, "fn": "upper"} for c in (s.key, s.cat)]
        specs += _group([s], ("sum", "count", "max"))
        specs += _filter_specs([s], (">", "<"), lambda s, col: _some(_interior(s, col), 6))
    return specs


def _missing():
    return _group(CORE, ("sum", "mean", "count", "max")) + [
        {"schema": s.name, "op": "isna", "col": c, "negate": neg} for s in CORE for c in (s.num, s.real)
        for neg in (False, True)]


def _boundary():
    near_zero = lambda s, col: [v for v in s.values(col) if -1 <= v <= 1]  # noqa: E731
    return (_filter_specs(BOUNDARY, (">", "<", ">=", "<=", "=="), near_zero)
            + _group(BOUNDARY, ("sum", "min", "max", "mean"))
            + [{"schema": s.name, "op": "apply", "col": c, "fn": "abs"} for s in BOUNDARY for c in (s.num, s.real)])


def _keep_key():
    names = {"sum": "total", "mean": "avg", "max": "top", "min": "low", "count": "n"}
    return [{**spec, "name": names[spec["agg"]]} for spec in _group(CORE, tuple(names))] + [
        {"schema": s.name, "op": "group", "by": s.cat, "agg": "size"} for s in CORE]


def _int_float():
    specs = [{**spec, "round": digits} for spec in _group(CORE, ("mean",)) for digits in (1, 2)]
    specs += [{"schema": s.name, "op": "divide", "col": s.num, "k": k, "name": name}
              for s in CORE for k in (2, 3, 4, 5, 8) for name in ("ratio", "part")]
    return specs + [{"schema": s.name, "op": "mean_all", "col": s.num, "name": "avg"} for s in CORE]


def _descending():
    return [{"schema": s.name, "op": "top", "col": c, "k": k, "high": high}
            for s in CORE for c in (s.num, s.real) for k in (2, 3, 4) for high in (True, False)]


def _threshold():
    return _filter_specs(CORE, (">=", "<="), lambda s, col: _some(_interior(s, col), 12), words=True)


def _wrong_columns():
    return [{"schema": s.name, "op": "drop", "cols": list(cols)}
            for s in CORE for size in (1, 2) for cols in itertools.combinations(s.columns, size)]


FAMILIES = (
    Family("filter", "core", _core_filter, _proper),
    Family("sort", "core", _sort, _any),
    Family("group_agg", "core", lambda: _group(CORE, ("sum", "mean", "max", "min", "count")), _groups),
    Family("select", "core", _select, lambda sp, r, n: len(r) > 0 and (not sp["where"] or len(r) < n)),
    Family("clean", "core", _clean, _any),
    Family("join", "core", _join, _any),
    Family("pivot", "heldout", _pivot, _groups),  # reshaping: train groups and joins, never pivots
    Family("empty_filter", "edge", _empty_filter, lambda sp, r, n: not r),
    Family("sort_ties", "edge", _sort_ties, _any),
    Family("unicode", "edge", _unicode, _any),
    Family("missing", "edge", _missing, _any),
    Family("boundary", "edge", _boundary, _any),
    Family("keep_key", "failure_modes", _keep_key, _groups),
    Family("int_float", "failure_modes", _int_float, _fraction),
    Family("descending", "failure_modes", _descending, _any),
    Family("threshold", "failure_modes", _threshold, _proper),
    Family("wrong_columns", "failure_modes", _wrong_columns, _any),
)
