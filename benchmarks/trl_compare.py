"""TRL's GRPOTrainer beside the loop (issue 25, item 3): the reference trainer from the same warm start,
on the same training tasks, with closedloop's own feedback sources as its reward function, for a
wall-clock budget, evaluated by the loop's own benchmark code.

`benchmarks/learning.py --compare trl` calls ``run_trl`` after the loop's modes have run, with the
tasks the best mode's iterations drew and its wall-clock as the budget; this module holds the parts:

- ``closedloop_reward``: TRL's reward-function signature (``prompts, completions, task_id, **kwargs``
  -> one float per completion) over ``closedloop.rewards.scoring.score_batch``, the function the reward
  stage writes rewards.jsonl with: every active feedback source (the environments' verifiers in the
  sandbox pools, human labels where they match), combined with the loop's weights. A completion is cut
  at the prompt format's stop strings first, as the loop's samplers cut theirs.
- ``run_trl``: GRPOTrainer on the warm-start policy (loaded by the loop's own loader, so the built-in
  and any Hugging Face directory work alike), k generations per task (``sample.k``), the loop's sampling
  temperature, top-p and ``max_new_tokens``, its grpo clip and learning rate, one optimizer step per
  generation batch (TRL's defaults: fully on-policy). A callback stops training when the budget is
  spent and saves the policy at evenly spaced marks; each saved policy is then evaluated with
  ``evaluate_policy`` at the loop's ``evaluate.samples_per_task`` (the loop's per-iteration figure).
  Evaluation time is not charged to TRL's budget; the loop's iterations include their own evaluation
  and gate, so the comparison favours TRL by that share.

trl is a benchmark-only extra (``pip install -e '.[bench]'``), not a runtime dependency.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # learning.py beside it

from closedloop.envs.base import Task  # noqa: E402
from closedloop.models.settings import SETTINGS_FILE  # noqa: E402
from closedloop.sampling.base import cut_at_stop  # noqa: E402
from learning import pass_rates  # noqa: E402  (beside this file; it imports this module only inside main)

# Trainer log keys kept per step (TRL's names): the diagnosis figures issue 25 asks the loop's grpo for.
LOG_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "clip_ratio/low_mean", "clip_ratio/high_mean",
            "clip_ratio/region_mean", "entropy", "kl", "completions/mean_length", "completions/clipped_ratio",
            "grad_norm", "learning_rate", "loss")


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string for raw prompts, a list of messages for conversational ones."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)


def closedloop_reward(params: Any, verifiers: Any, tasks: list[Task], labels_path: Path | str,
                      stop: tuple[str, ...] | list[str]) -> Callable[..., list[float]]:
    """A TRL reward function scoring completions as the reward stage does (the combined reward of
    rewards.jsonl). ``verifiers`` is an open EnvPools; the dataset's ``task_id`` column reaches the
    function as a keyword, one id per completion."""
    from closedloop.rewards.scoring import score_batch

    by_id = {task.task_id: task for task in tasks}
    calls = itertools.count()

    def reward(prompts: list, completions: list, task_id: list[str], **_: Any) -> list[float]:
        call = next(calls)
        unknown = sorted(set(task_id) - set(by_id))
        if unknown:
            raise KeyError(f"closedloop_reward: task ids not among the training tasks: {unknown[:3]}")
        samples = []
        for index, (completion, tid) in enumerate(zip(completions, task_id)):
            task = by_id[tid]
            text, _ = cut_at_stop(completion_text(completion), list(stop))
            samples.append({"sample_id": f"trl/{call}/{index}", "task_id": tid, "env": task.env,
                            "slice": task.slice, "kind": task.kind, "completion": text})
        rows, _ = score_batch(params, {tid: by_id[tid].to_record() for tid in set(task_id)}, samples, verifiers,
                              labels_path)
        return [float(row["reward"]) for row in rows]

    reward.__name__ = "closedloop_reward"  # TRL logs each reward function under its name
    return reward


def training_rows(prompt_format: Any, tasks: list[Task]) -> list[dict]:
    """The GRPO dataset: each task's prompt as the loop's samplers render it, and its id for the reward.
    Raw prompts go as text (TRL tokenizes them with the tokenizer's special tokens, as the raw format
    does); chat prompts as messages, which TRL renders with the tokenizer's template."""
    rows = []
    for task in tasks:
        if prompt_format.kind == "raw":
            prompt: Any = task.prompt
        else:
            prompt = ([{"role": "system", "content": prompt_format.system_prompt}] if prompt_format.system_prompt
                      else []) + [{"role": "user", "content": task.prompt}]
        rows.append({"prompt": prompt, "task_id": task.task_id})
    return rows


def marks(budget_s: float, points: int) -> list[float]:
    """Elapsed seconds at which the policy is saved for the curve: ``points`` evenly spaced, the last at
    the budget."""
    return [budget_s * (i + 1) / points for i in range(points)]


def run_trl(base: Path, train_tasks: list[Task], *, budget_s: float, out_dir: Path, points: int = 5,
            lr: float | None = None, batch_size: int | None = None, seed: int = 0,
            echo: Callable[[str], None] = print) -> dict:
    """GRPOTrainer from the warm start of workspace ``base`` on ``train_tasks`` for ``budget_s`` seconds of
    training; returns the curve (elapsed minutes, steps and benchmark pass@1 of each saved policy), the
    per-step trainer logs and the directory of the last saved policy (``final_model``)."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from closedloop.config import load_params
    from closedloop.envs.base import load_tasks
    from closedloop.evaluation.runner import evaluate_policy
    from closedloop.models.loading import load_policy, save_policy
    from closedloop.models.prompts import prompt_format
    from closedloop.rewards.pools import EnvPools
    from closedloop.workspace import Workspace

    if not train_tasks:
        raise ValueError("run_trl: no training tasks")
    ws = Workspace.at(base)
    params = load_params(base)
    model, tokenizer = load_policy(ws.warmstart_model, device="cpu")
    fmt = prompt_format(params.sample, params.model, tokenizer)
    k = params.sample.k
    batch = batch_size or params.train.batch_size
    if batch % k:
        raise ValueError(f"run_trl: the batch ({batch} completions) must be a multiple of sample.k ({k})")
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    config = GRPOConfig(
        output_dir=str(out_dir / "trainer"), seed=seed, use_cpu=True, report_to=[], save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        learning_rate=lr or params.train.grpo.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=params.train.warmup_steps, num_train_epochs=1000,  # the wall-clock budget stops it
        per_device_train_batch_size=batch, num_generations=k, max_completion_length=params.sample.max_new_tokens,
        temperature=params.sample.temperature, top_p=params.sample.top_p, epsilon=params.train.grpo.clip,
        beta=params.train.grpo.beta, loss_type="dapo", log_completions=False)
    saved: list[dict] = []
    step_logs: list[dict] = []

    class WallClock(TrainerCallback):
        """Stops training at the budget and saves the policy at each mark (saving is not charged)."""

        def __init__(self) -> None:
            self.start = 0.0
            self.pending = marks(budget_s, points)
            self.uncharged = 0.0

        def elapsed(self) -> float:
            return time.perf_counter() - self.start - self.uncharged

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            elapsed = self.elapsed()
            while self.pending and elapsed >= self.pending[0]:
                self.pending.pop(0)
                began = time.perf_counter()
                target = out_dir / f"policy-{len(saved) + 1}"
                save_policy(model, tokenizer, target)
                shutil.copy2(ws.warmstart_model / SETTINGS_FILE, target / SETTINGS_FILE)
                saved.append({"model": str(target), "minutes": round(elapsed / 60, 2), "steps": state.global_step})
                echo(f"trl   saved {target.name} at {elapsed / 60:.1f} min, step {state.global_step}")
                self.uncharged += time.perf_counter() - began
            if elapsed >= budget_s:
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            kept = {key: round(float(value), 6) for key, value in (logs or {}).items()
                    if key in LOG_KEYS or key.startswith("rewards/")}
            if kept:
                step_logs.append({"step": state.global_step, "minutes": round(self.elapsed() / 60, 3), **kept})
                if state.global_step % 20 == 0 and "reward" in kept:
                    echo(f"trl   step {state.global_step:4d}  {self.elapsed() / 60:5.1f} min  reward "
                         f"{kept['reward']:.3f}  zero-spread groups {kept.get('frac_reward_zero_std', 0):.2f}  "
                         f"entropy {kept.get('entropy', 0):.3f}  clipped {kept.get('clip_ratio/region_mean', 0):.3f}")

    dataset = Dataset.from_list(training_rows(fmt, train_tasks))
    benchmark = load_tasks(ws.benchmark_tasks)
    with EnvPools(params) as verifiers:
        reward = closedloop_reward(params, verifiers, train_tasks, ws.human_labels, fmt.stop)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[WallClock()])
        trainer.remove_callback(PrinterCallback)  # every step's whole log dict; the callback echoes a line
        started = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - started
        if not saved:  # the budget ran out inside the first step
            raise RuntimeError(f"run_trl: no policy saved in a {budget_s:.0f} s budget (no step finished)")
        echo(f"trl   trained {trainer.state.global_step} steps in {train_seconds:.0f} s; evaluating "
             f"{len(saved)} saved policies")
        for point in saved:
            result = evaluate_policy(Path(point["model"]), benchmark, params=params,
                                     samples_per_task=params.evaluate.samples_per_task,
                                     seed=params.stage_seed("evaluate", False), batch_size=params.evaluate.batch_size,
                                     verifiers=verifiers)
            point["pass@1"] = pass_rates(result["summary"])
            echo(f"trl   {point['minutes']:5.1f} min  step {point['steps']:4d}  pass@1 {point['pass@1']['overall']:.3f} | "
                 + " ".join(f"{env} {v:.3f}" for env, v in point["pass@1"].items() if env != "overall"))
    (out_dir / "logs.json").write_text(json.dumps(step_logs, indent=1) + "\n")
    return {"budget_s": round(budget_s, 1), "train_seconds": round(train_seconds, 1), "tasks": len(train_tasks),
            "batch": batch, "lr": config.learning_rate, "curve": saved, "logs": step_logs,
            "final_model": saved[-1]["model"]}
