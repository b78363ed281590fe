"""The ``vllm`` backend: offline ``vllm.LLM`` on the model directory, on GPUs.

Written against vLLM's documented offline API (``LLM``, ``SamplingParams(n, seed, logprobs, stop)``,
``RequestOutput.outputs[i].token_ids / .logprobs / .finish_reason``). Log-probabilities are asked for
after temperature (``logprobs_mode="processed_logprobs"``): vLLM V1 returns them before it by
default, which is not the distribution the tokens were drawn from. Weight sync between iterations is
a new engine on the saved champion directory, which the sample stage opens each iteration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from closedloop.sampling.base import Capabilities, Completion, SamplerBase, SamplingError, SamplingStats


class VllmSampler(SamplerBase):
    backend = "vllm"
    capabilities = Capabilities(token_ids=True, logprobs=True, seeded=True)

    def __init__(self, params: Any, model_dir: Path) -> None:
        super().__init__(params, model_dir)
        try:
            import vllm
        except ImportError as error:
            raise SamplingError(
                f"sample.backend is vllm but vllm does not import ({error}); install the extra: "
                "pip install 'closedloop[vllm]' (needs CUDA)") from None
        options = params.sample.backend
        dtype = params.model.dtype
        self.llm = vllm.LLM(
            model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=params.project.seed,
            gpu_memory_utilization=options.gpu_memory_utilization,
            tensor_parallel_size=options.tensor_parallel_size, max_model_len=options.max_model_len,
            enforce_eager=options.enforce_eager, logprobs_mode="processed_logprobs",
        )
        self._vllm = vllm
        self._resolve_prompt_format(self.llm.get_tokenizer())
        self.context_length = self.llm.llm_engine.model_config.max_model_len

    def sample(self, prompts: list[str], *, k: int, seed: int, batch_size: int,
               progress: bool = False, first: int = 0) -> tuple[list[list[Completion]], SamplingStats]:
        import time

        s = self.settings
        greedy = s.temperature == 0
        per_prompt = 1 if greedy else k
        prompt_ids = [self.tokenizer(p, add_special_tokens=self.prompt_format.add_special_tokens)["input_ids"]
                      for p in self.render(prompts)]
        started = time.perf_counter()
        # One SamplingParams per prompt, so prompt i's samples depend on (seed, its position first + i)
        # only, not on how vLLM schedules the batch or how the stage sharded it.
        sampling = [self._vllm.SamplingParams(
            n=per_prompt, temperature=s.temperature, top_p=s.top_p, seed=seed + first + i,
            max_tokens=max(1, min(s.max_new_tokens, self.context_length - len(ids))), stop=list(self.prompt_format.stop) or None,
            logprobs=0, include_stop_str_in_output=False) for i, ids in enumerate(prompt_ids)]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling, use_tqdm=progress)
        latency = time.perf_counter() - started
        results = []
        for ids, output in zip(prompt_ids, outputs):
            row = []
            for choice in output.outputs:
                token_ids = tuple(choice.token_ids)
                logprobs = tuple(float(step[token].logprob) for step, token in zip(choice.logprobs or [], token_ids))
                # vLLM says "stop" for EOS and for a stop string alike; stop_reason names the string.
                if choice.finish_reason == "stop":
                    reason = "eos" if choice.stop_reason is None else "stop"
                else:
                    reason = "length"
                row.append(Completion(text=choice.text, token_ids=token_ids, finish_reason=reason,
                                      prompt_tokens=len(ids), completion_tokens=len(token_ids),
                                      logprobs=logprobs if len(logprobs) == len(token_ids) else None,
                                      latency_s=latency))
            results.append(row * k if greedy else row)
        return results, SamplingStats.of(results, time.perf_counter() - started)

    def close(self) -> None:
        self.llm = None
