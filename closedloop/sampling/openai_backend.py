"""The ``openai`` backend: any OpenAI-compatible server (vLLM serve, SGLang, TGI, transformers serve).

Prompts are rendered here (the same chat template the trainer uses) and sent as text to
``/v1/completions``, so the server reads exactly the tokens training saw; ``api: chat`` sends
messages to ``/v1/chat/completions`` instead and leaves the template to the server. Servers differ
in what they honour: `transformers serve` ignores ``n`` and ``logprobs`` and samples only when a
request's ``generation_config`` says so. So every sample is its own request with its own seed, with
the settings in both the OpenAI fields and ``generation_config``; token ids are the text
re-tokenised here, and log-probabilities are left to the trainer (capabilities say so), except from
a managed vLLM server started with processed log-probabilities.

Requests run ``concurrency`` at a time, each with a timeout, retried with exponential backoff on
connection errors, 429 and 5xx. A server that is down, serves another model or times out is a
:class:`SamplingError` naming the URL.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from closedloop.models.loading import model_fingerprint
from closedloop.sampling.base import (
    Capabilities,
    Completion,
    SamplerBase,
    SamplingError,
    SamplingStats,
    cut_at_stop,
    eos_token_ids,
)
from closedloop.sampling.server import start_server

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class OpenAISampler(SamplerBase):
    backend = "openai"

    def __init__(self, params: Any, model_dir: Path) -> None:
        super().__init__(params, model_dir)
        import httpx
        from transformers import AutoConfig, AutoTokenizer

        self.options = params.sample.backend
        server = params.sample.server
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self._resolve_prompt_format(tokenizer)
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        self.context_length = getattr(config, "max_position_embeddings", None)
        self.eos_ids = _eos_ids(model_dir, tokenizer)
        self.bos_prefix = _duplicate_bos(tokenizer) if self.prompt_format.kind == "chat" else ""
        self.process = None
        if server.managed:
            self.process = start_server(self.model_dir, params)
            self.url, self.served_model = self.process.url, self.process.model
        else:
            self.url = server.url.rstrip("/")
            self.served_model = None  # resolved below against what the server lists
        self.client = httpx.Client(timeout=self.options.timeout_s)
        try:
            self.served_model = self._check_model(server.model)
        except BaseException:
            self.close()
            raise
        self.managed_kind = self.process.kind if self.process else None
        self.concurrency = self.options.concurrency
        if self.managed_kind == "transformers" and self.settings.temperature > 0:
            # transformers serve seeds torch's global generator per request: two requests in flight
            # draw from one stream and the samples stop being a function of their seeds.
            self.concurrency = 1
        # Only vLLM started by us is known to return log-probabilities after temperature.
        self.capabilities = Capabilities(token_ids=False, logprobs=self.managed_kind == "vllm", seeded=True)

    # -- the served model ----------------------------------------------------------------------
    def _check_model(self, configured: str | None) -> str:
        """The served model's name; refuse a server that does not serve the model being sampled."""

        listed = [m.get("id") for m in self._request("GET", "/models").get("data", [])]
        if self.process is not None:
            expected = {self.process.model}
        elif configured:
            expected = {configured}
        else:
            # An external server must name the champion: its directory, or its fingerprint (e.g. vLLM's
            # --served-model-name <fingerprint>).
            expected = {str(self.model_dir), str(self.model_dir.resolve()), model_fingerprint(self.model_dir)}
        found = [name for name in listed if name in expected]
        if not found:
            raise SamplingError(
                f"{self.url} serves {listed or 'no model'}, not the model being sampled ({self.model_dir}); "
                f"expected one of {sorted(expected)} (set sample.server.model to the served name of this model, "
                f"or serve it under its fingerprint)")
        return found[0]

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, prompts: list[str], *, k: int, seed: int, batch_size: int,
               progress: bool = False, first: int = 0) -> tuple[list[list[Completion]], SamplingStats]:
        from tqdm.auto import tqdm

        greedy = self.settings.temperature == 0
        per_prompt = 1 if greedy else k  # greedy completions are identical: one request per prompt
        rendered = self.render(prompts)
        prompt_tokens = self.prompt_tokens(prompts)
        jobs = [(i, j) for i in range(len(prompts)) for j in range(per_prompt)]
        started = time.perf_counter()
        bar = tqdm(total=len(jobs) * (k // per_prompt), desc="sampling", unit="seq", disable=not progress)
        results: dict[tuple[int, int], Completion] = {}
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                futures = {pool.submit(self._complete, prompts[i], rendered[i], prompt_tokens[i],
                                       seed + (first + i) * k + j): (i, j) for i, j in jobs}
                for future, key in futures.items():
                    results[key] = future.result()
                    bar.update(k // per_prompt)
        finally:
            bar.close()
        out = [[results[(i, 0 if greedy else j)] for j in range(k)] for i in range(len(prompts))]
        return out, SamplingStats.of(out, time.perf_counter() - started)

    def _complete(self, prompt: str, rendered: str, prompt_tokens: int, seed: int) -> Completion:
        s = self.settings
        max_tokens = s.max_new_tokens
        if self.context_length:
            max_tokens = max(1, min(max_tokens, self.context_length - prompt_tokens))
        generation = {"do_sample": s.temperature > 0, "max_new_tokens": max_tokens,
                      "eos_token_id": sorted(self.eos_ids)}
        if s.temperature > 0:
            generation.update(temperature=s.temperature, top_p=s.top_p, top_k=0)
        body: dict[str, Any] = {"model": self.served_model, "max_tokens": max_tokens, "temperature": s.temperature,
                                "top_p": s.top_p, "seed": seed, "n": 1,
                                "generation_config": json.dumps(generation)}
        if self.prompt_format.stop:
            body["stop"] = list(self.prompt_format.stop)
        if self.capabilities.logprobs:
            body["logprobs"] = 1
        if self.options.api == "chat":
            body["messages"] = self.prompt_format.messages(prompt)
            path = "/chat/completions"
        else:
            body["prompt"] = rendered[len(self.bos_prefix):] if rendered.startswith(self.bos_prefix) else rendered
            path = "/completions"
        started = time.perf_counter()
        answer = self._request("POST", path, body)
        latency = time.perf_counter() - started
        try:
            choice = answer["choices"][0]
            raw = choice["message"]["content"] if self.options.api == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise SamplingError(f"{self.url}{path}: an answer without choices[0] text: {str(answer)[:300]}") from None
        text, stopped = cut_at_stop(raw or "", list(self.prompt_format.stop))
        token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        reported = (answer.get("usage") or {}).get("completion_tokens")
        hit_length = choice.get("finish_reason") == "length" or (reported is not None and reported >= max_tokens)
        reason = "stop" if stopped else ("length" if hit_length else "eos")
        if reason == "eos":
            token_ids = token_ids + [min(self.eos_ids)]  # the model ended its answer: EOS is part of the rollout
        logprobs = _token_logprobs(choice) if self.capabilities.logprobs else None
        if logprobs is not None and len(logprobs) != len(token_ids):
            logprobs = None  # the server's tokens are not the re-tokenised text's: let the trainer recompute
        return Completion(text=text, token_ids=tuple(token_ids), finish_reason=reason, prompt_tokens=prompt_tokens,
                          completion_tokens=int(reported) if reported is not None else len(token_ids),
                          logprobs=logprobs, latency_s=latency)

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import httpx

        url = f"{self.url}{path}"
        wait = self.options.backoff_s
        for attempt in range(self.options.retries + 1):
            last = attempt == self.options.retries
            try:
                response = self.client.request(method, url, json=body)
            except httpx.TimeoutException:
                if last:
                    raise SamplingError(f"{url}: no answer within {self.options.timeout_s} s "
                                        f"(sample.backend.timeout_s), {attempt + 1} attempt(s)") from None
            except httpx.TransportError as error:
                if last:
                    raise SamplingError(f"{url}: cannot reach the inference server ({error}); is it running? "
                                        f"({attempt + 1} attempt(s))") from None
            else:
                if response.status_code == 200:
                    return response.json()
                if response.status_code not in RETRY_STATUS or last:
                    raise SamplingError(f"{url}: HTTP {response.status_code}: {response.text[:500]}")
            time.sleep(wait)
            wait *= 2
        raise AssertionError("unreachable")

    def close(self) -> None:
        client, self.client = getattr(self, "client", None), None
        if client is not None:
            client.close()
        process, self.process = getattr(self, "process", None), None
        if process is not None:
            process.stop()


def _eos_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    path = Path(model_dir) / "generation_config.json"
    configured = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
    ids = eos_token_ids(configured, tokenizer.eos_token_id)
    if not ids:
        raise SamplingError(f"{model_dir}: the tokenizer and generation_config.json define no EOS token")
    return ids


def _duplicate_bos(tokenizer: Any) -> str:
    """The BOS text a chat prompt must not start with: a template that writes BOS as text, sent to a
    server whose tokenizer adds BOS itself, would give two. "" when the tokenizer adds none."""
    bos = tokenizer.bos_token
    probe = tokenizer("x", add_special_tokens=True)["input_ids"] if bos else []
    return bos if probe and probe[0] == tokenizer.bos_token_id else ""


def _token_logprobs(choice: dict) -> tuple[float, ...] | None:
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs")
    if values is None and isinstance(logprobs.get("content"), list):  # chat completions
        values = [item.get("logprob") for item in logprobs["content"]]
    if not values or any(v is None for v in values):
        return None
    return tuple(float(v) for v in values)
