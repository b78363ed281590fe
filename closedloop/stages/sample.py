"""Stage sample: k completions per training task from the current champion.

Every sample records the settings and model version that produced it. Latency is wall-clock, so it
goes to a file of its own: the samples file then hashes the same when the stage is reproduced. The
tokens and their sampling log-probabilities go to rollouts.jsonl, which GRPO trains against.
"""

from __future__ import annotations

from collections import Counter

from closedloop.envs.base import load_tasks
from closedloop.execution.factory import open_executor
from closedloop.io import write_jsonl
from closedloop.models.loading import model_fingerprint
from closedloop.rewards.verification import ShardedVerifiers
from closedloop.sampling.base import SamplingError
from closedloop.sampling.episodes import STOPS, run_episodes
from closedloop.sampling.shards import sample_sharded
from closedloop.stages.common import StageContext, StageError
from closedloop.stages.prompting import check_sampling_settings, prompt_format_of


def run(ctx: StageContext) -> dict:
    settings = ctx.params.sample
    tasks = load_tasks(ctx.ws.tasks)
    mismatches = check_sampling_settings(ctx.ws.champion, ctx.params)
    model_version = model_fingerprint(ctx.ws.champion)
    seed = ctx.seed("sample")
    # Task ranges on separate workers (execution.backend, execution.shards), each with its own
    # sampler on the champion; cut on the backend's unit, so the samples do not depend on the cut.
    episodes = None
    try:
        with open_executor(ctx.params) as executor:
            if settings.rounds > 1:
                with ShardedVerifiers(ctx.params, executor) as verifiers:
                    sampled = run_episodes(executor, ctx.params, ctx.ws.champion, tasks, k=settings.k, seed=seed,
                                           batch_size=settings.batch_size, rounds=settings.rounds,
                                           verifiers=verifiers, progress=ctx.progress)
                episodes = sampled.episodes
                generations = [[episode.final.completion for episode in row] for row in episodes]
            else:
                sampled = sample_sharded(executor, ctx.params, ctx.ws.champion, [task.prompt for task in tasks],
                                         [task.task_id for task in tasks], k=settings.k, seed=seed,
                                         batch_size=settings.batch_size, progress=ctx.progress)
                generations = sampled.generations
            where = f"{executor.backend}, {sampled.shards} shard(s)"
    except SamplingError as error:
        raise StageError(f"sample ({settings.backend.name} backend): {error}") from None
    stats, prompt_format = sampled.stats, sampled.prompt_format
    transcript_of = _transcript_tokens(ctx) if episodes else None
    samples, timings, rollouts = [], [], []
    for position, (task, task_samples) in enumerate(zip(tasks, generations)):
        for index, sample in enumerate(task_samples):
            sample_id = f"{task.task_id}#{index}"
            # With episodes the row is the final attempt's; "episode" holds the transcript it was sampled
            # on, every attempt and what the model was shown (rounds 1 writes no such key: today's rows).
            episode = {"episode": episodes[position][index].record()} if episodes else {}
            samples.append({
                "sample_id": sample_id, "task_id": task.task_id, "env": task.env, "slice": task.slice,
                "kind": task.kind, "sample_index": index, "completion": sample.text,
                "model_version": model_version, "backend": settings.backend.name,
                "temperature": settings.temperature,
                "top_p": settings.top_p, "max_new_tokens": settings.max_new_tokens, "k": settings.k, "seed": seed,
                "prompt_tokens": sample.prompt_tokens, "completion_tokens": sample.completion_tokens,
                "finish_reason": sample.finish_reason, **episode,
            })
            timings.append({"sample_id": sample_id, "latency_s": round(sample.latency_s, 4)})
            # logprobs null: the backend gave none; GRPO recomputes them under the champion.
            rollout = {"sample_id": sample_id, "token_ids": list(sample.token_ids),
                       "logprobs": None if sample.logprobs is None else [round(lp, 6) for lp in sample.logprobs]}
            # An episode of several rounds: its transcript as tokens, the model's own earlier attempts
            # marked in it, so grpo trains the whole episode (feedback tokens get no gradient).
            transcript = transcript_of(episodes[position][index]) if transcript_of else None
            rollouts.append({**rollout, "episode": transcript} if transcript else rollout)
    write_jsonl(ctx.ws.samples, samples)
    write_jsonl(ctx.ws.sample_timings, timings)
    write_jsonl(ctx.ws.rollouts, rollouts)
    return {
        "samples": len(samples),
        "model_version": model_version,
        "completion_tokens": stats.completion_tokens,
        "tokens_per_s": round(stats.tokens_per_s, 1),
        "samples_per_s": round(stats.samples_per_s, 1),
        "finish_reasons": dict(Counter(s["finish_reason"] for s in samples)),
        "settings_mismatches": mismatches,
        "backend": settings.backend.name,
        "prompt_format": prompt_format,
        "logprobs_from": "sampler" if sampled.logprobs else "trainer",
        "execution": where,  # a string: metrics/info/sample.json, not the numbers
        **(episode_figures(sampled) if episodes else {}),
    }


def _transcript_tokens(ctx: StageContext):
    """Episode → its rollout's ``episode`` record (sampling/episodes.py), with the champion's tokenizer
    and prompt format: the ids every sampler fed it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ctx.ws.champion)
    fmt = prompt_format_of(ctx.params, tokenizer)
    return lambda episode: episode.transcript_rollout(fmt, tokenizer)


def episode_figures(run) -> dict:
    """Rounds used and why episodes stopped, and each round's figures (stage metrics)."""
    flat = [episode for row in run.episodes for episode in row]
    return {"episodes": {
        "rounds_mean": round(sum(len(e.attempts) for e in flat) / max(1, len(flat)), 4),
        "first_round_visible_pass": round(sum(e.attempts[0].visible_passed for e in flat) / max(1, len(flat)), 4),
        "final_visible_pass": round(sum(e.final.visible_passed for e in flat) / max(1, len(flat)), 4),
        "stops": {stop: sum(e.stop == stop for e in flat) for stop in STOPS},
        "per_round": {str(r["round"]): {key: value for key, value in r.items() if key != "round"}
                      for r in run.per_round},
    }}
