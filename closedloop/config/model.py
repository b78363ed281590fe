"""The policy and how it samples: model, sample (its backends and server) and evaluate."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from closedloop.config.base import Section


class BuiltinModelParams(Section):
    hidden_size: int = Field(192, gt=0, description="Width of the built-in Llama-style transformer.")
    num_layers: int = Field(4, gt=0, description="Transformer blocks.")
    num_heads: int = Field(4, gt=0, description="Attention heads per block; they must divide hidden_size.")
    intermediate_size: int = Field(576, gt=0, description="Width of each block's MLP.")
    vocab_size: int = Field(1500, ge=300, description="Byte-level BPE vocabulary, trained on the generated corpus.")
    max_position_embeddings: int = Field(512, gt=0, description="Longest sequence, prompt and completion, in tokens.")
    split_digits: bool = Field(
        True, description="One token per digit, so copying or comparing a number is the same step for "
                          "every number rather than a lookup of rare multi-digit tokens.",
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "BuiltinModelParams":
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.builtin.hidden_size ({self.hidden_size}) must be divisible by "
                f"model.builtin.num_heads ({self.num_heads})"
            )
        return self


class ModelParams(Section):
    name_or_path: str = Field(
        "builtin:tiny",
        description="'builtin:tiny', a local Hugging Face model directory, or a hub id.",
    )
    builtin: BuiltinModelParams = BuiltinModelParams()
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where sampling, training and evaluation run; auto: cuda when a GPU is present, else cpu.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights' dtype; auto: the model's own (float32 for the built-in, bfloat16 on cuda when it has none).",
    )


class SamplingSettings(Section):
    """Settings shared by rollouts and benchmark evaluation (the gate compares like with like)."""

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Nucleus sampling: draw from the likeliest tokens whose probability adds up to this (1: all).",
    )
    max_new_tokens: int = Field(96, gt=0, description="Most tokens generated per sample.")
    stop: Optional[list[str]] = Field(
        None, description="Stop strings; empty: by prompt format (raw: the ends of one function or script, "
                          "\\ndef \\nclass \\nif __name__ \\nprint(; chat: none, the end-of-turn token ends a reply).",
    )


class HfBackendParams(Section):
    """transformers on this process: today's decoder, on model.device and model.dtype."""

    name: Literal["hf"] = Field("hf", description="Which backend: hf, vllm or openai.")


class VllmBackendParams(Section):
    """Offline vLLM (``vllm.LLM``) on the champion directory; needs the ``vllm`` extra and a GPU."""

    name: Literal["vllm"] = Field("vllm", description="Which backend: hf, vllm or openai.")
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split over.")
    max_model_len: Optional[int] = Field(None, gt=0, description="Context vLLM allocates for; empty: the model's.")
    enforce_eager: bool = Field(False, description="Skip CUDA graph capture (faster start, slower decoding).")


class OpenAIBackendParams(Section):
    """Any OpenAI-compatible server (vLLM serve, SGLang, TGI, transformers serve): see sample.server."""

    name: Literal["openai"] = Field("openai", description="Which backend: hf, vllm or openai.")
    api: Literal["completions", "chat"] = Field(
        "completions", description="completions: the formatted prompt as text (exact); chat: /v1/chat/completions.",
    )
    concurrency: int = Field(8, ge=1, description="Requests in flight at once.")
    timeout_s: float = Field(120.0, gt=0, description="Limit per request.")
    retries: int = Field(3, ge=0, description="Retries of a failed request (connection errors, 5xx, 429), with backoff.")
    backoff_s: float = Field(0.5, ge=0, description="First retry's wait; doubles each retry.")


SampleBackend = Annotated[
    Union[HfBackendParams, VllmBackendParams, OpenAIBackendParams], Field(discriminator="name")
]


class ServerParams(Section):
    """The OpenAI-compatible inference server the ``openai`` backend talks to."""

    managed: bool = Field(
        False, description="Start a server on the champion for the sample and evaluate stages and stop it afterwards.",
    )
    url: Optional[str] = Field(
        None, description="An external server's base URL (http://host:port/v1); it must serve the champion.",
    )
    model: Optional[str] = Field(
        None, description="The model name an external server serves; empty: the champion's fingerprint must match.",
    )
    command: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="What a managed server runs: vllm serve on a GPU, transformers serve on CPU (auto).",
    )
    port: int = Field(0, ge=0, lt=65536, description="Port of a managed server; 0: a free one.")
    startup_timeout_s: float = Field(300.0, gt=0, description="How long a managed server may take to become ready.")


class SampleParams(SamplingSettings):
    backend: SampleBackend = Field(
        default_factory=HfBackendParams,
        description="hf | vllm | openai, or a mapping of the backend's keys beside its name, e.g. {name: openai, "
                    "api: chat, concurrency: 16} or {name: vllm, tensor_parallel_size: 2, max_model_len: 4096}; "
                    "see docs/your-model.md.",
    )
    server: ServerParams = ServerParams()
    prompt_format: Literal["auto", "raw", "chat"] = Field(
        "auto", description="raw: the task prompt as text; chat: the tokenizer's chat template; "
                            "auto: chat when the tokenizer has a template and the model is not the built-in.",
    )
    system_prompt: Optional[str] = Field(None, description="System message of chat prompts; empty: none.")
    settings_mismatch: Literal["error", "warn"] = Field(
        "error", description="When the settings differ from those a model's rollouts used: fail, or warn."
    )
    k: int = Field(8, gt=0, description="Samples per task.")
    batch_size: int = Field(256, gt=0, description="Sequences generated together.")
    rounds: int = Field(
        1, ge=1, le=16,
        description="Rounds of an episode: 1 samples one attempt per sample; R > 1 shows each failed attempt's "
                    "visible-check feedback and samples again, up to R attempts (docs/episodes.md).",
    )
    trim_transcript: bool = Field(
        False,
        description="Episodes: when the next transcript would not fit the model's context, leave out its oldest "
                    "attempts (and their feedback) until it fits, the latest always kept, instead of ending the "
                    "episode (which it still does when the latest alone does not fit).",
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _backend_by_name(cls, value: Any) -> Any:
        # `backend: openai` is shorthand for `backend: {name: openai}` with its defaults.
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _server_fits_backend(self) -> "SampleParams":
        name = self.backend.name
        server = self.server
        if name == "openai" and not server.managed and not server.url:
            raise ValueError("sample.backend is openai but sample.server has neither managed: true nor a url")
        if name == "openai" and server.managed and server.url:
            raise ValueError(f"sample.server.managed is true and sample.server.url is {server.url!r}: "
                             "a managed server has its own URL; set one or the other")
        if name != "openai" and (server.managed or server.url):
            what = "managed: true" if server.managed else f"url: {server.url!r}"
            raise ValueError(f"sample.server has {what} but sample.backend is {name!r}; "
                             "only the openai backend talks to a server")
        return self


class EvaluateParams(Section):
    samples_per_task: int = Field(4, gt=0, description="pass@1 is averaged over this many samples per task.")
    batch_size: int = Field(256, gt=0, description="Sequences generated together.")

