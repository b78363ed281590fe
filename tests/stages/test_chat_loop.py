"""A chat-template model through a whole iteration: a tiny Qwen2 with its own tokenizer and ChatML template."""

from __future__ import annotations

import json

import pytest

from closedloop.config import load_params
from closedloop.io import read_json, read_jsonl, replace_dir, write_jsonl
from closedloop.stages.common import StageError, run_stage
from closedloop.workspace import Workspace
from tests.stages.test_stages import STAGES_AFTER_WARM_START

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Workspace:
    import copy

    import yaml

    from closedloop.config import parse_params
    from closedloop.stages.warmstart import mixed_tasks
    from tests.chat_model import build_chat_model
    from tests.conftest import TINY

    corpus = [t.prompt + t.reference for t in mixed_tasks(parse_params(TINY), 120, "tokenizer")]
    model_dir = build_chat_model(tmp_path_factory.mktemp("chat-model") / "qwen2-tiny", corpus, seed=1)
    params = copy.deepcopy(TINY)
    params["model"] = {"name_or_path": str(model_dir)}
    params["sample"]["prompt_format"] = "chat"
    params["sample"]["system_prompt"] = "Answer with code only."
    root = tmp_path_factory.mktemp("chat-ws")
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    ws = Workspace.at(root)
    run_stage("benchmark", root)
    run_stage("warmstart", root)
    replace_dir(ws.warmstart_model, ws.champion)
    for name in STAGES_AFTER_WARM_START:
        run_stage(name, root)
    return ws


def test_a_whole_iteration_runs_on_chat_formatted_prompts(chat):
    from transformers import AutoTokenizer

    from closedloop.models.prompts import template_hash

    tokenizer = AutoTokenizer.from_pretrained(str(chat.champion))
    # No stop strings: the reply ends with <|im_end|>, and "\ndef " would cut a fenced block short.
    expected = {"prompt_format": "chat", "chat_template": template_hash(tokenizer),
                "system_prompt": "Answer with code only.", "stop": []}
    for model in (chat.warmstart_model, chat.candidate):
        saved = read_json(model / "closedloop_sampling.json")
        assert {key: saved[key] for key in expected} == expected
    assert read_json(chat.root / "metrics/info/sample.json")["prompt_format"] == "chat"
    # The rendered prompt (system message, user turn, assistant header) is what the model read.
    samples = read_jsonl(chat.samples)
    task = read_jsonl(chat.tasks)[0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Answer with code only."}, {"role": "user", "content": task["prompt"]}],
        tokenize=False, add_generation_prompt=True)
    first = next(s for s in samples if s["task_id"] == task["task_id"])
    assert first["prompt_tokens"] == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    assert read_json(chat.evaluation)["candidate"]["summary"]["overall"]["tasks"] > 0


def test_fenced_replies_are_extracted_and_verified(chat, tmp_path):
    """What an instruct model writes (the reference inside a fenced block, with prose) passes the reward stage."""
    import shutil

    root = tmp_path / "ws"
    shutil.copytree(chat.root, root)
    ws = Workspace.at(root)
    params = load_params(root)
    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}
    fences = {"extract": "json", "rules": "text"}

    def reference_of(task: dict) -> str:
        from closedloop.envs import get_env
        from closedloop.envs.base import Task

        fields = list(Task.__dataclass_fields__)
        return get_env(task["env"], params).reference(Task.from_record({k: task[k] for k in fields}))

    replies, rows = [], []
    for sample in read_jsonl(ws.samples):
        task = tasks[sample["task_id"]]
        if sample["sample_index"] == 0:
            tag = fences.get(task["env"], "python")
            reference = reference_of(task).strip("\n")
            if tag == "python":  # an instruct model restates the prompt's code (imports, the def line)
                restated = [line for line in task["prompt"].splitlines() if line and not line.startswith("#")]
                reference = "\n".join(restated + [reference])
            sample = {**sample, "completion": f"Here is my answer:\n```{tag}\n{reference}\n```\nIt follows the spec."}
            replies.append(sample["sample_id"])
        rows.append(sample)
    write_jsonl(ws.samples, rows)
    run_stage("reward", root)
    rewards = {r["sample_id"]: r for r in read_jsonl(ws.rewards)}
    assert replies
    failed = [(sid, rewards[sid]["failed_step"], rewards[sid]["feedback"]) for sid in replies
              if not rewards[sid]["passed"]]
    assert not failed, failed[:3]


def test_another_template_makes_the_mismatch_check_name_chat_template(chat, tmp_path):
    import shutil

    root = tmp_path / "ws"
    shutil.copytree(chat.root, root)
    ws = Workspace.at(root)
    config_path = ws.champion / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    template_file = ws.champion / "chat_template.jinja"
    if template_file.exists():  # transformers 5 saves the template beside the config
        template_file.write_text(template_file.read_text().replace("<|im_start|>assistant", "<|im_start|>bot"))
    else:
        config["chat_template"] = config["chat_template"].replace("<|im_start|>assistant", "<|im_start|>bot")
        config_path.write_text(json.dumps(config))
    with pytest.raises(StageError, match="chat_template: the model's rollouts used"):
        run_stage("sample", root)


def test_a_chat_model_s_episodes_run_a_whole_iteration_through_a_managed_openai_server(chat, tmp_path):
    """sample.rounds 3 with the openai backend against a managed `transformers serve` of the chat model:
    each later round reads the earlier attempts as assistant turns and their feedback as user turns,
    rendered by the model's template; every stage after the warm start runs on the episodes."""
    import shutil

    import yaml
    from transformers import AutoTokenizer

    from closedloop.models.prompts import episode_turns

    root = tmp_path / "ws"
    shutil.copytree(chat.root, root)
    data = yaml.safe_load((root / "params.yaml").read_text())
    data["sample"].update({"rounds": 3, "backend": {"name": "openai", "api": "chat"}, "server": {"managed": True}})
    (root / "params.yaml").write_text(yaml.safe_dump(data))
    ws = Workspace.at(root)
    for name in STAGES_AFTER_WARM_START:
        run_stage(name, root)
    tokenizer = AutoTokenizer.from_pretrained(str(ws.champion))
    samples = read_jsonl(ws.samples)
    tasks = {t["task_id"]: t for t in read_jsonl(ws.tasks)}
    later = [s for s in samples if s["episode"]["rounds"] > 1]
    assert later, "no episode went past its first round"
    for sample in later:
        episode = sample["episode"]
        turns = episode["prompt"]
        assert turns == episode_turns(tasks[sample["task_id"]]["prompt"],
                                      list(zip(episode["attempts"][:-1], episode["feedback"][:-1])))
        assert [t["role"] for t in turns] == ["user"] + ["assistant", "user"] * (episode["rounds"] - 1)
        rendered = tokenizer.apply_chat_template([{"role": "system", "content": "Answer with code only."}, *turns],
                                                 tokenize=False, add_generation_prompt=True)
        assert rendered.count("<|im_start|>assistant") == episode["rounds"]  # the earlier attempts + the reply's
        assert sample["prompt_tokens"] == len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    # grpo's view of the episode: the rendered transcript's tokens, the assistant turns marked as the model's
    rollouts = {r["sample_id"]: r for r in read_jsonl(ws.rollouts)}
    for sample in later:
        record = rollouts[sample["sample_id"]]["episode"]
        assert len(record["model_spans"]) == sample["episode"]["rounds"] - 1
        for (start, end), attempt in zip(record["model_spans"], sample["episode"]["attempts"]):
            marked = tokenizer.decode(record["prompt_ids"][start:end])
            assert marked.strip() and marked.strip() in attempt and "The visible checks say" not in marked
    evaluation = read_json(ws.evaluation)
    assert len(evaluation["candidate"]["rounds"]["by_round"]) == 3
    assert read_json(ws.gate)["rounds"]["candidate"]["pass@1"] == \
        [s["overall"]["pass@1"] for s in evaluation["candidate"]["rounds"]["by_round"]]
