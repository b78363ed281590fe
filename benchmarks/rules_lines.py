"""Where a warm start's rules answers go wrong: each rule's yes/no line and the decision, scored against
the reference line by line, and the completion loss on its own training references against fresh tasks
(issue 25, item 4: is the built-in's width what keeps rules at chance?).

pass@1 says only that an answer was wholly right. A rule line right about half the time is a guess (the
references say yes on about 44% of rule lines); a loss on the model's own references as high as on fresh
tasks says it did not fit the comparison even where it trained, so the failure is not overfitting.

    python benchmarks/budget_sweep.py --settings rules_only,rules_only_w384 --iterations 0 --parallel 2 \\
        --threads 1 --workdir /tmp/rules_probe
    python benchmarks/rules_lines.py /tmp/rules_probe/rules_only /tmp/rules_probe/rules_only_w384

Each argument is a workspace with a warm start (data/models/warmstart, data/warmstart/references.jsonl,
data/benchmark/tasks.jsonl); the first is the baseline the others are printed beside.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAMPLES_PER_TASK = 4
SAMPLE_SEED = 7
LOSS_EXAMPLES = 300
FRESH_SEED = 987654  # training tasks the warm start never saw


def answer_lines(text: str) -> dict[str, str]:
    """{"R1": "yes", ..., "decision": "deny"} from a rules answer; lines without a colon are skipped."""
    return {key.strip(): value.strip() for key, _, value in
            (line.partition(":") for line in text.strip().splitlines() if ":" in line)}


def score_lines(pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Over (reference, answer) pairs: the share of rule lines and of decisions the answer got right, and
    how often the reference and the answer say yes on a rule line."""
    rule = decision = rule_right = decision_right = ref_yes = said_yes = 0
    for reference, answer in pairs:
        got = answer_lines(answer)
        for key, value in answer_lines(reference).items():
            right = got.get(key) == value
            if key == "decision":
                decision, decision_right = decision + 1, decision_right + right
            else:
                rule, rule_right = rule + 1, rule_right + right
                ref_yes, said_yes = ref_yes + (value == "yes"), said_yes + (got.get(key) == "yes")
    return {"rule_lines_right": rule_right / max(rule, 1), "decisions_right": decision_right / max(decision, 1),
            "reference_yes_share": ref_yes / max(rule, 1), "answer_yes_share": said_yes / max(rule, 1)}


def sampled_answers(root: Path, params) -> tuple[list[tuple[str, str]], float]:
    """SAMPLES_PER_TASK answers to each rules benchmark task as the warm start samples them: the
    (reference, answer) pairs and pass@1 by the environment's own verifier."""
    from closedloop.envs.base import load_tasks
    from closedloop.execution.local import LocalExecutor
    from closedloop.rewards.pools import EnvPools
    from closedloop.sampling.shards import sample_sharded

    tasks = [t for t in load_tasks(root / "data/benchmark/tasks.jsonl") if t.env == "rules"]
    sampled = sample_sharded(LocalExecutor(), params, root / "data/models/warmstart", [t.prompt for t in tasks],
                             [t.task_id for t in tasks], k=SAMPLES_PER_TASK, seed=SAMPLE_SEED, batch_size=64)
    flat = [(task, g.text) for task, row in zip(tasks, sampled.generations) for g in row]
    with EnvPools(params) as verifiers:
        env = verifiers.env("rules")
        verdicts = verifiers.verify_batch("rules", [t for t, _ in flat], [text for _, text in flat])
        pairs = [(env.reference(task), text) for task, text in flat]
    return pairs, sum(bool(v.passed) for v in verdicts) / len(verdicts)


def completion_loss(model, tokenizer, pairs: list[tuple[str, str]]) -> float:
    """Mean loss per completion token (the end-of-sequence token included) of prompt + completion."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, completion in pairs:
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ids = prompt_ids + tokenizer(completion, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])])
            losses = torch.nn.functional.cross_entropy(model(ids).logits[0, :-1], ids[0, 1:], reduction="none")
            completion_losses = losses[len(prompt_ids) - 1:]
            total, count = total + completion_losses.sum().item(), count + completion_losses.numel()
    return total / count


def losses(root: Path, params) -> dict[str, float]:
    """The completion loss on LOSS_EXAMPLES of the warm start's own references and on as many fresh tasks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from closedloop.envs import get_env
    from closedloop.io import read_jsonl

    model_dir = root / "data/models/warmstart"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    env = get_env("rules", params)
    own = [(r["prompt"], r["completion"]) for r in read_jsonl(root / "data/warmstart/references.jsonl")
           if r["env"] == "rules"][:LOSS_EXAMPLES]
    fresh = [(t.prompt, env.reference(t)) for t in env.generate(LOSS_EXAMPLES, seed=FRESH_SEED, split="train")]
    return {"loss_own_references": completion_loss(model, tokenizer, own),
            "loss_fresh_tasks": completion_loss(model, tokenizer, fresh)}


def measure(root: Path) -> dict:
    import torch

    from closedloop.config import load_params

    torch.set_num_threads(1)
    params = load_params(root)
    pairs, passed = sampled_answers(root, params)
    return {"workspace": str(root), "samples": len(pairs), "pass@1": passed, **score_lines(pairs),
            **losses(root, params)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspaces", nargs="+", type=Path, help="warm-started workspaces; the first is the baseline")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    missing = [str(root) for root in args.workspaces if not (root / "data/models/warmstart").is_dir()]
    if missing:
        parser.error(f"no warm start (data/models/warmstart) in {missing}")
    rows = [measure(root) for root in args.workspaces]
    print("| workspace | samples | pass@1 | rule lines right | decisions right | answers' yes share "
          "| loss own refs / fresh |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['workspace']} | {row['samples']} | {row['pass@1']:.3f} | {row['rule_lines_right']:.1%} | "
              f"{row['decisions_right']:.1%} | {row['answer_yes_share']:.1%} (references {row['reference_yes_share']:.1%}) | "
              f"{row['loss_own_references']:.3f} / {row['loss_fresh_tasks']:.3f} |")
    for row in rows[1:]:
        print(f"{row['workspace']} against {rows[0]['workspace']}: rule lines "
              f"{(row['rule_lines_right'] - rows[0]['rule_lines_right']) * 100:+.1f} pp, pass@1 "
              f"{(row['pass@1'] - rows[0]['pass@1']) * 100:+.1f} pp")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
