"""The tiny params every test and the soak/resume benchmarks run on: every environment, a 4-task
benchmark each, 10 tasks per iteration, a 2-layer 32-wide policy, 2 training steps. No pytest here,
so benchmarks can import it."""

TINY = {
    "project": {"seed": 7},
    "model": {"builtin": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
                          "vocab_size": 320, "max_position_embeddings": 512}},
    # Every environment, each with a benchmark of 2 core, 1 edge and 1 failure-mode task.
    "envs": {name: {"benchmark": {"core": 2, "edge": 1, "failure_modes": 1, "heldout": 1}, **extra}
             for name, extra in (("code", {"tests_per_task": 4}), ("data", {}), ("script", {}),
                                 ("extract", {}), ("rules", {}))},
    "generate": {"n_tasks": 10},
    "sample": {"k": 2, "max_new_tokens": 24, "batch_size": 16},
    "reward": {"workers": 2},
    "warmstart": {"n_references": 16, "steps": 4, "batch_size": 8, "tokenizer_corpus_tasks": 120},
    "train": {"steps": 2, "batch_size": 8},
    "evaluate": {"samples_per_task": 1, "batch_size": 16},
}
