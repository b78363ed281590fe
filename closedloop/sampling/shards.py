"""Sampling in shards: a worker holds one sampler on the champion (an HF model on its device, a vLLM
replica on its GPU, a client of an inference server) and samples the task ranges it is given.

A shard is plain records: the prompts, their task ids, and ``first``, the position of its first prompt
in the whole batch. Every backend seeds a prompt's samples by the run's seed and that position, and
shard boundaries fall on the backend's :meth:`~closedloop.sampling.base.Sampler.shard_unit`, so the
samples are the same whether the stage cut the batch into one shard or five, on this machine or on Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from closedloop.config import parse_params
from closedloop.execution.base import split
from closedloop.execution.factory import shard_resources
from closedloop.sampling.base import (
    Completion,
    SamplingStats,
    backend_class,
    check_prompt_lengths,
    open_sampler,
)

SAMPLE_WORKER = "closedloop.sampling.shards:SampleWorker"


class SampleWorker:
    """Opens the sampler once (``setup``: ``params`` as a dict, ``model_dir``), then samples shards."""

    def __init__(self, setup: dict) -> None:
        self.params = parse_params(setup["params"])
        self.sampler = open_sampler(self.params, Path(setup["model_dir"]))

    def run(self, shard: dict) -> dict[str, Any]:
        """``shard``: prompts, names (task ids), first, seed, k, batch_size, progress → each prompt's
        completions as dicts, and what the sampler can return. A shard with ``measure`` set instead gets
        each prompt's rendered token count and the model's context length (episodes: a transcript that
        would overflow ends its episode before it is sampled)."""

        settings = self.params.sample
        if shard.get("measure"):
            return {"prompt_tokens": self.sampler.prompt_tokens(shard["prompts"]) if shard["prompts"] else [],
                    "context_length": self.sampler.context_length,
                    "prompt_format": self.sampler.prompt_record["prompt_format"]}
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

    return [{"prompts": prompts[r.start:r.stop], "names": names[r.start:r.stop], "first": r.start, "seed": seed,
             "k": k, "batch_size": batch_size, "progress": progress}
            for r in split(len(prompts), shards, unit)]


@dataclass(frozen=True)
class Sampled:
    generations: list  # generations[i][j]: the j-th Completion of prompt i
    stats: Any  # SamplingStats over the whole run (its wall time: the stage's, shards side by side)
    logprobs: bool  # the backend returned sampling log-probabilities
    prompt_format: str | None  # "raw" | "chat"; None when there was nothing to sample
    shards: int


def sample_sharded(executor: Any, params: Any, model_dir: Path, prompts: list[str], names: list[str], *, k: int,
                   seed: int, batch_size: int, progress: bool = False) -> Sampled:
    """k completions per prompt from the model in ``model_dir``, in ``execution.shards`` shards on
    ``executor``'s workers (one sampler each). Raises the sampler's SamplingError (a prompt too long
    names its task)."""

    with open_sampling(executor, params, model_dir) as sampling:
        return sampling.sample(prompts, names, k=k, seed=seed, batch_size=batch_size, progress=progress)


@dataclass(frozen=True)
class Measured:
    prompt_tokens: list[int]
    context_length: int | None
    prompt_format: str


class ShardedSampling:
    """The samplers of one pool (``open_sampling``): several sampling runs on the model loaded once."""

    def __init__(self, workers: Any, params: Any) -> None:
        self.workers, self.params = workers, params

    def measure(self, prompts: list[str]) -> Measured:
        """Each prompt's token count once rendered, the model's context length and its prompt format."""
        ranges = split(len(prompts), max(1, self.params.execution.shards)) or [range(0)]
        results = self.workers.map([{"measure": True, "prompts": prompts[r.start:r.stop]} for r in ranges])
        return Measured(prompt_tokens=[n for result in results for n in result["prompt_tokens"]],
                        context_length=results[0]["context_length"], prompt_format=results[0]["prompt_format"])

    def sample(self, prompts: list[str], names: list[str], *, k: int, seed: int, batch_size: int,
               progress: bool = False) -> Sampled:
        params = self.params
        unit = backend_class(params).shard_unit(params.sample, k, batch_size)
        shards = sample_shards(prompts, names, shards=params.execution.shards, unit=unit, seed=seed, k=k,
                               batch_size=batch_size, progress=progress)
        started = time.perf_counter()  # the workers are up (models loaded): sampling time only
        results = self.workers.map(shards) if shards else []
        wall = time.perf_counter() - started
        generations = [[Completion(**c) for c in row] for result in results for row in result["completions"]]
        return Sampled(generations=generations, stats=SamplingStats.of(generations, wall),
                       logprobs=bool(results and results[0]["capabilities"]["logprobs"]),
                       prompt_format=results[0]["prompt_format"] if results else None, shards=len(shards))


@contextmanager
def open_sampling(executor: Any, params: Any, model_dir: Path) -> Iterator[ShardedSampling]:
    """A pool of samplers on the model in ``model_dir`` (one per worker of ``executor``), closed on exit."""
    setup = {"params": params.model_dump(mode="json"), "model_dir": str(Path(model_dir).resolve())}
    with executor.pool(SAMPLE_WORKER, setup, shard_resources(params)) as workers:
        yield ShardedSampling(workers, params)
