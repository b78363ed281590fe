"""The script environment's task families: starting trees, goals, reference scripts, expected trees.

A task's spec is plain data, ``{"op", "args", "start"}``: an operation with its arguments and the
starting file tree ({relative path: text}). Everything else derives from it here, in the trusted
process and without executing anything: the expected tree (``Op.apply``, pure Python on tree
dicts), the goal line of the prompt and the reference script.

Generated text never holds the line separators that ``str.splitlines`` and file iteration disagree
on (\\r, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028, \\u2029), so "a line" means the same to the
expected tree and to any script that reads the file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

Tree = dict[str, str]

# -- vocabulary ----------------------------------------------------------------------------------

STEMS = ["notes", "draft", "data", "plan", "ideas", "summary", "memo", "budget", "final", "alpha", "beta",
         "gamma", "delta", "march", "april", "orders", "guests", "recipes", "photos", "scores", "tasks", "songs"]
ODD_STEMS = ["my notes", "old data", "to do", "café", "résumé", "über uns", "日記", "naïve plan", "año nuevo",
             "final v2", "señal", "Ωmega"]
FILLER = ["the", "red", "box", "went", "home", "early", "paint", "fence", "water", "plants", "read", "book",
          "clean", "desk", "send", "mail", "walk", "dog", "cook", "rice", "pay", "rent", "buy", "bread"]
FILTER_WORDS = ["todo", "bug", "milk", "urgent", "call", "fix", "later", "idea"]
UNICODE_WORDS = ["café", "naïve", "日本", "über", "ñandú", "Ωmega", "🙂"]
UNICODE_FILLER = ["thé", "crème", "brûlée", "straße", "東京", "şehir", "öl", "ça", "va", "mañana", "ok", "fin"]
LEVELS = ["INFO", "DEBUG", "WARN", "ERROR"]
MESSAGES = ["disk full", "started", "user login", "retry", "timeout", "saved file", "cache miss", "done",
            "bad input", "shutdown"]
RENAME_PAIRS = [(".txt", ".md"), (".log", ".txt"), (".csv", ".tsv"), (".jpeg", ".jpg"), (".htm", ".html"),
                (".yml", ".yaml"), (".text", ".txt")]
OTHER_EXTS = [".txt", ".md", ".csv", ".json", ".py", ".cfg", ".log", ".dat"]
MOVE_EXTS = [".log", ".csv", ".txt", ".json", ".png", ".bak"]
FOLDERS = ["archive", "old", "backup", "done", "sorted", "keep"]
DELETE_EXTS = [".tmp", ".bak", ".log", ".old", ".swp"]
COPY_EXTS = [".cfg", ".ini", ".conf", ".json", ".toml"]
# Names with only ASCII letters: a name's digits must be the number concat_numeric sorts by.
PART_PREFIXES = ["part", "ch", "page", "section", "step"]
_BAD_SEPARATORS = set("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


# -- operations: the goal, the reference and the expected tree of each kind of task ----------------


def _top(path: str) -> bool:
    return "/" not in path


def _in(folder: str, path: str) -> bool:
    """Whether ``path`` is a file directly inside ``folder``."""
    return path.startswith(folder + "/") and "/" not in path[len(folder) + 1:]


def _count(text: str, word: str) -> int:
    return sum(word in line for line in text.splitlines())


def _renamed(tree: Tree, rename: Callable[[str], str]) -> Tree | None:
    """``tree`` with each path renamed; None if two files would end up at one path."""
    out: Tree = {}
    for path, text in tree.items():
        target = rename(path)
        if target in out:
            return None
        out[target] = text
    return out


def _rename_apply(tree: Tree, a: dict) -> Tree | None:
    old, new = a["old"], a["new"]
    return _renamed(tree, lambda p: p[: -len(old)] + new if _top(p) and p.endswith(old) else p)


def _move_apply(tree: Tree, a: dict) -> Tree | None:
    return _renamed(tree, lambda p: f"{a['folder']}/{p}" if _top(p) and p.endswith(a["ext"]) else p)


def _filter_apply(tree: Tree, a: dict) -> Tree | None:
    if a["dst"] in tree:
        return None
    kept = "".join(line + "\n" for line in tree[a["src"]].splitlines() if a["word"] in line)
    return {**tree, a["dst"]: kept}


def _count_total_apply(tree: Tree, a: dict) -> Tree | None:
    total = sum(_count(text, a["word"]) for path, text in tree.items() if _in(a["folder"], path) and path.endswith(a["ext"]))
    return None if a["report"] in tree else {**tree, a["report"]: f"{total}\n"}


def _count_per_file_apply(tree: Tree, a: dict) -> Tree | None:
    folder = a["folder"]
    rows = [f"{path[len(folder) + 1:]}: {_count(tree[path], a['word'])}\n" for path in sorted(tree) if _in(folder, path)]
    return None if a["report"] in tree else {**tree, a["report"]: "".join(rows)}


def _number(name: str) -> int:
    return int("".join(c for c in name if c.isdigit()))


def _concat_apply(tree: Tree, a: dict) -> Tree | None:
    folder = a["folder"]
    names = sorted(path[len(folder) + 1:] for path in tree if _in(folder, path))
    if a["numeric"]:
        names.sort(key=_number)
    return None if a["dst"] in tree else {**tree, a["dst"]: "".join(tree[f"{folder}/{n}"] for n in names)}


def _delete_apply(tree: Tree, a: dict) -> Tree | None:
    return {p: t for p, t in tree.items() if not (p.rsplit("/", 1)[-1].endswith(a["ext"]) and (a["recursive"] or _top(p)))}


def _append_apply(tree: Tree, a: dict) -> Tree | None:
    return {**tree, a["dst"]: tree[a["dst"]] + a["line"] + "\n"}


def _copy_apply(tree: Tree, a: dict) -> Tree | None:
    copies = {p + ".bak": t for p, t in tree.items() if _top(p) and p.endswith(a["ext"])}
    return None if set(copies) & set(tree) else {**tree, **copies}


@dataclass(frozen=True)
class Op:
    apply: Callable[[Tree, dict], Tree | None]  # the expected tree; None: the spec is ambiguous, draw again
    goal: Callable[[dict], str]  # the prompt's goal line
    reference: Callable[[dict], str]  # a script (after the prompt's "import os") that reaches the goal


OPS: dict[str, Op] = {
    "rename": Op(
        _rename_apply,
        lambda a: f"rename every {a['old']} file in this folder to {a['new']} (same name, same content).",
        lambda a: (f"for n in os.listdir('.'):\n    if n.endswith({a['old']!r}):\n"
                   f"        os.rename(n, n[:-{len(a['old'])}] + {a['new']!r})\n"),
    ),
    "move": Op(
        _move_apply,
        lambda a: f"move every {a['ext']} file in this folder into the folder {a['folder']}/ (create it if needed).",
        lambda a: (f"os.makedirs({a['folder']!r}, exist_ok=True)\nfor n in os.listdir('.'):\n"
                   f"    if n.endswith({a['ext']!r}):\n        os.rename(n, os.path.join({a['folder']!r}, n))\n"),
    ),
    "filter": Op(
        _filter_apply,
        lambda a: f"write the lines of {a['src']} that contain {a['word']!r} to {a['dst']}, in order, each ending with a newline.",
        lambda a: (f"with open({a['dst']!r}, 'w') as f:\n    for line in open({a['src']!r}).read().splitlines():\n"
                   f"        if {a['word']!r} in line:\n            f.write(line + '\\n')\n"),
    ),
    "count_total": Op(
        _count_total_apply,
        lambda a: (f"count the lines containing {a['word']!r} (exact case) in the {a['ext']} files in {a['folder']}/; "
                   f"write the count and a newline to {a['report']}."),
        lambda a: (f"n = 0\nfor p in os.listdir({a['folder']!r}):\n    if p.endswith({a['ext']!r}):\n"
                   f"        n += sum({a['word']!r} in l for l in open({a['folder'] + '/'!r} + p))\n"
                   f"with open({a['report']!r}, 'w') as f:\n    f.write(f'{{n}}\\n')\n"),
    ),
    "count_per_file": Op(
        _count_per_file_apply,
        lambda a: (f"for each file in {a['folder']}/, in name order, write a line 'NAME: N' to {a['report']}, "
                   f"N = how many of its lines contain {a['word']!r}."),
        lambda a: (f"with open({a['report']!r}, 'w') as f:\n    for p in sorted(os.listdir({a['folder']!r})):\n"
                   f"        n = sum({a['word']!r} in l for l in open({a['folder'] + '/'!r} + p))\n"
                   f"        f.write(f'{{p}}: {{n}}\\n')\n"),
    ),
    "concat": Op(
        _concat_apply,
        lambda a: (f"concatenate the files in {a['folder']}/ into {a['dst']}, ordered by the number in their names "
                   f"(2 before 10)." if a["numeric"] else
                   f"concatenate the files in {a['folder']}/ in name order into {a['dst']}."),
        lambda a: (f"names = sorted(os.listdir({a['folder']!r}))\n"
                   + ("names.sort(key=lambda p: int(''.join(c for c in p if c.isdigit())))\n" if a["numeric"] else "")
                   + f"with open({a['dst']!r}, 'w') as f:\n    for p in names:\n"
                   f"        f.write(open({a['folder'] + '/'!r} + p).read())\n"),
    ),
    "delete": Op(
        _delete_apply,
        lambda a: f"delete every {a['ext']} file in this folder" + (" and all its subfolders." if a["recursive"] else "."),
        lambda a: (f"for d, _, names in os.walk('.'):\n    for n in names:\n        if n.endswith({a['ext']!r}):\n"
                   f"            os.remove(os.path.join(d, n))\n" if a["recursive"] else
                   f"for n in os.listdir('.'):\n    if n.endswith({a['ext']!r}):\n        os.remove(n)\n"),
    ),
    "append": Op(
        _append_apply,
        lambda a: f"append the line {a['line']!r} to {a['dst']}, keeping what is in it.",
        lambda a: f"with open({a['dst']!r}, 'a') as f:\n    f.write({a['line'] + chr(10)!r})\n",
    ),
    "copy": Op(
        _copy_apply,
        lambda a: f"copy every {a['ext']} file in this folder to a backup named like it plus .bak (a{a['ext']} -> a{a['ext']}.bak); keep the originals.",
        lambda a: (f"import shutil\nfor n in os.listdir('.'):\n    if n.endswith({a['ext']!r}):\n"
                   f"        shutil.copy(n, n + '.bak')\n"),
    ),
}


# -- starting trees ------------------------------------------------------------------------------


def _lines(rng: random.Random, count: int, word: str | None = None, hits: int = 0, filler: list[str] = FILLER) -> str:
    """``count`` lines of 2-4 filler words, ``hits`` of them (random ones) holding ``word``; each ends in a newline."""
    chosen = set(rng.sample(range(count), hits)) if word else set()
    out = []
    for i in range(count):
        words = rng.sample(filler, rng.randint(2, 4))
        if i in chosen:
            words.insert(rng.randint(0, len(words)), word)
        out.append(" ".join(words) + "\n")
    return "".join(out)


def _log(rng: random.Random, count: int, levels: list[str] = LEVELS) -> str:
    return "".join(f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} {rng.choice(levels)} {rng.choice(MESSAGES)}\n"
                   for _ in range(count))


def _stems(rng: random.Random, count: int, pool: list[str] = STEMS) -> list[str]:
    return rng.sample(pool, count)


def _shuffled(rng: random.Random, tree: Tree) -> Tree:
    """The tree in a random placement order: the order files are created in is not their name order,
    so a script that relies on directory order instead of sorting is caught."""
    items = list(tree.items())
    rng.shuffle(items)
    return dict(items)


def _rename(rng: random.Random, odd: bool = False) -> tuple[dict, Tree]:
    old, new = rng.choice(RENAME_PAIRS)
    others = [e for e in OTHER_EXTS if e not in (old, new)]
    matching = rng.randint(0, 3) if odd else rng.randint(1, 3)
    stems = _stems(rng, matching + rng.randint(1, 2), ODD_STEMS if odd else STEMS)
    tree = {f"{s}{old if i < matching else rng.choice(others)}": _lines(rng, rng.randint(1, 3)) for i, s in enumerate(stems)}
    return {"old": old, "new": new}, tree


def _move(rng: random.Random, odd: bool = False, decoys: bool = False) -> tuple[dict, Tree]:
    ext, folder = rng.choice(MOVE_EXTS), rng.choice(FOLDERS)
    others = [e for e in OTHER_EXTS if e != ext]
    matching = rng.randint(0, 2) if odd else rng.randint(1, 2 if decoys else 3)
    stems = _stems(rng, matching + (1 if decoys else rng.randint(1, 2)), ODD_STEMS if odd else STEMS)
    tree = {f"{s}{ext if i < matching else rng.choice(others)}": _lines(rng, rng.randint(1, 2)) for i, s in enumerate(stems)}
    if decoys:  # the extension inside a name, not at its end: not an ext file
        tree[f"{rng.choice(STEMS)}{ext}{rng.choice(others)}"] = _lines(rng, 1)
        tree[f"{ext[1:]}"] = _lines(rng, 1)
    if rng.random() < 0.4:  # the folder is there already, with a file of its own
        tree[f"{folder}/{rng.choice(STEMS)}{ext}"] = _lines(rng, 1)
    return {"ext": ext, "folder": folder}, tree


def _filter(rng: random.Random, unicode: bool = False, last_line: bool = False) -> tuple[dict, Tree]:
    src = rng.choice(["notes.txt", "todo.txt", "input.txt", "journal.txt", "list.txt"])
    dst = rng.choice(["out.txt", "matches.txt", "result.txt", "filtered.txt"])
    word = rng.choice(UNICODE_WORDS if unicode else FILTER_WORDS)
    count = rng.randint(3, 7)
    hits = rng.randint(0, 2) if unicode else rng.randint(1, count - 1)
    text = _lines(rng, count, word, hits, UNICODE_FILLER + FILLER[:8] if unicode else FILLER)
    if last_line:  # the last line holds the word and has no newline: the output's must have one
        text = text[:-1] + f" {word}"
    tree = {src: text}
    other = f"{rng.choice(STEMS)}.txt"
    if rng.random() < 0.5 and other != src:
        tree[other] = _lines(rng, 2, word, 1)  # another file with the word, left alone
    return {"src": src, "dst": dst, "word": word}, tree


def _count_total(rng: random.Random, empty: bool = False, exact_case: bool = False) -> tuple[dict, Tree]:
    word = "ERROR" if exact_case else rng.choice(["ERROR", "WARN", "DEBUG"])
    folder, ext = rng.choice(["logs", "var", "log"]), ".log"
    report = rng.choice(["report.txt", "errors.txt", "count.txt", "summary.txt"])
    levels = LEVELS + (["error", "Error", "ERRor", "warn"] if exact_case else [])
    tree = {}
    for stem in _stems(rng, rng.randint(1 if empty else 2, 4), ["app", "db", "web", "auth", "cron", "mail"]):
        if empty and rng.random() < 0.5:
            tree[f"{folder}/{stem}{ext}"] = ""
        else:
            without = empty and rng.random() < 0.5  # no line has the word: the report says 0
            tree[f"{folder}/{stem}{ext}"] = _log(rng, rng.randint(1, 6), [lv for lv in levels if lv != word] if without else levels)
    if exact_case:  # at least one line that only a case-insensitive count would take
        first = min(tree)
        tree[first] += f"{rng.randint(0, 23):02d}:00 {rng.choice(['error', 'Error'])} {rng.choice(MESSAGES)}\n"
    if rng.random() < 0.5:  # not a log file: its lines do not count
        tree[f"{folder}/README.txt"] = f"lines with {word} matter\n"
    return {"folder": folder, "ext": ext, "word": word, "report": report}, tree


def _count_per_file(rng: random.Random) -> tuple[dict, Tree]:
    word, folder = rng.choice(["ERROR", "WARN"]), rng.choice(["logs", "var", "log"])
    report = rng.choice(["report.txt", "counts.txt", "summary.txt"])
    stems = _stems(rng, rng.randint(2, 4), ["app", "db", "web", "auth", "cron", "mail"])
    tree = {f"{folder}/{s}.log": _log(rng, rng.randint(1, 5)) for s in stems}
    return {"folder": folder, "word": word, "report": report}, tree


def _concat(rng: random.Random, empty: bool = False, numeric: bool = False) -> tuple[dict, Tree]:
    folder = rng.choice(["parts", "chapters", "pages", "pieces"])
    dst = rng.choice(["all.txt", "book.txt", "joined.txt", "full.txt"])
    count = rng.randint(2, 5)
    if numeric:
        prefix = rng.choice(PART_PREFIXES)
        numbers = rng.sample(range(1, 120), count)
        while sorted(numbers) == sorted(numbers, key=str):  # name order must differ from numeric order
            numbers = rng.sample(range(1, 120), count)
        names = [f"{prefix}{n}.txt" for n in numbers]
    else:
        names = [f"{s}.txt" for s in _stems(rng, count)]
    filler = UNICODE_FILLER if empty else FILLER
    tree = {f"{folder}/{n}": ("" if empty and rng.random() < 0.4 else _lines(rng, rng.randint(1, 2), filler=filler))
            for n in names}
    return {"folder": folder, "dst": dst, "numeric": numeric}, tree


def _delete(rng: random.Random, nested: bool = False) -> tuple[dict, Tree]:
    ext = rng.choice(DELETE_EXTS)
    others = [e for e in OTHER_EXTS if e != ext]
    tree = {}
    folders = [""] + (rng.sample(["src", "cache", "docs", "a/b", "a/b/c", "old/x"], rng.randint(1, 2)) if nested else [])
    for folder in folders:
        count = rng.randint(1, 2) if folder else (2 if nested else rng.randint(2, 4))
        for i, stem in enumerate(_stems(rng, count)):
            # The first file of a folder goes, the second stays (so something is left), others either way.
            keep = i == 1 or (i > 1 and rng.random() < 0.5)
            name = f"{stem}{rng.choice(others) if keep else ext}"
            tree[f"{folder}/{name}" if folder else name] = _lines(rng, 1)
    return {"ext": ext, "recursive": nested}, tree


def _append(rng: random.Random) -> tuple[dict, Tree]:
    dst = rng.choice(["log.txt", "history.txt", "journal.txt", "notes.txt"])
    line = rng.choice(["done", "checked", "end of day", "backup ok", "ok", "all good"])
    tree = {dst: _lines(rng, rng.randint(1, 4))}
    other = f"{rng.choice(STEMS)}.txt"
    if rng.random() < 0.5 and other != dst:
        tree[other] = _lines(rng, 1)
    return {"dst": dst, "line": line}, tree


def _copy(rng: random.Random) -> tuple[dict, Tree]:
    ext = rng.choice(COPY_EXTS)
    others = [e for e in OTHER_EXTS if e != ext]
    matching = rng.randint(1, 3)
    stems = _stems(rng, matching + rng.randint(0, 2))
    tree = {f"{s}{ext if i < matching else rng.choice(others)}": _lines(rng, rng.randint(1, 2)) for i, s in enumerate(stems)}
    return {"ext": ext}, tree


@dataclass(frozen=True)
class Family:
    name: str  # the task kind
    slice: str  # the benchmark slice it belongs to (train tasks carry it too)
    op: str
    draw: Callable[[random.Random], tuple[dict, Tree]]  # (args, starting tree)

    def sample(self, rng: random.Random) -> dict[str, Any]:
        args, start = self.draw(rng)
        return {"op": self.op, "args": args, "start": _shuffled(rng, start)}


FAMILIES: list[Family] = [
    Family("rename_ext", "core", "rename", _rename),
    Family("move_into_folder", "core", "move", _move),
    Family("filter_lines", "core", "filter", _filter),
    Family("count_errors", "core", "count_total", _count_total),
    Family("count_per_file", "heldout", "count_per_file", _count_per_file),  # an operation train never asks
    Family("concat_sorted", "core", "concat", _concat),
    Family("delete_matching", "core", "delete", _delete),
    # edge: unicode names and content, names with spaces, nothing to match, empty files, nested folders
    Family("rename_odd_names", "edge", "rename", lambda rng: _rename(rng, odd=True)),
    Family("move_odd_names", "edge", "move", lambda rng: _move(rng, odd=True)),
    Family("filter_unicode", "edge", "filter", lambda rng: _filter(rng, unicode=True)),
    Family("count_empty_logs", "edge", "count_total", lambda rng: _count_total(rng, empty=True)),
    Family("concat_empty_parts", "edge", "concat", lambda rng: _concat(rng, empty=True)),
    Family("delete_nested", "edge", "delete", lambda rng: _delete(rng, nested=True)),
    # failure modes: originals left behind or substring matches when moving, name order where the
    # number was asked, a last line without its newline, counting case-insensitively, overwriting
    # instead of appending, moving instead of copying
    Family("move_with_decoys", "failure_modes", "move", lambda rng: _move(rng, decoys=True)),
    Family("concat_numeric", "failure_modes", "concat", lambda rng: _concat(rng, numeric=True)),
    Family("filter_last_line", "failure_modes", "filter", lambda rng: _filter(rng, last_line=True)),
    Family("count_exact_case", "failure_modes", "count_total", lambda rng: _count_total(rng, exact_case=True)),
    Family("append_line", "failure_modes", "append", _append),
    Family("copy_backup", "failure_modes", "copy", _copy),
]


def expected_tree(spec: dict[str, Any]) -> Tree | None:
    """The tree the goal asks for, or None when the spec is unusable (colliding names, odd text)."""
    texts = list(spec["start"]) + list(spec["start"].values()) + [str(v) for v in spec["args"].values()]
    if any(_BAD_SEPARATORS & set(text) for text in texts):
        return None
    return OPS[spec["op"]].apply(spec["start"], spec["args"])


def prompt_of(spec: dict[str, Any]) -> str:
    listing = "".join(f"#   {path}\n" for path in sorted(spec["start"]))
    return f"# Files in the current folder:\n{listing}# Goal: {OPS[spec['op']].goal(spec['args'])}\nimport os\n"


def reference_of(spec: dict[str, Any]) -> str:
    return OPS[spec["op"]].reference(spec["args"])
