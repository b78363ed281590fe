"""Bytes on disk after the warm start and one iteration, and how many copies of the weights they hold.

The loop's versioning steps run for real over a fresh workspace (``closedloop init``): the stage
outputs are recorded with ``DvcWorkspace.commit`` as ``run_recorded`` does, the champion is made by
``record.close_loop`` (``replace_dir`` + ``dvc add``), the promote stage runs as it is, the
workspace is pushed to its DVC remote and saved as an experiment, and each model version is
logged and registered with ``tracking.log_and_register_model``. Only the model-making stages are
stand-ins: the warm start saves a freshly built model (``save_policy``, as the stage does, through
a ``*.staging`` folder and a rename) and train saves it with every weight changed, so the
candidate shares no bytes with the champion, as after real training. The gate promotes.

Two settings of the versioning, on the same steps:

- before: ``cache.type copy`` and the full model logged to MLflow for every version (the
  behaviour before links and references: ``tracking.log_weights: true``);
- after: the cache type ``closedloop init`` picks (links) and versions registered by reference.

Sizes are counted like ``du``: a hard-linked file once (by inode), allocated blocks; apparent sizes
(every path's length) are printed too. "Copies of the weights": each file (once per inode) that is
one version's ``model.safetensors`` byte for byte counts 1; a weights file written again by another
tool (MLflow's transformers flavor re-saves the model) counts its size over that file's; given in
total and per model version (two versions: the warm start and the candidate).

    python benchmarks/disk.py                      # the built-in tiny model (defaults), ~30 s
    python benchmarks/disk.py --model qwen2-0.5b   # a Qwen2-architecture model (~0.4B), ~3 min, ~8 GB
    python benchmarks/disk.py --model all --keep /tmp/disk-bench
    python benchmarks/disk.py --measure WORKSPACE    # count a workspace the loop made
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Where bytes are attributed: a file linked from several places counts in the first that holds it.
PLACES = (
    ("dvc cache", (".dvc/cache",)),
    ("dvc remote", (".dvc-remote",)),
    ("mlflow", ("mlartifacts", "mlflow.db")),
    ("model folders", ("data/champion", "data/models")),
    ("git", (".git",)),
)
OTHER = "other"
WEIGHTS_FILE = "model.safetensors"
QWEN2 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=True)


# -- models ---------------------------------------------------------------------------------------
def builtin_model(root: Path):
    """The built-in policy with the default params, built as the warm start builds it."""
    from closedloop.config import load_params
    from closedloop.models.builtin import build_builtin_model, train_tokenizer
    from closedloop.stages.warmstart import mixed_tasks

    params = load_params(root)
    tasks = mixed_tasks(params, params.warmstart.tokenizer_corpus_tasks, "tokenizer")
    tokenizer = train_tokenizer([t.prompt + t.reference for t in tasks], params.model.builtin.vocab_size,
                                params.model.builtin.split_digits)
    return build_builtin_model(params.model.builtin, tokenizer, seed=0), tokenizer


def qwen2_model(root: Path):
    """A Qwen2-architecture causal LM from a config (random init, bfloat16; nothing downloaded) with a
    word-level tokenizer built here."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = ["<unk>", "<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(QWEN2["vocab_size"] - 4)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN2, bos_token_id=2, eos_token_id=3, pad_token_id=1, torch_dtype="bfloat16")
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    return model.eval(), tokenizer


MODELS = {"tiny": builtin_model, "qwen2-0.5b": qwen2_model}


def changed(model):
    """Every weight moved, as training moves them: the candidate shares no bytes with its parent."""
    import torch

    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    return model


# -- the loop's versioning steps --------------------------------------------------------------------
def version_like_the_loop(root: Path, make_model, log_weights: bool) -> dict:
    from closedloop.config import load_params
    from closedloop.io import write_json, write_jsonl
    from closedloop.lineage import tracking
    from closedloop.lineage.dvc import DvcWorkspace
    from closedloop.models.loading import save_policy
    from closedloop.stages.recorded import run_recorded
    from closedloop.versioning import loop, register
    from closedloop.workspace import Workspace

    ws, dvc = Workspace.at(root), DvcWorkspace(root)
    params = load_params(root)
    params.tracking.log_weights = log_weights
    seconds: dict[str, float] = {}

    def save_model(model, tokenizer, path: Path) -> None:  # as the warmstart and train stages save
        staging = path.with_name(path.name + ".staging")
        save_policy(model, tokenizer, staging)
        shutil.rmtree(path, ignore_errors=True)
        staging.rename(path)

    def recorded(stage: str, files: dict[Path, object]) -> None:  # the stage's small outputs + its commit
        for path, data in files.items():
            (write_jsonl(path, data) if path.suffix == ".jsonl" else write_json(path, data))
        from closedloop.pipeline import stage_spec

        for small in (*stage_spec(stage).metrics, *stage_spec(stage).files):  # metrics, timing, info, plots
            write_json(ws.path(small), {})
        dvc.commit(stage)

    def timed(name: str, step):
        started = time.perf_counter()
        result = step()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        return result

    task = {"task_id": "t0", "env": "code", "slice": "core", "kind": "k", "prompt": "p", "reference": "r"}
    model, tokenizer = make_model(root)
    # iteration 0: the warm start flow
    recorded("benchmark", {ws.benchmark_tasks: [task]})
    save_model(model, tokenizer, ws.warmstart_model)
    timed("dvc commit (models)", lambda: recorded("warmstart", {ws.references: [task], ws.warmstart_eval: {}}))
    timed("close loop (replace_dir + dvc add)", lambda: loop.close_loop(ws))
    timed("dvc push", lambda: register.push(ws, params))
    tracking.configure(ws.root, params.tracking.uri, params.tracking.experiment)
    run0 = tracking.log_iteration(iteration=0, run_name="iteration-000-warmstart", params={}, metrics={},
                                  tags={}, rewards=[], datasets=[], artifacts=[], stage_seconds={})
    hashes = dvc.lock_hashes()
    timed("mlflow register", lambda: tracking.log_and_register_model(
        run_id=run0, model_dir=ws.warmstart_model, registered_model=params.tracking.registered_model,
        tags={"iteration": "0", "dvc.model": hashes[ws.warmstart_model.relative_to(root).as_posix()]},
        reference=dvc.reference("data/models/warmstart"), log_weights=log_weights))

    # iteration 1: the iteration flow
    timed("close loop (replace_dir + dvc add)", lambda: loop.close_loop(ws))
    recorded("generate", {ws.tasks: [task]})
    recorded("sample", {ws.samples: [{"sample_id": "s0"}], ws.sample_timings: [{}], ws.rollouts: [{}]})
    recorded("reward", {ws.rewards: [{"sample_id": "s0", "reward": 1.0}]})
    recorded("grade", {ws.graded: [{"sample_id": "s0", "reward": 1.0}], ws.fixes: [], ws.train_set: [task]})
    recorded("validate", {ws.validation_report: {"success": True}})
    save_model(changed(model), tokenizer, ws.candidate)
    timed("dvc commit (models)", lambda: recorded("train", {}))
    recorded("evaluate", {ws.evaluation: {}})
    recorded("gate", {ws.gate: {"promote": True}})
    timed("promote stage + dvc commit", lambda: run_recorded("promote", root, params))
    timed("dvc push", lambda: register.push(ws, params))
    exp_rev = timed("dvc exp save", lambda: dvc.exp_save("iter-001-bench"))
    run1 = tracking.log_iteration(iteration=1, run_name="iteration-001", params={}, metrics={}, tags={},
                                  rewards=[], datasets=[], artifacts=[], stage_seconds={})
    hashes = dvc.lock_hashes()
    timed("mlflow register", lambda: tracking.log_and_register_model(
        run_id=run1, model_dir=ws.candidate, registered_model=params.tracking.registered_model,
        tags={"iteration": "1", "dvc.model": hashes["data/models/candidate"], "dvc.exp_rev": exp_rev},
        reference=dvc.reference("data/models/candidate"), log_weights=log_weights))
    return {"seconds": seconds, "cache_type": dvc.cache_type() or "(DVC default)",
            "weights": [ws.warmstart_model / WEIGHTS_FILE, ws.candidate / WEIGHTS_FILE]}


# -- counting -------------------------------------------------------------------------------------
def place_of(relative: str) -> str:
    for name, prefixes in PLACES:
        if any(relative == p or relative.startswith(p + "/") for p in prefixes):
            return name
    return OTHER


def measure(root: Path, weights: list[Path]) -> dict:
    """Per place: apparent bytes, allocated bytes (an inode once, in the first place that holds it),
    and the copies of each version's weights file."""
    head = 1 << 20
    versions = [(p.stat().st_size, p.read_bytes()[:head]) for p in weights]
    files: dict[str, list[tuple[str, os.stat_result]]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for filename in filenames:
            path = Path(dirpath) / filename
            st = path.lstat()
            if not path.is_symlink():
                files.setdefault(place_of(path.relative_to(root).as_posix()), []).append((str(path), st))
    order = [name for name, _ in PLACES] + [OTHER]
    seen: set[tuple[int, int]] = set()
    out = {name: {"apparent": 0, "disk": 0, "weights_copies": 0.0} for name in order}
    for name in order:
        for path, st in files.get(name, []):
            out[name]["apparent"] += st.st_size
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            out[name]["disk"] += st.st_blocks * 512
            out[name]["weights_copies"] += weights_copies(path, st.st_size, versions, head)
    out["total"] = {key: sum(out[name][key] for name in order) for key in ("apparent", "disk", "weights_copies")}
    out["weights_bytes"] = versions[0][0]
    return out


def weights_copies(path: str, size: int, versions: list[tuple[int, bytes]], head: int) -> float:
    """1 for a file holding a version's weights file byte for byte (a workspace file, a DVC object);
    for a weights file written again by someone else (MLflow's flavor re-saves the model, and its
    header can differ), its share of one version's size."""
    for version_size, start in versions:
        if size == version_size:
            with open(path, "rb") as handle:
                if handle.read(head) == start:
                    return 1.0
    if path.endswith((".safetensors", ".bin", ".pt")) and size > versions[0][0] / 10:
        return size / versions[0][0]
    return 0.0


def run(model: str, mode: str, keep: Path | None) -> dict:
    import yaml

    from closedloop.scaffold import init_workspace

    base = Path(tempfile.mkdtemp(prefix=f"disk-{model}-{mode}-", dir=keep))
    root = base / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump({}))
    init_workspace(root)
    if mode == "before":
        subprocess.run([sys.executable, "-m", "dvc", "config", "--local", "cache.type", "copy"], cwd=root, check=True)
    started = time.perf_counter()
    result = version_like_the_loop(root, MODELS[model], log_weights=mode == "before")
    result["wall_s"] = time.perf_counter() - started
    result["sizes"] = measure(root, result.pop("weights"))
    result["workspace"] = str(root)
    if keep is None:
        shutil.rmtree(base, ignore_errors=True)
    return result


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def report(model: str, results: dict[str, dict]) -> None:
    order = [name for name, _ in PLACES] + [OTHER, "total"]
    first = next(iter(results.values()))
    print(f"\n== {model}: one model.safetensors = {mb(first['sizes']['weights_bytes'])} MB; "
          f"after the warm start + 1 iteration (2 model versions) ==")
    print(f"{'':<14}" + "".join(f"{mode + ' disk MB':>18}{'apparent MB':>14}{'weights':>9}" for mode in results))
    for place in order:
        row = f"{place:<14}"
        for result in results.values():
            s = result["sizes"][place]
            row += f"{mb(s['disk']):>18}{mb(s['apparent']):>14}{s['weights_copies']:>9.1f}"
        print(row)
    for mode, result in results.items():
        copies = result["sizes"]["total"]["weights_copies"]
        steps = ", ".join(f"{name} {secs:.1f}s" for name, secs in result["seconds"].items())
        print(f"{mode}: cache.type {result['cache_type']}; copies of the weights {copies:.1f} "
              f"({copies / 2:.1f} per version); {result['wall_s']:.1f} s in all ({steps})")
    if {"before", "after"} <= results.keys():
        before, after = results["before"]["sizes"]["total"], results["after"]["sizes"]["total"]
        print(f"after vs before: disk {mb(after['disk'])} / {mb(before['disk'])} MB = {after['disk'] / before['disk']:.2f}x; "
              f"copies of the weights {after['weights_copies']:.1f} / {before['weights_copies']:.1f} = "
              f"{after['weights_copies'] / before['weights_copies']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[*MODELS, "all"], default="tiny")
    parser.add_argument("--mode", choices=["before", "after", "both"], default="both")
    parser.add_argument("--keep", type=Path, help="build the workspaces under this folder and keep them")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--measure", type=Path, metavar="WORKSPACE",
                        help="only count an existing workspace (e.g. after `closedloop run`), its warm start and "
                             "candidate being the versions")
    args = parser.parse_args()
    if args.measure:
        root = args.measure.resolve()
        sizes = measure(root, [root / "data/models/warmstart" / WEIGHTS_FILE, root / "data/models/candidate" / WEIGHTS_FILE])
        from closedloop.lineage.dvc import DvcWorkspace

        report(str(root), {"measured": {"sizes": sizes, "seconds": {}, "wall_s": 0.0,
                                        "cache_type": DvcWorkspace(root).cache_type() or "(DVC default)"}})
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    figures = {}
    for model in (list(MODELS) if args.model == "all" else [args.model]):
        modes = ["before", "after"] if args.mode == "both" else [args.mode]
        figures[model] = {mode: run(model, mode, args.keep) for mode in modes}
        report(model, figures[model])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
