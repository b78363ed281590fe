"""The gate decision for people: one sentence (the model version's description) and a Markdown report
(the Prefect artifact of each iteration).

Pure: ``gate`` is data/reports/gate.json as stages/gate.py writes it; the versions, the MLflow run
and the DVC experiment come from the version step's summary (versioning.register.record_iteration).
Models are named by their registry versions (``v3``), never by fingerprints: that is the name a
person finds in the MLflow UI and uses in ``models:/closedloop-policy/3``.

Which figures count as a regression is the gate's rule (evaluation.gate.decide), restated in
:func:`allowed_drop`: a drop beyond both the slice tolerance and ``noise_z`` standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from closedloop.training.candidate_record import untrained_reason

MINUS = "\u2212"
MAX_NAMED = 3  # regressions named in the sentence; the table has them all


def pp(delta: float) -> str:
    """A difference of two rates in percentage points: "+8.4 pp", "−10.0 pp"."""
    text = f"{abs(delta) * 100:.1f} pp"
    return (MINUS if round(delta * 100, 1) < 0 else "+") + text


def points(rate: float) -> str:
    """A size in percentage points, unsigned: "5.0 pp"."""
    return f"{abs(rate) * 100:.1f} pp"


def version_label(version: str | None, fallback: str) -> str:
    return f"v{version}" if version else fallback


def allowed_drop(champion: Mapping[str, Any], candidate: Mapping[str, Any],
                 settings: Mapping[str, Any]) -> tuple[float, str]:
    """(how far pass@1 may fall, why that far) for one environment or slice, as the gate decides:
    (0.133, "2 standard errors (13.3 pp)") or (0.05, "slice tolerance 5.0 pp")."""
    tolerance = float(settings.get("slice_tolerance", 0.0))
    noise_z = float(settings.get("noise_z", 0.0))
    noise = noise_z * math.hypot(champion.get("se", 0.0), candidate.get("se", 0.0))
    if noise > tolerance:
        return noise, f"{noise_z:g} standard errors ({points(noise)})"
    return tolerance, f"slice tolerance {points(tolerance)}"


def comparisons(gate: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per environment, then per slice (sorted, as the gate checks them): {kind, name,
    champion, candidate, delta, allowed, why, verdict} with verdict "regressed", "within" or
    "missing" (a group the candidate's evaluation lacks)."""
    settings = gate.get("settings", {})
    confirmation = gate.get("confirmation") or {}
    rows = []
    for kind, group, prefix in (("environment", "envs", "env"), ("slice", "slices", "slice")):
        champion_groups = gate["champion"].get(group, {})
        candidate_groups = gate["candidate"].get(group, {})
        for name in sorted(champion_groups):
            champ, cand = champion_groups[name], candidate_groups.get(name)
            if cand is None:
                rows.append({"kind": kind, "name": name, "champion": champ["pass@1"], "candidate": None,
                             "delta": None, "allowed": None, "why": "", "verdict": "missing"})
                continue
            again = confirmation.get("groups", {}).get(f"{prefix} {name}")
            first = ""
            if again:  # the gate decided this group on its second measurement (evaluation.gate.decide)
                first = (f"; measured again at {confirmation['samples_per_task']} samples per task after "
                         f"{pp(cand['pass@1'] - champ['pass@1'])} at first")
                champ, cand = again["champion"], again["candidate"]
            delta = cand["pass@1"] - champ["pass@1"]
            allowed, why = allowed_drop(champ, cand, settings)
            rows.append({"kind": kind, "name": name, "champion": champ["pass@1"], "candidate": cand["pass@1"],
                         "delta": delta, "allowed": allowed, "why": why + first,
                         "verdict": "regressed" if delta < -allowed else "within"})
    return rows


def decision_sentence(gate: Mapping[str, Any], champion_version: str | None) -> str:
    """The decision and its reasons in a sentence or two (the candidate's version description), e.g.

    "Promoted: benchmark pass@1 0.350 vs champion v3 0.266 (+8.4 pp); no environment or slice
    regressed beyond tolerance."
    """
    champion = version_label(champion_version, "the champion")
    champ, cand = gate["champion"]["overall"]["pass@1"], gate["candidate"]["overall"]["pass@1"]
    against = f"champion {champion}" if champion_version else champion  # never "champion the champion"
    overall = f"benchmark pass@1 {cand:.3f} vs {against} {champ:.3f} ({pp(cand - champ)})"
    reason = untrained_reason(gate)
    if reason:
        return f"Held: the candidate was not trained ({reason}); it is {champion} unchanged, so it was not registered."
    rows = comparisons(gate)
    bad = [row for row in rows if row["verdict"] != "within"]
    named = [f"{row['name']} is missing from the candidate's evaluation" if row["verdict"] == "missing" else
             f"{row['name']} fell {row['champion']:.3f} \u2192 {row['candidate']:.3f} ({pp(row['delta'])}), "
             f"beyond its {row['why']}" for row in bad[:MAX_NAMED]]
    if len(bad) > MAX_NAMED:
        named.append(f"and {len(bad) - MAX_NAMED} more")
    regressions = "; ".join(named) if named else "no environment or slice regressed beyond tolerance"
    if gate["promote"]:
        return f"Promoted: {overall}; {regressions}."
    required = gate.get("settings", {}).get("min_improvement", 0.0)
    improved = cand - champ > required
    holds = [r for r in gate.get("reasons", []) if _holds(r)]  # what held it besides the figures
    also = f"; also held: {'; '.join(holds)}" if holds else ""
    if improved and not bad:
        others = holds or [r for r in gate.get("reasons", []) if not _is_figure_reason(r)]
        why = "; ".join(others) if others else "see the gate's reasons"
        return f"Held: {overall}; {why}."
    if improved:
        return f"Held: {regressions}; {overall}{also}."
    return f"Held: {overall} does not exceed the required improvement of {points(required)}; {regressions}{also}."


def _holds(reason: str) -> bool:
    """The gate's reasons that hold a candidate whatever its figures: a known reward hack its verifier
    still accepts, a sample of its batch people marked as reward hacking, a failing monitor named in
    monitors.block_promotion (evaluation.gate.decide words them)."""
    return (reason.startswith("known reward hack ") or " as reward hacking;" in reason
            or (reason.startswith("monitor ") and reason.endswith("; monitors.block_promotion holds the candidate")))


def warm_start_sentence(summary: Mapping[str, Any]) -> str:
    """The warm start's description: it became the first champion without a gate."""
    envs = ", ".join(f"{name} {figures['pass@1']:.3f}" for name, figures in sorted(summary.get("envs", {}).items()))
    return (f"Warm start (iteration 0), the first champion: benchmark pass@1 {summary['overall']['pass@1']:.3f}"
            + (f" ({envs})." if envs else "."))


def _is_figure_reason(reason: str) -> bool:
    """The gate's reasons about figures (rendered from the tables here); any other reason (a review,
    a monitor) is shown as the gate wrote it."""
    return reason.startswith(("overall pass@1 ", "env ", "slice "))


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Markdown that takes a person to the MLflow run: a link for a tracking server; for a local store
    (sqlite, a directory) the run id and the command that serves it."""
    parts = urlsplit(tracking_uri)
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")  # no credentials in a page people share
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        return f"[MLflow run `{run_id}`]({base}/#/experiments/{experiment_id}/runs/{run_id})"
    return (f"MLflow run `{run_id}` (experiment {experiment_id}) in `{tracking_uri}`: open it with "
            f"`mlflow ui --backend-store-uri {tracking_uri}`, then "
            f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}")


def report_link(summary: Mapping[str, Any]) -> str:
    """Markdown naming the iteration's report page (the MLflow artifact ``report-iteration-N.html``):
    a download link for a tracking server (it serves artifacts as attachments); for a local store the
    file itself, which a browser opens; or why it is missing."""
    iteration = summary.get("iteration")
    again = f"`closedloop report --iteration {iteration} --out report.html` writes it again"
    if not summary.get("report_artifact"):
        return f"report page: not logged ({summary.get('report_error', 'no page')}); {again}"
    uri = str(summary["report_artifact"])
    name = uri.rsplit("/", 1)[-1]
    parts, artifact = urlsplit(summary.get("tracking_uri", "")), urlsplit(uri)
    if parts.scheme in ("http", "https"):
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        return (f"report page: [{name}]({base}/get-artifact?path={name}&run_uuid={summary.get('run_id', '')}) "
                f"(an artifact of the MLflow run above; {again})")
    where = unquote(artifact.path) if artifact.scheme == "file" else uri
    return f"report page: `{where}` (artifact `{name}` of the MLflow run above; open the file in a browser, or {again})"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _table(rows: list[dict[str, Any]], kind: str, champion: str, candidate: str) -> list[str]:
    lines = [f"| {kind} | champion {champion} | candidate {candidate} | difference | may fall by | verdict |",
             "|---|---:|---:|---:|---:|---|"]
    for row in rows:
        if row["verdict"] == "missing":
            lines.append(f"| {row['name']} | {_rate(row['champion'])} | — | — | — | **missing** |")
            continue
        verdict = "**regressed**" if row["verdict"] == "regressed" else "within tolerance"
        lines.append(f"| {row['name']} | {_rate(row['champion'])} | {_rate(row['candidate'])} | {pp(row['delta'])} "
                     f"| {row['why']} | {verdict} |")
    return lines


def _figure(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def monitors_table(monitors: list[Mapping[str, Any]], holding: list[str] = ()) -> list[str]:
    """Markdown rows of the monitors' results (data/reports/monitors.json's ``monitors``): name and
    version, verdict (bold when it fails, "holds promotion" when monitors.block_promotion names it),
    value, thresholds, message."""
    lines = ["| monitor | verdict | value | warn above | fail above | message |", "|---|---|---:|---:|---:|---|"]
    for monitor in monitors:
        verdict = monitor["verdict"]
        shown = f"**{verdict}**" if verdict in ("fail", "warn") else verdict
        if monitor["name"] in holding:
            shown += " (holds promotion)"
        message = str(monitor.get("message", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {monitor['name']} v{monitor.get('version', '?')} | {shown} | {_figure(monitor.get('value'))} "
                     f"| {_figure(monitor.get('warn'))} | {_figure(monitor.get('fail'))} | {message} |")
    return lines


def monitors_markdown(report: Mapping[str, Any]) -> str:
    """The monitors' Prefect artifact (``monitors-iteration-N``) from data/reports/monitors.json."""
    monitors = report.get("monitors", [])
    holding, failing = list(report.get("holding", [])), list(report.get("failing", []))
    counts = {verdict: sum(1 for m in monitors if m["verdict"] == verdict) for verdict in ("ok", "warn", "fail", "skipped")}
    lines = [f"# Iteration {report.get('iteration')}: monitors", ""]
    if report.get("enabled") is False:
        lines.append("The monitors are off (monitors.enabled is false): every one was skipped.")
    else:
        compared = report.get("compared_with") or []
        lines.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, {counts['skipped']} skipped; "
                     + (f"compared with {', '.join(f'`{name}`' for name in compared)}." if compared
                        else "no earlier iteration to compare with."))
    if failing:
        lines += ["", "Failing: " + ", ".join(failing) + ". "
                  + (f"Holding promotion (monitors.block_promotion): {', '.join(holding)}." if holding
                     else "None of them is in monitors.block_promotion, so none holds promotion.")]
    lines += ["", *monitors_table(monitors, holding)]
    return "\n".join(lines) + "\n"


def rounds_table(rounds: Mapping[str, Any], champion: str, candidate: str) -> list[str]:
    """Episodes: overall pass@1 after each round (the gate decided on the last), and the correction rate."""
    count = len(rounds["candidate"]["pass@1"])
    lines = ["## Rounds", "", f"pass@1 on the hidden checks after each round of {count}; the gate decided on round {count}.",
             "", f"| after round | champion {champion} | candidate {candidate} |", "|---|---|---|"]
    for number in range(count):
        lines.append(f"| {number + 1} | {rounds['champion']['pass@1'][number]:.3f} | "
                     f"{rounds['candidate']['pass@1'][number]:.3f} |")
    lines.append(f"| failed first attempts fixed later | {rounds['champion']['correction_rate']:.3f} | "
                 f"{rounds['candidate']['correction_rate']:.3f} |")
    return lines


def gate_markdown(gate: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The iteration's gate report. ``summary`` is record_iteration's: ``iteration``, ``promoted``,
    ``model_version`` (the candidate's registry version, None when it was not registered),
    ``parent_version`` (the champion's), ``run_id``, ``experiment_id``, ``tracking_uri``,
    ``experiment`` and ``exp_rev`` (the DVC experiment and its commit)."""
    candidate = version_label(summary.get("model_version"), "(not registered)")
    champion = version_label(summary.get("parent_version"), "(unknown)")
    verdict = "promoted" if summary.get("promoted") else "held"
    title = f"# Iteration {summary['iteration']}: candidate {candidate} {verdict}"
    settings = gate.get("settings", {})
    champ, cand = gate["champion"]["overall"]["pass@1"], gate["candidate"]["overall"]["pass@1"]
    lines = [
        title, "",
        decision_sentence(gate, summary.get("parent_version")), "",
        f"- overall benchmark pass@1: champion {champion} {champ:.3f}, candidate {candidate} {cand:.3f} "
        f"({pp(cand - champ)}; it must rise by more than {points(settings.get('min_improvement', 0.0))})",
        f"- an environment or slice may fall by the slice tolerance {points(settings.get('slice_tolerance', 0.0))} or "
        f"{settings.get('noise_z', 0.0):g} standard errors of the difference, whichever is larger"
        + (f"; one that falls further is measured again, both models, at {settings['confirm_samples']} samples "
           "per task, and decided on those figures" if settings.get("confirm_samples") else ""),
    ]
    others = [r for r in gate.get("reasons", []) if not _is_figure_reason(r)]
    lines += [f"- {reason}" for reason in others]
    if summary.get("run_id"):
        link = run_link(summary.get("tracking_uri", ""), summary.get("experiment_id", ""), summary["run_id"])
        lines.append(f"- {link}")
    if summary.get("report_artifact") or summary.get("report_error"):
        lines.append(f"- {report_link(summary)}")
    rows = comparisons(gate)
    for kind, heading in (("environment", "Environments"), ("slice", "Slices")):
        lines += ["", f"## {heading}", "", *_table([r for r in rows if r["kind"] == kind], kind, champion, candidate)]
    if gate.get("rounds"):
        lines += ["", *rounds_table(gate["rounds"], champion, candidate)]
    if gate.get("monitors"):
        holding = list(gate.get("monitors_holding", []))
        lines += ["", "## Monitors", ""]
        if holding:
            lines += [f"Holding promotion (monitors.block_promotion): {', '.join(holding)}.", ""]
        lines += monitors_table(gate["monitors"], holding)
    lines += ["", "## Data versions", ""]
    if summary.get("experiment") and summary.get("exp_rev"):
        lines.append(f"DVC experiment `{summary['experiment']}` (commit `{summary['exp_rev'][:12]}`): "
                     f"`dvc exp apply {summary['experiment']}` restores this iteration's data, params and "
                     "models, and `dvc repro` then reproduces it.")
    else:
        lines.append("Not saved as a DVC experiment (versioning.save_experiments is off).")
    return "\n".join(lines) + "\n"
