"""Re-scoring stored batches: a batch as its DVC experiment saved it, scored again with today's
verifiers, and what changed.

A verifier that gets stricter (or looser) changes the meaning of every reward it gave before. The
batches are versioned, so the old rewards can be put beside today's: per environment and component,
how many samples changed reward or verdict, examples, and which source versions changed. The human
labels are read as the experiment saved them, so only the verifiers' and sources' changes show; with
nothing changed the re-scored rewards.jsonl is byte for byte the stored one (the same hashes).

Rescoring reads; it never writes into the batch, the workspace's DVC records or its cache (save that
DvcWorkspace.read_at fetches a missing or corrupt cache object again from the remote).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from closedloop import workspace as paths
from closedloop.envs.base import Task
from closedloop.io import json_objects
from closedloop.lineage.dvc import DvcWorkspace
from closedloop.rewards.pools import EnvPools
from closedloop.rewards.scoring import score_batch
from closedloop.stage_files import info_path

EXAMPLES = 5  # example samples per environment in a report
# The keys of a batch's feedback sources that decide its rewards. "human" (the labels' hash) is an
# input the batch fixed, and "validator:batch" checks a batch without scoring it.
SCORING_PREFIXES = ("verifier:", "component:", "source:", "combiner")
SAMPLE_FIELDS = ("sample_id", "task_id", "env", "completion")


class RescoreError(ValueError):
    """A stored batch cannot be re-scored as asked; the message names the experiment and the file."""


@dataclass(frozen=True)
class StoredBatch:
    """What the reward stage of one iteration read and wrote, as its experiment saved it."""

    experiment: str
    rev: str  # the experiment's git commit
    tasks: dict[str, dict]  # task_id -> task record
    samples: list[dict]
    rewards_text: str  # data/batch/rewards.jsonl, exactly as stored
    labels_text: str  # data/labels/human.jsonl ("" where the experiment recorded none)
    # grpo's on-policy rounds (data/batch/train_rounds.jsonl): samples the train stage drew and scored,
    # each with its reward row under "scored"; [] where the experiment has none
    rounds: tuple[dict, ...] = ()

    def rounds_batch(self) -> "StoredBatch | None":
        """The rounds' samples and their stored reward rows as a batch of their own (None when none)."""
        if not self.rounds:
            return None
        samples = [{key: row[key] for key in SAMPLE_FIELDS} for row in self.rounds]
        return StoredBatch(f"{self.experiment} (train rounds)", self.rev, self.tasks, samples,
                           jsonl_bytes(row["scored"] for row in self.rounds).decode("utf-8"), self.labels_text)


def newest_per_iteration(root: Path | str) -> dict[int, str]:
    """{iteration: its newest experiment} for every experiment named ``iter-NNN-<fingerprint>``
    (an iteration re-run is saved again: its newest save counts, as in versioning.resume.replay_versions)."""

    return DvcWorkspace(root).iteration_experiments()


def read_stored_batch(root: Path | str, experiment: str) -> StoredBatch:
    """Tasks, samples, rewards and human labels of ``experiment`` through DVC. DvcError naming the
    experiment (and the known ones) when there is none, or the file when it does not record one."""

    dvc = DvcWorkspace(root)
    rev = dvc.experiment_rev(experiment)
    texts = {relative: dvc.read_at(relative, experiment) for relative in (paths.TASKS, paths.SAMPLES, paths.REWARDS)}
    # Experiments saved before the labels were recorded have none: the batch saw no labels.
    labels = dvc.read_at(paths.HUMAN_LABELS, experiment) if dvc.locate(paths.HUMAN_LABELS, experiment) else ""
    fields = tuple(Task.__dataclass_fields__)
    tasks = {}
    for row in _rows(texts[paths.TASKS], experiment, paths.TASKS, fields):
        task = Task.from_record({key: row[key] for key in fields})
        tasks[task.task_id] = task.to_record()
    samples = _rows(texts[paths.SAMPLES], experiment, paths.SAMPLES, SAMPLE_FIELDS)
    unknown = sorted({s["task_id"] for s in samples} - set(tasks))
    if unknown:
        raise RescoreError(f"experiment {experiment!r}, {paths.SAMPLES}: samples for tasks not in "
                           f"{paths.TASKS}: {unknown[:3]}")
    rounds: list[dict] = []
    if dvc.locate(paths.TRAIN_ROUNDS, experiment):
        rounds = _rows(dvc.read_at(paths.TRAIN_ROUNDS, experiment), experiment, paths.TRAIN_ROUNDS,
                       (*SAMPLE_FIELDS, "scored"))
        unknown = sorted({r["task_id"] for r in rounds} - set(tasks))
        if unknown:
            raise RescoreError(f"experiment {experiment!r}, {paths.TRAIN_ROUNDS}: samples for tasks not in "
                               f"{paths.TASKS}: {unknown[:3]}")
    return StoredBatch(experiment, rev, tasks, samples, texts[paths.REWARDS], labels, tuple(rounds))


def _rows(text: str, experiment: str, relative: str, required: Iterable[str] = ()) -> list[dict]:
    rows = []
    for where, row in json_objects(text.splitlines(), f"experiment {experiment!r}, {relative}", RescoreError):
        missing = [key for key in required if key not in row]
        if missing:
            raise RescoreError(f"{where}: missing field(s) {missing}")
        rows.append(row)
    return rows


def rescore_rows(params: Any, batch: StoredBatch, verifiers: Any, env: str | None = None) -> list[dict]:
    """The reward rows today's sources give the batch's samples (those of ``env`` only, if given),
    through the reward stage's own scoring. ``verifiers`` is an open EnvPools of today's params."""
    import tempfile

    samples = [s for s in batch.samples if env is None or s["env"] == env]
    if env is not None and not samples:
        present = sorted({s["env"] for s in batch.samples})
        raise RescoreError(f"--env {env}: experiment {batch.experiment!r} has no samples of it "
                           f"(its environments: {', '.join(present) or 'none'})")
    # The labels as the experiment saved them, in a file of their own outside the workspace: the
    # human source reads a path, and the workspace's labels file is today's, not the batch's.
    with tempfile.TemporaryDirectory(prefix="closedloop-rescore-") as folder:
        labels = Path(folder) / "human.jsonl"
        labels.write_text(batch.labels_text, encoding="utf-8")
        rows, _ = score_batch(params, batch.tasks, samples, verifiers, labels)
    return rows


def jsonl_bytes(rows: Iterable[dict]) -> bytes:
    """The bytes closedloop.io.write_jsonl writes for ``rows`` (sorted keys, one object a line)."""
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def diff_report(batch: StoredBatch, new_rows: list[dict], env: str | None = None) -> dict[str, Any]:
    """What changed between the stored rows and ``new_rows`` (see the module docstring). With ``env``
    the stored rows, their bytes and their sources are that environment's lines only."""
    stored_lines = [line for line in batch.rewards_text.splitlines(keepends=True) if line.strip()]
    old_rows = [json.loads(line) for line in stored_lines]
    if env is not None:
        kept = [(line, row) for line, row in zip(stored_lines, old_rows) if row.get("env") == env]
        stored_lines, old_rows = [line for line, _ in kept], [row for _, row in kept]
    old_by_id = {row["sample_id"]: row for row in old_rows}
    stored = "".join(stored_lines).encode("utf-8")
    rescored = jsonl_bytes(new_rows)
    envs: dict[str, dict[str, Any]] = {}
    for new in new_rows:
        old = old_by_id.get(new["sample_id"], {})
        figures = envs.setdefault(new["env"], {"samples": 0, "changed_reward": 0, "changed_verdict": 0,
                                               "components": {}, "examples": []})
        figures["samples"] += 1
        reward_changed = old.get("reward") != new["reward"]
        verdict_changed = (old.get("passed"), old.get("status")) != (new.get("passed"), new.get("status"))
        figures["changed_reward"] += reward_changed
        figures["changed_verdict"] += verdict_changed
        old_components, new_components = old.get("components", {}), new["components"]
        for name in sorted(set(old_components) | set(new_components)):
            counts = figures["components"].setdefault(name, {"changed": 0})
            counts["changed"] += old_components.get(name) != new_components.get(name)
        if (reward_changed or verdict_changed) and len(figures["examples"]) < EXAMPLES:
            figures["examples"].append({
                "sample_id": new["sample_id"],
                "reward": [old.get("reward"), new["reward"]],
                "passed": [old.get("passed"), new.get("passed")],
                "status": [old.get("status"), new.get("status")],
                "components": {name: [old_components.get(name), new_components.get(name)]
                               for name in sorted(set(old_components) | set(new_components))
                               if old_components.get(name) != new_components.get(name)},
            })
    return {
        "experiment": batch.experiment,
        "rev": batch.rev,
        "env": env,
        "samples": len(new_rows),
        "changed_reward": sum(f["changed_reward"] for f in envs.values()),
        "changed_verdict": sum(f["changed_verdict"] for f in envs.values()),
        "envs": dict(sorted(envs.items())),
        "sources": source_changes(_versions(old_rows), _versions(new_rows)),
        "hashes": {
            "sha256": {"stored": hashlib.sha256(stored).hexdigest(), "rescored": hashlib.sha256(rescored).hexdigest()},
            # The whole file's md5 is DVC's hash of it (dvc.lock): the stored one names the cached object.
            "md5": {"stored": hashlib.md5(stored).hexdigest(), "rescored": hashlib.md5(rescored).hexdigest()},
            "identical": stored == rescored,
        },
    }


def _versions(rows: Iterable[dict]) -> dict[str, list[str]]:
    """{source key: the versions the rows name for it} (one, unless the batch was scored piecemeal)."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        for key, version in row.get("feedback_sources", {}).items():
            seen.setdefault(key, set()).add(version)
    return {key: sorted(versions) for key, versions in sorted(seen.items())}


def source_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Keys whose version differs (``{key: [old, new]}``), and keys only one side names."""
    return {
        "changed": {key: [old[key], new[key]] for key in sorted(set(old) & set(new)) if old[key] != new[key]},
        "added": {key: new[key] for key in sorted(set(new) - set(old))},
        "removed": {key: old[key] for key in sorted(set(old) - set(new))},
    }


def rescore(root: Path | str, params: Any, experiments: list[str], env: str | None = None) -> list[dict]:
    """A diff report per experiment, in order, each batch scored with ``params``' sources (one set of
    sandbox pools for all). Every batch is read before the first is scored, so a bad name fails at once.
    A batch whose train stage ran grpo's on-policy rounds has their samples re-scored too, reported
    under "train_rounds" (stored reward rows against today's, as for rewards.jsonl)."""

    batches = [read_stored_batch(root, name) for name in experiments]
    reports = []
    with EnvPools(params) as verifiers:
        for batch in batches:
            report = diff_report(batch, rescore_rows(params, batch, verifiers, env), env)
            rounds = batch.rounds_batch()
            if rounds is not None and (env is None or any(s["env"] == env for s in rounds.samples)):
                report["train_rounds"] = diff_report(rounds, rescore_rows(params, rounds, verifiers, env), env)
            reports.append(report)
    return reports


# -- which stored batches today's verifiers would score differently (closedloop status) -------------
def stale_batches(root: Path | str, today: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(experiment, the scoring sources whose version changed) for each stored iteration's newest
    experiment whose reward stage recorded (metrics/info/reward.json, git-tracked: no DVC read)
    versions other than ``today`` (rewards.sources.feedback_sources). A source only one side has (an
    environment added or dropped since) is not a change of the batch's scoring. Oldest first."""

    dvc = DvcWorkspace(root)
    found = []
    for name in newest_per_iteration(root).values():
        text = dvc.git_text_at(info_path("reward"), name)
        try:
            recorded = json.loads(text).get("feedback_sources", {}) if text else {}
        except ValueError:
            recorded = {}  # a file cut short says nothing about its versions
        changed = scoring_changes(recorded, today)
        if changed:
            found.append((name, changed))
    return found


def scoring_changes(recorded: dict[str, str], today: dict[str, str]) -> list[str]:
    """The scoring source keys whose versions differ; a component is left out where its verifier is
    named already (the verifier's version covers its environment's settings and code)."""
    changed = sorted(key for key in set(recorded) & set(today)
                     if key.startswith(SCORING_PREFIXES) and recorded[key] != today[key])
    verifiers = {key.removeprefix("verifier:") for key in changed if key.startswith("verifier:")}
    return [key for key in changed
            if not (key.startswith("component:") and key.removeprefix("component:").split("/")[0] in verifiers)]


# -- the readable table -------------------------------------------------------------------------
def report_text(report: dict[str, Any]) -> str:
    """A report as a person reads it on stdout."""
    head = (f"rescore {report['experiment']} (commit {report['rev'][:12]})"
            + (f", env {report['env']}" if report["env"] else "")
            + f" with today's verifiers: {report['samples']} samples, {report['changed_reward']} changed reward, "
              f"{report['changed_verdict']} changed verdict")
    lines = [head, f"  {'env':<12} {'samples':>7} {'reward':>7} {'verdict':>7}  components changed"]
    for env, figures in report["envs"].items():
        components = ", ".join(f"{name} {c['changed']}" for name, c in figures["components"].items() if c["changed"])
        lines.append(f"  {env:<12} {figures['samples']:>7} {figures['changed_reward']:>7} "
                     f"{figures['changed_verdict']:>7}  {components or '-'}")
    for env, figures in report["envs"].items():
        for example in figures["examples"]:
            old_reward, new_reward = example["reward"]
            lines.append(f"    {example['sample_id']}: reward {_num(old_reward)} -> {_num(new_reward)}, "
                         f"{_verdict(example, 0)} -> {_verdict(example, 1)}")
    sources = report["sources"]
    if sources["changed"]:
        lines.append("  sources changed: " + "; ".join(
            f"{key} {','.join(old)} -> {','.join(new)}" for key, (old, new) in sources["changed"].items()))
    else:
        lines.append("  sources changed: none")
    for kind in ("added", "removed"):
        if sources[kind]:
            lines.append(f"  sources {kind}: " + ", ".join(sources[kind]))
    hashes = report["hashes"]
    same = "identical" if hashes["identical"] else "different"
    for algorithm in ("sha256", "md5"):
        lines.append(f"  rewards.jsonl {algorithm:<6} stored {hashes[algorithm]['stored']}  "
                     f"rescored {hashes[algorithm]['rescored']}  ({same})")
    rounds = report.get("train_rounds")
    if rounds:
        lines.append(f"  train rounds (grpo on-policy): {rounds['samples']} samples, {rounds['changed_reward']} changed "
                     f"reward, {rounds['changed_verdict']} changed verdict; their reward rows "
                     f"{'identical' if rounds['hashes']['identical'] else 'different'}")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def _verdict(example: dict, side: int) -> str:
    passed, status = example["passed"][side], example["status"][side]
    return f"{'passed' if passed else 'not passed'} ({status})" if status is not None else "no row"
