"""Sampling in shards: a worker holds one sampler on the champion (an HF model on its device, a vLLM
replica on its GPU, a client of an inference server) and samples the task ranges it is given.

A shard is plain records: the prompts, their task ids, and ``first``, the position of its first prompt
in the whole batch. Every backend seeds a prompt's samples by the run's seed and that position, and
shard boundaries fall on the backend's :meth:`~closedloop.sampling.base.Sampler.shard_unit`, so the
samples are the same whether the stage cut the batch into one shard or five, on this machine or on Ray.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

SAMPLE_WORKER = "closedloop.sampling.shards:SampleWorker"


class SampleWorker:
    """Opens the sampler once (``setup``: ``params`` as a dict, ``model_dir``), then samples shards."""

    def __init__(self, setup: dict) -> None:
        from closedloop.config import parse_params
        from closedloop.sampling.base import open_sampler

        self.params = parse_params(setup["params"])
        self.sampler = open_sampler(self.params, Path(setup["model_dir"]))

    def run(self, shard: dict) -> dict[str, Any]:
        """``shard``: prompts, names (task ids), first, seed, k, batch_size, progress → each prompt's
        completions as dicts, and what the sampler can return."""
        from closedloop.sampling.base import check_prompt_lengths

        settings = self.params.sample
        check_prompt_lengths(self.sampler, shard["prompts"], shard["names"], settings.max_new_tokens)
        generations, stats = self.sampler.sample(shard["prompts"], k=shard["k"], seed=shard["seed"],
                                                 batch_size=shard["batch_size"], progress=shard.get("progress", False),
                                                 first=shard["first"])
        return {"completions": [[asdict(c) for c in row] for row in generations], "wall_s": stats.wall_s,
                "capabilities": asdict(self.sampler.capabilities),
                "prompt_format": self.sampler.prompt_record["prompt_format"]}

    def close(self) -> None:
        self.sampler.close()


def sample_shards(prompts: list[str], names: list[str], *, shards: int, unit: int, seed: int, k: int,
                  batch_size: int, progress: bool = False) -> list[dict]:
    """The shards of a sampling run: contiguous task ranges on ``unit`` boundaries."""
    from closedloop.execution.base import split

    return [{"prompts": prompts[r.start:r.stop], "names": names[r.start:r.stop], "first": r.start, "seed": seed,
             "k": k, "batch_size": batch_size, "progress": progress}
            for r in split(len(prompts), shards, unit)]
