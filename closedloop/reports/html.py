"""The report page's HTML (closedloop/reports/page.py loads its data): sections of escaped text and
tables, figures from closedloop/reports/page_plots.py embedded as base64 PNG. No templates, no scripts,
no external resources: the file alone is the page."""

from __future__ import annotations

import base64
from html import escape
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from closedloop import workspace as paths
from closedloop.reports import page_plots as report_plots
from closedloop.reports.gate_report import comparisons, decision_sentence, pp, version_label

# The DVC-tracked files of an iteration shown in the lineage, in DAG order; the rest of its outs follow.
LINEAGE_FIRST = (paths.TASKS, paths.SAMPLES, paths.REWARDS, paths.GRADED, paths.FIXES, paths.TRAIN_SET,
                 paths.CANDIDATE, paths.EVALUATION, paths.GATE, paths.CHAMPION, paths.BENCHMARK_TASKS)

VERDICT_CLASS = {"ok": "ok", "warn": "warn", "fail": "fail", "skipped": "skip"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2127;margin:0;background:#f4f5f7}
main{max-width:1080px;margin:0 auto;padding:24px 28px 48px;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:30px 0 8px;border-bottom:1px solid #dde1e6;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.sub{color:#5b6470;margin:0 0 14px}
.banner{padding:12px 16px;border-radius:6px;margin:14px 0;font-size:15px}
.promoted{background:#e6f4ea;border-left:6px solid #2e7d32}.held{background:#fdecea;border-left:6px solid #c62828}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}th,td{padding:4px 10px;border-bottom:1px solid #e6e8eb;text-align:left;vertical-align:top}
th{background:#f0f2f5}td:first-child{white-space:nowrap}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f0f2f5;padding:1px 4px;border-radius:3px;word-break:break-all}
.v{font-weight:600;padding:1px 8px;border-radius:10px;font-size:12px}.ok{background:#e6f4ea;color:#1e6b2a}
.warn{background:#fff4e0;color:#8a5300}.fail{background:#fdecea;color:#b3261e}.skip{background:#eceff1;color:#546e7a}
img{max-width:100%;height:auto;display:block;margin:6px 0}.note{color:#5b6470}
ul{margin:4px 0 8px;padding-left:22px}
"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else escape(str(value))


def _section(title: str, *body: str) -> str:
    return f"<section><h2>{escape(title)}</h2>{''.join(body)}</section>"


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """``rows`` are HTML already (each cell escaped by its caller)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header) if any(header) else ""
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{f'<thead><tr>{head}</tr></thead>' if head else ''}<tbody>{body}</tbody></table>"


# -- sections --------------------------------------------------------------------------------------------
def _gate(data) -> str:
    gate = data.gate
    if not gate:
        return _section("Gate decision", '<p class="note">No gate decision was recorded for this iteration.</p>')
    parent = data.mlflow.get("parent_version")
    promoted = bool(gate.get("promote")) and gate.get("trained", True)
    # The sentence starts with the decision ("Promoted: …" / "Held: …"); the banner's colour repeats it.
    banner = (f'<div class="banner {"promoted" if promoted else "held"}">'
              f'{_strong_decision(decision_sentence(gate, parent))}</div>')
    champion = "champion" + (f" v{parent}" if parent else "")
    candidate = "candidate" + (f" v{data.mlflow['model_version']}" if data.mlflow.get("model_version") else "")
    rows = comparisons(gate)
    tables = []
    for kind, heading in (("environment", "Per environment"), ("slice", "Per slice")):
        mine = [r for r in rows if r["kind"] == kind]
        body = [[escape(r["name"]), _num(r["champion"]), _num(r["candidate"]),
                 "—" if r["delta"] is None else escape(pp(r["delta"])), escape(r["why"] or "—"),
                 f'<span class="v {"fail" if r["verdict"] != "within" else "ok"}">{escape(r["verdict"])}</span>']
                for r in mine]
        table = _table([kind, champion, candidate, "difference", "may fall by", "verdict"], body, numeric={1, 2, 3})
        if kind == "slice":  # many rows: folded unless one of them is why the candidate was held
            bad = sum(r["verdict"] != "within" for r in mine)
            table = (f"<details{' open' if bad else ''}><summary><strong>{heading}</strong> ({len(mine)} slices, "
                     f"{bad} regressed or missing)</summary>{table}</details>")
        else:
            table = f"<h3>{heading}</h3>{table}"
        tables.append(table)
    reasons = "".join(f"<li>{escape(reason)}</li>" for reason in gate.get("reasons", []))
    return _section("Gate decision", banner, *tables,
                    f"<details><summary>The gate's reasons, as it wrote them ({len(gate.get('reasons', []))})"
                    f"</summary><ul>{reasons}</ul></details>")


def _strong_decision(sentence: str) -> str:
    head, colon, rest = sentence.partition(":")
    return f"<strong>{escape(head)}{colon}</strong>{escape(rest)}" if colon else escape(sentence)


def _monitors(data) -> str:
    report = data.monitors
    if not report:
        return _section("Monitors", '<p class="note">The monitors did not run for this iteration '
                        "(no data/reports/monitors.json in its records).</p>")
    rows = []
    for m in report.get("monitors", []):
        verdict = str(m.get("verdict", ""))
        rows.append([f"<code>{escape(str(m.get('name', '')))}</code>", escape(str(m.get("version", ""))),
                     f'<span class="v {VERDICT_CLASS.get(verdict, "skip")}">{escape(verdict)}</span>',
                     _num(m.get("value")), _num(m.get("warn")), _num(m.get("fail")), escape(str(m.get("message", "")))])
    holding = report.get("holding") or []
    failing = report.get("failing") or []
    summary = (f"<p><strong>{len(failing)}</strong> failing"
               + (f" ({escape(', '.join(failing))})" if failing else "")
               + (f"; holding promotion: <strong>{escape(', '.join(holding))}</strong>" if holding else
                  "; none holds promotion") + ".</p>")
    return _section("Monitors", summary, _table(["monitor", "version", "verdict", "value", "warn", "fail", "message"],
                                                rows, numeric={3, 4, 5}))


def _pass_at_1(data) -> str:
    if not data.history:
        return _section("Benchmark pass@1 across iterations", '<p class="note">No benchmark evaluation recorded.</p>')
    labels = {row["iteration"]: ("warm\nstart" if row["iteration"] == 0 else str(row["iteration"]))
              for row in data.history}
    if data.mlflow.get("model_version"):
        labels[data.iteration] = f"{data.iteration}\nv{data.mlflow['model_version']}"
    champion = [(r["iteration"], r["champion"]) for r in data.history
                if r["name"] == "overall" and r["champion"] is not None]
    envs: dict[str, list] = {}
    slices: dict[str, list] = {}
    for row in data.history:
        target = slices if "/" in row["name"] else envs
        target.setdefault(row["name"], []).append((row["iteration"], row["candidate"]))
    figures = [_img(report_plots.pass_at_1_lines(envs, champion, "per environment (and overall)", labels),
                    "benchmark pass@1 per environment across iterations")]
    if slices:
        figures.append(_img(report_plots.pass_at_1_lines(slices, [], "per slice (colour: environment; line: slice)", labels),
                            "benchmark pass@1 per slice across iterations"))
    iterations = sorted({r["iteration"] for r in data.history})
    overall = {r["iteration"]: r for r in data.history if r["name"] == "overall"}
    rows = [[escape(labels[i].replace("\n", " ")), _num(overall[i]["candidate"]) if i in overall else "—",
             _num(overall[i]["champion"]) if i in overall else "—"] for i in iterations]
    return _section("Benchmark pass@1 across iterations", *figures,
                    _table(["iteration", "candidate pass@1", "champion pass@1 (compared with)"], rows, {1, 2}))


def _rounds(data) -> str:
    """Episodes (sample.rounds > 1): pass@1 after each round, the candidate's per environment, beside the
    champion's overall; nothing for single attempts."""
    evaluation = data.evaluation or {}
    rounds = evaluation.get("candidate", {}).get("rounds")
    if not rounds:
        return ""
    by_round = rounds["by_round"]
    points = {"overall": [(r, s["overall"]["pass@1"]) for r, s in enumerate(by_round, start=1)]}
    for env in by_round[0]["envs"]:
        points[env] = [(r, s["envs"][env]["pass@1"]) for r, s in enumerate(by_round, start=1)]
    champion_rounds = evaluation.get("champion", {}).get("rounds", {}).get("by_round", [])
    champion = [(r, s["overall"]["pass@1"]) for r, s in enumerate(champion_rounds, start=1)]
    labels = {r: str(r) for r in range(1, len(by_round) + 1)}
    figure = _img(report_plots.pass_at_1_lines(points, champion, "candidate pass@1 after each round", labels,
                                               xlabel="round of the episode"),
                  "benchmark pass@1 after each round of the episodes")
    rows = [[str(r), _num(by_round[r - 1]["overall"]["pass@1"]),
             _num(champion[r - 1][1]) if r <= len(champion) else "—"] for r in labels]
    correction = rounds["correction_rate"]
    note = (f"<p>The gate decided on round {len(by_round)}. Of the candidate's failed first attempts "
            f"{correction['fixed']} of {correction['failed_first']} were fixed in a later round "
            f"({_num(correction['rate'])}).</p>")
    return _section("Episodes: pass@1 after each round", note, figure,
                    _table(["after round", "candidate pass@1", "champion pass@1"], rows, {1, 2}))


def _batch(data) -> str:
    if not data.rewards:
        return _section("This iteration's batch", '<p class="note">No reward rows recorded.</p>')
    values: dict[str, dict[str, list[float]]] = {}
    for row in data.rewards:
        for name, value in (row.get("components") or {}).items():
            if isinstance(value, (int, float)):
                values.setdefault(name, {}).setdefault(row["env"], []).append(float(value))
    passed = {row["sample_id"]: bool(row.get("passed")) for row in data.rewards if "sample_id" in row}
    tokens = all("completion_tokens" in s for s in data.samples)
    lengths: dict[str, dict[str, list[int]]] = {}
    for sample in data.samples:
        if sample.get("sample_id") not in passed:
            continue
        size = sample["completion_tokens"] if tokens else len(sample.get("completion", ""))
        kind = "passed" if passed[sample["sample_id"]] else "failed"
        lengths.setdefault(sample["env"], {}).setdefault(kind, []).append(int(size))
    n_passed = sum(passed.values())
    parts = [f"<p>{len(data.samples)} samples, {len(data.rewards)} reward rows, {n_passed} passed "
             f"(read from {escape(data.read_from)}).</p>"]
    if values:
        parts.append(_img(report_plots.component_histograms(values), "reward components per environment"))
    if lengths:
        parts.append(_img(report_plots.length_histograms(lengths, "tokens" if tokens else "characters"),
                          "completion length of passed and failed samples"))
    return _section("This iteration's batch", *parts)


def _run_link(found: dict[str, Any]) -> str:
    """The MLflow run: a link for a tracking server; for a local store its id and the command that serves it."""
    uri, experiment_id, run_id = found.get("tracking_uri", ""), found.get("experiment_id", ""), found["run_id"]
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")  # no credentials in the page
        url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")) + \
            f"/#/experiments/{experiment_id}/runs/{run_id}"
        return f'<a href="{escape(url)}">{escape(found.get("run_name") or run_id)}</a> (<code>{escape(run_id)}</code>)'
    return (f"<code>{escape(run_id)}</code> {escape(found.get('run_name', ''))} in <code>{escape(uri)}</code>; "
            f"open it with <code>mlflow ui --backend-store-uri {escape(uri)}</code>, experiment {escape(experiment_id)}")


def _lineage(data) -> str:
    found = data.mlflow
    if found.get("run_id"):
        run = _run_link(found)
    else:
        run = escape(f"not found ({found['error']})" if found.get("error") else "not found in the tracking store")
    version = found.get("model_version")
    registered = found.get("registered_model", "")
    rows = [
        ["DVC experiment", f"<code>{escape(data.experiment)}</code> (commit <code>{escape(data.exp_rev[:12])}</code>); "
         f"<code>dvc exp apply {escape(data.experiment)}</code> restores it" if data.experiment
         else "not saved as a DVC experiment"],
        ["git commit it ran on", f"<code>{escape(data.git_rev[:12] or '—')}</code>"],
        ["batch read from", escape(data.read_from)],
        ["MLflow run", run],
        ["model version", escape(f"{registered} v{version}" if version else "not registered")
         + (f" (compared with champion v{escape(str(found['parent_version']))})" if found.get("parent_version") else "")],
    ]

    hashes = [[f"<code>{escape(path)}</code>", f"<code>{escape(md5)}</code>"] for path, md5 in data.hashes.items()]
    shown = sum(path in LINEAGE_FIRST for path in data.hashes)
    return _section("Lineage of the candidate model", _table(["", ""], rows),
                    "<h3>Feedback sources that scored the batch</h3>", _sources(data.sources),
                    "<h3>Data versions (DVC hashes as this iteration recorded them)</h3>",
                    _table(["path", "md5"], hashes[:shown]),
                    f"<details><summary>the other {len(hashes) - shown} DVC-tracked outputs</summary>"
                    + _table(["path", "md5"], hashes[shown:]) + "</details>" if len(hashes) > shown else "")


def _sources(sources: dict[str, list[str]]) -> str:
    """Verifiers and other sources one row each; an environment's reward components (named
    ``component:<env>/<name>``) folded into one row per environment, grouped by version."""
    if not sources:
        return '<p class="note">none recorded</p>'
    rows, components = [], {}
    for name, versions in sources.items():
        kind, _, rest = name.partition(":")
        if kind == "component" and "/" in rest:
            env, component = rest.split("/", 1)
            components.setdefault(env, {}).setdefault(", ".join(versions), []).append(component)
        else:
            rows.append([f"<code>{escape(name)}</code>", escape(", ".join(versions))])
    for env, by_version in sorted(components.items()):
        text = "; ".join(f"{escape(', '.join(names))} <code>{escape(version)}</code>"
                         for version, names in sorted(by_version.items()))
        rows.append([f"components of <code>{escape(env)}</code>", text])
    return _table(["source", "version"], rows)


def render(data) -> str:
    """The whole page as one HTML string."""
    title = f"closedloop — iteration {data.iteration}"
    subtitle = (f"Candidate {version_label(data.mlflow.get('model_version'), '(not registered)')} · "
                + (f"DVC experiment {data.experiment}" if data.experiment else "not saved as a DVC experiment"))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{escape(title)}</h1><p class=\"sub\">{escape(subtitle)}</p>"
            + _gate(data) + _rounds(data) + _monitors(data) + _pass_at_1(data) + _batch(data) + _lineage(data)
            + '<p class="note">Written by <code>closedloop report</code>.</p></main></body></html>\n')
