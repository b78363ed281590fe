"""Multi-round episodes (``sample.rounds``): sample an attempt, run the task's visible checks on it,
show the model what they said, and sample again, until the visible checks pass, R rounds are used, or
the next transcript would not fit the model's context.

Rounds are batched across episodes: every open episode's round r is sampled at once (one sampling run
on the executor's workers), then verified at once in the sandbox pools, then round r + 1. With local
processes the samplers live for all the rounds (the model, or a managed inference server, loaded
once). On Ray they live for one round, and the verifier workers are closed before the next round's
samplers start, as the evaluate stage does, so both never need the cluster at the same time (a 2-CPU
local Ray fits either, not both).

What the model reads after a failed attempt is envs.episodes.shown_feedback of the visible checks'
verdict: never a value that only the hidden checks hold. The reward stage scores the final attempt on
the hidden checks. Round r's samples are seeded by the run's seed and r, and by each open episode's
position among the open ones, so the same inputs give the same episodes.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from closedloop.envs.base import Task
from closedloop.envs.episodes import episode_checks, shown_feedback
from closedloop.faults import fault_point
from closedloop.models.prompts import Prompt, PromptFormat, episode_prompt, episode_turns, transcript_tokens
from closedloop.sampling.base import Completion, SamplingStats
from closedloop.sampling.shards import open_sampling

ROUND_SEED_STRIDE = 1_000_003  # round r samples with seed + (r - 1) * this: rounds never share draws
STOPS = ("passed", "rounds", "context")


@dataclass(frozen=True)
class Attempt:
    prompt: Prompt  # what this round's sampler read: the task, or the transcript of the earlier attempts
    completion: Completion
    visible_passed: bool
    feedback: str  # what the model is shown about this attempt in the next round


@dataclass
class Episode:
    task: Task
    index: int  # the j-th of the task's k episodes
    attempts: list[Attempt] = field(default_factory=list)
    stop: str = ""  # one of STOPS, once the episode ended
    # sample.trim_transcript: the first attempt the transcript still shows (older ones left out to fit)
    kept_from: int = 0

    @property
    def final(self) -> Attempt:
        return self.attempts[-1]

    def record(self) -> dict[str, Any]:
        """What a samples.jsonl row keeps of the episode (its final attempt is the row's completion)."""
        return {"rounds": len(self.attempts), "stop": self.stop, "prompt": self.final.prompt,
                "attempts": [a.completion.text for a in self.attempts],
                "visible_passed": [a.visible_passed for a in self.attempts],
                "feedback": [a.feedback for a in self.attempts],
                "completion_tokens": [a.completion.completion_tokens for a in self.attempts],
                **({"kept_from": self.kept_from} if self.kept_from else {})}

    def transcript_rollout(self, fmt: PromptFormat, tokenizer: Any) -> dict[str, Any] | None:
        """What grpo needs to train the whole episode as one sequence (rollouts.jsonl's ``episode``): the
        final attempt's transcript as token ids, the spans of them that are the model's earlier attempts
        (trained; the rest, the task and the feedback, get no gradient), and each span's sampling
        log-probabilities where its tokens are the ones sampled (else null: the trainer computes them
        under the champion, the policy that sampled them). None for a one-round episode."""
        earlier = self.attempts[self.kept_from:-1]
        if not earlier:
            return None
        prompt, ids, spans = transcript_tokens(fmt, tokenizer, self.task.prompt,
                                               [(a.completion.text, a.feedback) for a in earlier])
        if prompt != self.final.prompt:
            raise ValueError(f"episode {self.task.task_id}#{self.index}: its transcript renders differently "
                             "from the prompt its final round was sampled on")
        located = [(span, a.completion) for span, a in zip(spans, earlier) if span is not None]
        span_logprobs = []
        for (start, end), sampled in located:
            same = sampled.logprobs is not None and list(sampled.token_ids[:end - start]) == ids[start:end]
            span_logprobs.append([round(lp, 6) for lp in sampled.logprobs[:end - start]] if same else None)
        return {"prompt_ids": ids, "model_spans": [list(span) for span, _ in located], "span_logprobs": span_logprobs}


@dataclass(frozen=True)
class EpisodeRun:
    episodes: list[list[Episode]]  # episodes[i][j]: the j-th episode of task i
    stats: SamplingStats  # over every round's sampling (its wall time: sampling only)
    logprobs: bool
    prompt_format: str | None
    shards: int
    per_round: list[dict]  # per round: open episodes, sampled, visible passes, stops, seconds


def round_seed(seed: int, round_number: int) -> int:
    return seed + (round_number - 1) * ROUND_SEED_STRIDE


def run_episodes(executor: Any, params: Any, model_dir: Path, tasks: list[Task], *, k: int, seed: int,
                 batch_size: int, rounds: int, verifiers: Any, progress: bool = False) -> EpisodeRun:
    """k episodes per task of at most ``rounds`` attempts each, on the model in ``model_dir``.

    ``verifiers``: a rewards.verification.ShardedVerifiers (or anything with its ``env``, ``prefetch``,
    ``verify_batch`` and ``close``). A chat model reads the transcript as alternating turns, rendered
    by its template (models/prompts.episode_turns); a raw one as text (episode_prompt)."""

    checks = {task.task_id: episode_checks(verifiers.env(task.env), task) for task in tasks}
    episodes = [[Episode(task, j) for j in range(k)] for task in tasks]
    with ExitStack() as held:
        # Local processes: one pool of samplers for every round (the model, or a managed server, loaded
        # once). On Ray each round's samplers go before its verifiers start (see the module docstring).
        shared = held.enter_context(open_sampling(executor, params, model_dir)) if executor.backend == "local" else None
        return _rounds(executor, params, model_dir, tasks, episodes, checks, shared, k=k, seed=seed,
                       batch_size=batch_size, rounds=rounds, verifiers=verifiers, progress=progress)


def _rounds(executor: Any, params: Any, model_dir: Path, tasks: list[Task], episodes: list[list[Episode]],
            checks: dict, shared: Any, *, k: int, seed: int, batch_size: int, rounds: int, verifiers: Any,
            progress: bool) -> EpisodeRun:
    open_ = [episode for row in episodes for episode in row]
    per_round, sampled_rows, wall = [], [], 0.0
    logprobs, prompt_format, shards = False, None, 0
    for number in range(1, rounds + 1):
        if not open_:
            break
        with nullcontext(shared) if shared is not None else open_sampling(executor, params, model_dir) as sampling:
            if number == 1:
                prompt_format = sampling.measure([tasks[0].prompt] if tasks else []).prompt_format
                sampled = sampling.sample([t.prompt for t in tasks], [t.task_id for t in tasks], k=k,
                                          seed=seed, batch_size=batch_size, progress=progress)
                drawn = [(episode, task.prompt, sampled.generations[i][episode.index])
                         for i, task in enumerate(tasks) for episode in episodes[i]]
                logprobs, shards = sampled.logprobs, sampled.shards
            else:
                prompts = [_next_prompt(episode, prompt_format) for episode in open_]
                fits = _fits(sampling.measure(prompts), params.sample.max_new_tokens)
                if params.sample.trim_transcript:
                    trimmed = _trim(sampling, open_, prompts, fits, prompt_format, params.sample.max_new_tokens)
                for episode, fit in zip(open_, fits):
                    if not fit:
                        episode.stop = "context"
                going = [(episode, prompt) for episode, prompt, fit in zip(open_, prompts, fits) if fit]
                sampled = sampling.sample([p for _, p in going], [e.task.task_id for e, _ in going], k=1,
                                          seed=round_seed(seed, number), batch_size=batch_size, progress=progress)
                drawn = [(episode, prompt, row[0]) for (episode, prompt), row in zip(going, sampled.generations)]
        wall += sampled.stats.wall_s
        sampled_rows += [[completion] for _, _, completion in drawn]
        verdicts = _verify_visible(drawn, checks, verifiers)
        for (episode, prompt, completion), verdict in zip(drawn, verdicts):
            feedback = shown_feedback(verifiers.env(episode.task.env), checks[episode.task.task_id].visible, verdict)
            episode.attempts.append(Attempt(prompt, completion, bool(verdict.passed), feedback))
            if verdict.passed:
                episode.stop = "passed"
            elif number == rounds:
                episode.stop = "rounds"
        per_round.append({"round": number, "open": len(open_), "sampled": len(drawn),
                          "visible_passed": sum(bool(v.passed) for v in verdicts),
                          "stopped_for_context": len(open_) - len(drawn), "sampling_s": round(sampled.stats.wall_s, 3),
                          **({"trimmed": trimmed} if number > 1 and params.sample.trim_transcript else {})})
        open_ = [episode for episode, _, _ in drawn if not episode.stop]
        if open_:
            fault_point("sample:round")  # tests kill the stage here: a round done, the next not begun
    return EpisodeRun(episodes=episodes, stats=SamplingStats.of(sampled_rows, wall), logprobs=logprobs,
                      prompt_format=prompt_format, shards=shards, per_round=per_round)


def _trim(sampling: Any, open_: list[Episode], prompts: list[Prompt], fits: list[bool], prompt_format: str | None,
          max_new_tokens: int) -> int:
    """sample.trim_transcript: each transcript that does not fit, with its oldest attempts left out one at a
    time until it does (``prompts`` and ``fits`` updated in place, the episode's kept_from moved on); one
    that does not fit with its latest attempt alone keeps its transcript and stops. One measurement per
    pass over all of them. Returns how many episodes were trimmed to fit this round."""
    before = {i: open_[i].kept_from for i, fit in enumerate(fits) if not fit}
    while True:
        short = [i for i, fit in enumerate(fits) if not fit and open_[i].kept_from < len(open_[i].attempts) - 1]
        if not short:
            break
        for i in short:
            open_[i].kept_from += 1
            prompts[i] = _next_prompt(open_[i], prompt_format)
        for i, fit in zip(short, _fits(sampling.measure([prompts[i] for i in short]), max_new_tokens)):
            fits[i] = fit
    for i, kept_from in before.items():
        if not fits[i]:  # stops for its context: its record stays that of the transcript it last read
            open_[i].kept_from = kept_from
    return sum(fits[i] for i in before)


def _next_prompt(episode: Episode, prompt_format: str | None) -> Prompt:
    """The transcript of the episode so far (from its kept_from-th attempt): raw text in a failure→fix
    pair's form, or chat turns."""
    attempts = [(a.completion.text, a.feedback) for a in episode.attempts[episode.kept_from:]]
    if prompt_format == "chat":
        return episode_turns(episode.task.prompt, attempts)
    return episode_prompt(episode.task.prompt, attempts)


def _fits(measured: Any, max_new_tokens: int) -> list[bool]:
    """Whether each transcript leaves room for a whole attempt in the model's context (unknown: yes)."""
    limit = measured.context_length
    return [not limit or n + max_new_tokens <= limit for n in measured.prompt_tokens]


def _verify_visible(drawn: list[tuple[Episode, str, Completion]], checks: dict, verifiers: Any) -> list:
    """The visible checks' verdict of each drawn attempt, every environment's at once."""
    requests = [(episode.task.env, checks[episode.task.task_id].visible, completion.text)
                for episode, _, completion in drawn]
    verifiers.prefetch(requests)
    by_env: dict[str, list[int]] = defaultdict(list)
    for position, (env_name, _, _) in enumerate(requests):
        by_env[env_name].append(position)
    verdicts: list = [None] * len(requests)
    for env_name, positions in by_env.items():
        found = verifiers.verify_batch(env_name, [requests[p][1] for p in positions],
                                       [requests[p][2] for p in positions])
        for position, verdict in zip(positions, found):
            verdicts[position] = verdict
    # The sandbox workers go before the next round's samplers start (see the module docstring).
    verifiers.close()
    return verdicts
