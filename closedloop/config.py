"""The typed schema of params.yaml, the project's one config file.

Every section mirrors one stage of the DAG. Unknown keys and wrong types are errors whose message
names the dotted key (``sample.k``) and the file, so a typo never silently falls back to a default.
The flows take :class:`Params` as a parameter, which is what gives the Prefect UI its form.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from closedloop.nested import deep_merge

PARAMS_FILE = "params.yaml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectParams(_Section):
    seed: int = Field(1234, description="Base seed; every stage derives its own seed from it.")


class LoopParams(_Section):
    iteration: int = Field(0, ge=0, description="Set by the loop before each iteration; seeds the new training tasks.")


class BuiltinModelParams(_Section):
    hidden_size: int = Field(192, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    intermediate_size: int = Field(576, gt=0)
    vocab_size: int = Field(1500, ge=300, description="Byte-level BPE vocabulary, trained on the generated corpus.")
    max_position_embeddings: int = Field(512, gt=0)
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


class ModelParams(_Section):
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


class SandboxParams(_Section):
    """Limits and isolation of the sandbox jobs of one environment (see closedloop/sandbox/)."""

    timeout_s: float = Field(2.0, gt=0, description="Wall-clock limit per sandboxed job.")
    memory_mb: int = Field(512, ge=64, description="Address-space limit per sandboxed job.")
    max_output_bytes: int = Field(65536, ge=1024, description="Cap on stdout, stderr, each file and returned values.")
    disk_mb: int = Field(16, ge=1, description="Size of each worker's private tmpfs holding the job directories.")
    processes: int = Field(16, ge=1, description="Processes and threads a job may have (RLIMIT_NPROC).")
    open_files: int = Field(64, ge=8, description="Open files per job (RLIMIT_NOFILE).")
    allow_exec: bool = Field(False, description="Whether jobs may run programs (execve); script environments need it.")
    isolation: Literal["auto", "bwrap", "fork"] = Field(
        "auto",
        description="auto: the strongest level available (bubblewrap + uid + seccomp), saying so when less; "
        "bwrap: refuse to run without bubblewrap; fork: no namespaces.",
    )


class SliceSizes(_Section):
    """Tasks per benchmark slice of one environment."""

    core: int = Field(30, ge=0, description="Typical tasks.")
    edge: int = Field(20, ge=0, description="Edge cases: empty inputs, ties, unicode, missing values, boundary numbers.")
    failure_modes: int = Field(20, ge=0, description="The ways models typically fail this environment.")
    heldout: int = Field(10, ge=0, description="Families or combinations the train split never emits: transfer to unseen work.")


class CustomSliceSizes(SliceSizes):
    """Tasks per benchmark slice of a user's environment: no heldout slice unless set, because only the
    environment knows which of its families train never emits (its generate must honour it)."""

    heldout: int = Field(0, ge=0, description="Families or combinations the environment's train split never emits; 0: none.")


class EnvParams(_Section):
    """What every environment's section holds; each environment adds its own knobs."""

    share: float = Field(1.0, ge=0.0, description="Relative share of training tasks and warm-start references; 0 leaves the environment out of the loop.")
    benchmark: SliceSizes = SliceSizes()
    train_file: Optional[str] = Field(None, description="A JSONL task set to draw training tasks from instead of generating them.")
    benchmark_file: Optional[str] = Field(None, description="A JSONL task set to use, whole, as this environment's benchmark.")
    weights: dict[str, float] = Field(default_factory=dict, description="Reward component weights; empty: the environment's defaults.")
    sandbox: SandboxParams = SandboxParams()

    @model_validator(mode="after")
    def _some_positive_weight(self) -> "EnvParams":
        if self.weights and not any(w > 0 for w in self.weights.values()):
            raise ValueError("weights needs at least one positive weight")
        if any(w < 0 for w in self.weights.values()):
            raise ValueError("weights must not be negative")
        return self


class CodeEnvParams(EnvParams):
    tests_per_task: int = Field(6, gt=0)
    train_file: Optional[str] = Field(
        None, description="A HumanEval-format or closedloop JSONL(.gz) to draw training tasks from instead of generating them."
    )
    benchmark_file: Optional[str] = Field(
        None, description="A HumanEval-format or closedloop JSONL(.gz) to use, whole, as the benchmark set."
    )


class DataEnvParams(EnvParams):
    # pandas is preloaded in each worker; its import alone maps several hundred MB of address space.
    sandbox: SandboxParams = SandboxParams(memory_mb=2048, timeout_s=5.0)


class ScriptEnvParams(EnvParams):
    sandbox: SandboxParams = SandboxParams(allow_exec=True, timeout_s=5.0)


class ExtractEnvParams(EnvParams):
    pass


class RulesEnvParams(EnvParams):
    show_work: bool = Field(
        False,
        description="References show each rule's comparison before its answer ('R1: age 52 is not <= 30: no'), so the "
                    "policy learns to look the attribute up before it compares; the verifier reads both forms.",
    )


class CustomEnvParams(EnvParams):
    """A user's environment: its class comes from ``entry``, its own settings from ``options``."""

    entry: str = Field(description="'package.module:Class', or the name of a 'closedloop.environments' entry point.")
    options: dict[str, Any] = Field(default_factory=dict, description="Passed to the environment as params.options.")
    benchmark: CustomSliceSizes = CustomSliceSizes()


BUILTIN_ENVS = ("code", "data", "script", "extract", "rules")


class EnvsParams(_Section):
    code: CodeEnvParams = CodeEnvParams()
    data: DataEnvParams = DataEnvParams()
    script: ScriptEnvParams = ScriptEnvParams()
    extract: ExtractEnvParams = ExtractEnvParams()
    rules: RulesEnvParams = RulesEnvParams()
    custom: dict[str, CustomEnvParams] = Field(default_factory=dict, description="Users' environments by name.")

    @model_validator(mode="after")
    def _custom_names_free(self) -> "EnvsParams":
        taken = sorted(set(self.custom) & set(BUILTIN_ENVS))
        if taken:
            raise ValueError(f"envs.custom: {taken} are built-in environment names; pick another name")
        if not any(section.share > 0 for _, section in self.sections()):
            raise ValueError("envs: every environment has share 0; at least one must take part in the loop")
        return self

    def sections(self) -> list[tuple[str, EnvParams]]:
        """(name, section) of every environment, built-in first, in a fixed order."""
        return [(name, getattr(self, name)) for name in BUILTIN_ENVS] + sorted(self.custom.items())

    def section(self, name: str) -> EnvParams:
        for known, section in self.sections():
            if known == name:
                return section
        raise ValueError(f"unknown environment {name!r}; known: {[n for n, _ in self.sections()]}")

    def active(self) -> list[str]:
        """Environments that take part in the loop (share > 0)."""
        return [name for name, section in self.sections() if section.share > 0]


class GenerateParams(_Section):
    n_tasks: int = Field(800, gt=0, description="New training tasks per iteration.")
    envs: list[str] = Field(
        default_factory=list,
        description="The environments the new training tasks come from, by their shares; empty: every active "
                    "one. The others are still measured on the benchmark and gated: a transfer run trains on "
                    "[code] and measures all five (the warm start and its references are unchanged).")


class SamplingSettings(_Section):
    """Settings shared by rollouts and benchmark evaluation (the gate compares like with like)."""

    temperature: float = Field(1.0, ge=0.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(96, gt=0)
    stop: Optional[list[str]] = Field(
        None, description="Stop strings; empty: by prompt format (raw: the ends of one function or script, "
                          "\\ndef \\nclass \\nif __name__ \\nprint(; chat: none, the end-of-turn token ends a reply).",
    )


class HfBackendParams(_Section):
    """transformers on this process: today's decoder, on model.device and model.dtype."""

    name: Literal["hf"] = "hf"


class VllmBackendParams(_Section):
    """Offline vLLM (``vllm.LLM``) on the champion directory; needs the ``vllm`` extra and a GPU."""

    name: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split over.")
    max_model_len: Optional[int] = Field(None, gt=0, description="Context vLLM allocates for; empty: the model's.")
    enforce_eager: bool = Field(False, description="Skip CUDA graph capture (faster start, slower decoding).")


class OpenAIBackendParams(_Section):
    """Any OpenAI-compatible server (vLLM serve, SGLang, TGI, transformers serve): see sample.server."""

    name: Literal["openai"] = "openai"
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


class ServerParams(_Section):
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


class HumanSourceParams(_Section):
    """The human review labels as a feedback source (data/labels/human.jsonl, component ``human``)."""

    weight: Optional[float] = Field(
        None, ge=0.0, description="Weight of the human component where a label applies; empty: as much as "
                                  "the environment's heaviest verifier component.",
    )


class FeedbackSourceParams(_Section):
    """A user's feedback source (an LLM judge, a style check...): its class from ``entry``."""

    entry: str = Field(description="'package.module:Class', or the name of a 'closedloop.feedback_sources' "
                                   "entry point; see closedloop/rewards/feedback.py.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the class.")
    weights: dict[str, float] = Field(
        default_factory=dict, description="Weight per component of the source; missing: as much as each "
                                          "environment's heaviest verifier component.",
    )

    @field_validator("weights")
    @classmethod
    def _weights_not_negative(cls, value: dict[str, float]) -> dict[str, float]:
        negative = {name: weight for name, weight in value.items() if weight < 0}
        if negative:
            raise ValueError(f"weights must not be negative, got {negative}")
        return value


class RewardParams(_Section):
    workers: int = Field(0, ge=0, description="Sandbox worker processes; 0 means one per core.")
    human: HumanSourceParams = HumanSourceParams()
    sources: dict[str, FeedbackSourceParams] = Field(
        default_factory=dict, description="Users' feedback sources by name, beside the verifiers and human labels.",
    )

    @field_validator("sources")
    @classmethod
    def _source_names_free(cls, value: dict[str, FeedbackSourceParams]) -> dict[str, FeedbackSourceParams]:
        # The rows name sources as verifier:<env>, component:<env>/<c>, human, combiner, source:<name>.
        bad = sorted(name for name in value if name in ("human", "combiner") or not name.isidentifier())
        if bad:
            raise ValueError(f"source names {bad} are taken or not identifiers (letters, digits, _)")
        return value


class GradeParams(_Section):
    fix_pairs_per_task: int = Field(2, ge=0, description="Failure→fix pairs built per task at most.")
    max_task_pass_rate: float = Field(
        1.0, ge=0.0, le=1.0,
        description="Positives only from tasks whose samples passed at most this often (1: every task).",
    )
    unsolved_references: bool = Field(
        True,
        description="Put the reference of each task no sample solved into the training set (rft), "
                    "so tasks the policy never solves still teach it something.",
    )


class ShapingParams(_Section):
    """Process supervision: the verifier's step signals added to the reward the trainer optimises."""

    progress: float = Field(
        0.2, ge=0.0,
        description="Weight of the fraction of the verifier's steps that held (parses, runs, valid JSON, format...).",
    )
    steps: dict[str, float] = Field(
        default_factory=dict, description="Extra weight per named step signal, e.g. {runs: 0.1}; any environment's names.",
    )
    base: Literal["combined", "passed"] = Field(
        "combined",
        description="What the shaped reward starts from: combined, the environment's weighted components (partial "
                    "credit included); passed, 1 when the verifier passed the sample, else 0 (the verdict rft keeps).",
    )


class GrpoParams(_Section):
    lr: float = Field(1e-4, gt=0, description="Learning rate in grpo mode (train.lr is for sft and rft).")
    clip: float = Field(0.2, gt=0.0, lt=1.0, description="Policy-ratio clip range: [1 - clip, 1 + clip].")
    beta: float = Field(0.0, ge=0.0, description="Weight of the KL penalty to the sampling policy (0: none).")
    epochs: float = Field(1.0, gt=0.0, description="Passes over the batch's rollouts; sets the steps in grpo mode.")
    scale_advantages: bool = Field(True, description="Divide advantages by their group's standard deviation.")
    negative_weight: float = Field(
        1.0, ge=0.0, description="Weight of below-mean advantages (1: standard GRPO; 0: reinforce only what beat the group).",
    )
    loss: Literal["dapo", "grpo", "dr_grpo"] = Field(
        "dapo",
        description="How token losses become the batch's loss, as TRL names it: dapo, the mean over every completion "
                    "token of the batch; grpo, each completion's mean, then the mean over completions; dr_grpo, the "
                    "token sum over completions x sample.max_new_tokens (no length normalisation).",
    )
    epsilon_high: Optional[float] = Field(
        None, gt=0.0, lt=1.0,
        description="Clip-higher (DAPO): the ratio's upper bound is 1 + epsilon_high; empty: 1 + clip.",
    )
    rounds: int = Field(
        1, ge=1, le=64,
        description="Generations per train stage. 1: train on the sample stage's batch, drawn from the champion. "
                    "R > 1: the batch's tasks are cut into R parts; the first trains on the sample stage's samples, "
                    "each later part is sampled from the policy as trained so far, scored by the reward stage's "
                    "feedback sources and trained on (on-policy, as TRL's steps_per_generation).",
    )


class ReplayParams(_Section):
    last: int = Field(
        2, ge=0, description="Mix in the positives of this many earlier iterations' batches (DVC experiments); 0: none.",
    )
    versions: list[str] = Field(
        default_factory=list,
        description="The experiments replayed; set by the loop from `last` before each iteration (a value written by "
                    "hand is overwritten by the next `closedloop run`; set `last: 0` to replay none).",
    )
    max_fraction: float = Field(0.5, ge=0.0, lt=1.0, description="Cap on replayed examples in the training set.")


class LoraParams(_Section):
    enabled: bool = Field(False, description="Train LoRA adapters (PEFT) and merge them, instead of every weight.")
    r: int = Field(16, gt=0, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Adapter dropout (0 keeps training deterministic).")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainParams(_Section):
    mode: Literal["sft", "rft", "grpo"] = Field(
        "rft",
        description="sft: references only; rft: the batch's positives and fixes; grpo: group-relative policy optimisation on all k samples.",
    )
    steps: int | None = Field(
        400, ge=0,
        description="Optimiser steps in sft and rft modes; null: `epochs` passes over the training mix, so the "
                    "budget follows what is new (grpo: grpo.epochs).",
    )
    epochs: float = Field(3.0, gt=0, description="Passes over the training mix when `steps` is unset.")
    reference_fraction: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="rft: cap on the warm-start references' share of the training mix (a seeded subset of them "
                    "rides along with the batch's new examples, so the loop does not forget them); null: all of "
                    "them, whatever the batch holds.",
    )
    batch_size: int = Field(32, gt=0, description="Examples (grpo: rollouts) per step.")
    lr: float = Field(1e-3, gt=0, description="Learning rate in sft and rft modes.")
    warmup_steps: int = Field(10, ge=0)
    include_fix_pairs: bool = True
    max_fix_fraction: float = Field(0.25, ge=0.0, le=1.0, description="Cap on fix pairs in the training set.")
    include_references: bool = Field(
        True, description="Mix the warm-start references back in, so the loop does not forget them."
    )
    checkpoint_every: int = Field(
        25, ge=0, description="Save the training state every N steps; a killed train stage resumes from it (0: never)."
    )
    micro_batch_size: int = Field(
        0, ge=0, description="Examples per forward pass, gradients accumulated up to batch_size (0: the whole batch).",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward: less memory, ~30% slower.")
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "fp32",
        description="sft, rft and the warm start: bf16 runs the forward's matrix products in bfloat16 (torch.autocast; "
                    "weights, gradients and optimizer state stay float32); fp32 does not; auto: bf16 where the device "
                    "computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX), else fp32. grpo "
                    "always trains in fp32.",
    )
    shaping: ShapingParams = ShapingParams()
    grpo: GrpoParams = GrpoParams()

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _not_a_yaml_boolean(cls, value: Any) -> Any:
        # YAML reads off/no/false (and on/yes/true) as booleans: say what to write instead of "got False".
        if isinstance(value, bool):
            raise ValueError(f"got the YAML boolean {str(value).lower()} (off/on/no/yes read as one): "
                             "write fp32, bf16 or auto")
        return value
    replay: ReplayParams = ReplayParams()
    lora: LoraParams = LoraParams()


class WarmstartParams(_Section):
    n_references: int = Field(1500, gt=0, description="Reference solutions the warm start learns from.")
    steps: int = Field(800, ge=0)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    tokenizer_corpus_tasks: int = Field(2000, gt=0, description="Generated tasks the builtin tokenizer is trained on.")
    lora: bool = Field(False, description="Warm-start a real model with LoRA adapters (train.lora's settings), merged.")


class EvaluateParams(_Section):
    samples_per_task: int = Field(4, gt=0, description="pass@1 is averaged over this many samples per task.")
    batch_size: int = Field(256, gt=0)


# The monitors' names, fixed: closedloop/monitors/registry.py implements one function per name.
MONITOR_NAMES = (
    "reward_shift", "verifier_shift", "proxy_gold_divergence", "length_inflation",
    "format_only_wins", "grpo_health", "anomaly_rates", "canary",
)
# Those whose default thresholds only warn (fail: null). Kept here, not read from the registry: config.py
# is code of every stage, so importing the monitors would make an edit to one rerun the whole pipeline.
# A test holds it equal to the registry's defaults.
WARN_ONLY_MONITORS = ("reward_shift", "verifier_shift")


class MonitorThreshold(_Section):
    """Above ``warn`` a monitor warns, above ``fail`` it fails (every monitor's value is higher-is-worse)."""

    warn: float = Field(description="The monitor warns when its value exceeds this.")
    fail: Optional[float] = Field(
        None, description="The monitor fails when its value exceeds this (null: it only ever warns).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> "MonitorThreshold":
        if self.fail is not None and self.fail < self.warn:
            raise ValueError(f"fail ({self.fail}) must not be below warn ({self.warn})")
        return self


class MonitorsParams(_Section):
    enabled: bool = Field(True, description="Run the monitors stage's checks (off: every monitor is skipped).")
    history: int = Field(3, ge=0, description="Previous iterations' batches (DVC experiments) each batch is compared with.")
    versions: list[str] = Field(
        default_factory=list,
        description="The experiments compared with, oldest first; set by the loop from `history` before each iteration.",
    )
    block_promotion: list[str] = Field(
        default_factory=list, description="Monitors whose fail makes the gate hold the candidate.",
    )
    thresholds: dict[str, MonitorThreshold] = Field(
        default_factory=dict, description="Per-monitor {warn, fail} overriding the defaults (closedloop/monitors).",
    )
    canary_per_env: int = Field(
        4, ge=0, description="Benchmark tasks per environment in the canary set (their references and blank answers).",
    )

    @field_validator("block_promotion")
    @classmethod
    def _known_blocking(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in MONITOR_NAMES]
        if unknown:
            raise ValueError(f"unknown monitor {', '.join(map(repr, unknown))}; the monitors are {', '.join(MONITOR_NAMES)}")
        return names

    @field_validator("thresholds")
    @classmethod
    def _known_thresholds(cls, thresholds: dict) -> dict:
        unknown = [name for name in thresholds if name not in MONITOR_NAMES]
        if unknown:
            raise ValueError(f"unknown monitor {', '.join(map(repr, unknown))}; the monitors are {', '.join(MONITOR_NAMES)}")
        return thresholds

    @model_validator(mode="after")
    def _blocking_can_fail(self) -> "MonitorsParams":
        # A monitor that only warns (its fail threshold is null) would sit in block_promotion holding
        # nothing, silently: refuse it, naming the threshold to set.
        for name in self.block_promotion:
            given = self.thresholds.get(name)
            if (given.fail is None) if given is not None else name in WARN_ONLY_MONITORS:
                raise ValueError(f"monitors.block_promotion: {name!r} only warns (its fail threshold is null), so it "
                                 f"could never hold the gate; set monitors.thresholds.{name}.fail")
        return self


class GateParams(_Section):
    min_improvement: float = Field(0.0, ge=0.0, description="Overall pass@1 gain the candidate must exceed.")
    slice_tolerance: float = Field(0.05, ge=0.0, description="Largest pass@1 drop allowed on any env or env/slice.")
    noise_z: float = Field(
        2.0, ge=0.0,
        description="A drop is a regression only beyond this many standard errors of the difference too (0: tolerance only).",
    )
    confirm_samples: int = Field(
        16, ge=0,
        description="An env or slice that regressed is evaluated again, both models, with this many samples per task and a new seed, and decided on those figures (0: decide on the first).",
    )


class ReviewStrata(_Section):
    """How the review sample is drawn: evenly over environment × bucket, plus the disagreements."""

    per_env_bucket: int = Field(1, ge=0, description="Samples drawn from each environment × grading bucket.")
    partial_failed: int = Field(2, ge=0, description="Samples with partial credit whose verdict is fail.")
    validators_disagree: int = Field(2, ge=0, description="Samples whose reward components disagree (one 1, another 0).")
    near_threshold: int = Field(2, ge=0, description="Samples whose reward lies within `margin` of `threshold`.")
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="The reward a near-threshold sample is close to.")
    margin: float = Field(0.1, ge=0.0, le=1.0)


class ReviewParams(_Section):
    mode: Literal["off", "async", "before_promotion"] = Field(
        "async",
        description="off: no human review; async: each iteration draws a review sample that people answer "
        "when they can (the next iteration reads the answers); before_promotion: the gate waits for the review.",
    )
    size: int = Field(24, ge=0, description="Most samples one review shows (strata first, then disagreements).")
    strata: ReviewStrata = ReviewStrata()
    timeout_s: float = Field(
        3600.0, gt=0, description="before_promotion: how long the gate waits; then the iteration continues without human scores.",
    )


class TrackingParams(_Section):
    uri: Optional[str] = Field(
        None, description="MLflow tracking URI; default sqlite:///<workspace>/mlflow.db. MLFLOW_TRACKING_URI overrides."
    )
    experiment: str = "closedloop"
    registered_model: str = "closedloop-policy"
    log_weights: bool = Field(
        False, description="Also log each model version's weights to MLflow in full (transformers flavor); "
        "by default a version holds only a reference to its DVC-tracked folder.",
    )


class VersioningParams(_Section):
    push: bool = Field(True, description="dvc push every batch and model to the default DVC remote.")
    save_experiments: bool = Field(True, description="Save each iteration as a DVC experiment ref.")


class RayParams(_Section):
    address: str = Field(
        "", description="Ray cluster to run shards on ('ray://head:10001', 'auto', 'host:6379'); empty: the "
        "one this process is already connected to (prefect-ray's), else Ray's default (RAY_ADDRESS, a cluster "
        "`ray start` began on this machine, or a new local Ray for the stage).",
    )
    workers: int = Field(2, ge=1, description="Ray actors a sharded stage starts (each its own sampler or sandbox pools).")
    num_cpus: float = Field(1.0, ge=0.0, description="CPUs each sampling or reward actor asks for.")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs each sampling actor asks for (reward actors ask for none).")
    train_num_cpus: float = Field(1.0, ge=0.0, description="CPUs the training task asks for.")
    train_num_gpus: float = Field(0.0, ge=0.0, description="GPUs the training task asks for.")
    retries: int = Field(2, ge=0, description="How often a shard whose worker was lost (killed, node gone) is run again.")
    placement_timeout_s: float = Field(
        120.0, gt=0, description="How long a stage waits for its Ray actors to be placed and ready before it fails, "
        "naming the resources they asked for and what the cluster has.",
    )


class ExecutionParams(_Section):
    backend: Literal["local", "ray"] = Field(
        "local", description="Where shards run: local (this machine, in the stage's process and its sandbox "
        "pools) or ray (Ray actors and tasks on execution.ray.address). Results are the same on both.",
    )
    shards: int = Field(
        1, ge=1, description="Shards the sample stage cuts its tasks into, and the reward stage each "
        "environment's verifications into; samples and rewards do not depend on it.",
    )
    ray: RayParams = RayParams()


class Params(_Section):
    project: ProjectParams = ProjectParams()
    loop: LoopParams = LoopParams()
    model: ModelParams = ModelParams()
    envs: EnvsParams = EnvsParams()
    generate: GenerateParams = GenerateParams()
    sample: SampleParams = SampleParams()
    reward: RewardParams = RewardParams()
    grade: GradeParams = GradeParams()
    warmstart: WarmstartParams = WarmstartParams()
    train: TrainParams = TrainParams()
    evaluate: EvaluateParams = EvaluateParams()
    monitors: MonitorsParams = MonitorsParams()
    gate: GateParams = GateParams()
    review: ReviewParams = ReviewParams()
    tracking: TrackingParams = TrackingParams()
    versioning: VersioningParams = VersioningParams()
    execution: ExecutionParams = ExecutionParams()

    @model_validator(mode="after")
    def _combinations_that_work(self) -> "Params":
        # Refused here, at load, rather than in the train stage after sampling and reward have run.
        if self.train.mode == "grpo" and self.sample.temperature == 0:
            raise ValueError("train.mode is grpo but sample.temperature is 0: greedy samples of a task are "
                             "identical, so no group has a reward spread to learn from")
        if self.sample.backend.name == "vllm" and self.model.device == "cpu":
            raise ValueError("sample.backend is vllm but model.device is cpu: vLLM samples on GPUs; "
                             "use the hf backend on CPU, or model.device auto | cuda")
        unknown = sorted(set(self.generate.envs) - set(self.envs.active()))
        if unknown:
            raise ValueError(f"generate.envs: {unknown} are not active environments; expected names from "
                             f"{self.envs.active()} (an environment with share 0 takes no part in the loop)")
        if self.train.micro_batch_size > self.train.batch_size:
            raise ValueError(f"train.micro_batch_size ({self.train.micro_batch_size}) must not exceed "
                             f"train.batch_size ({self.train.batch_size})")
        return self

    def stage_seed(self, stage: str, per_iteration: bool = True) -> int:
        """A seed per stage (and per iteration unless ``per_iteration`` is False), so no two stages
        share a random stream and each iteration draws new training tasks."""
        import zlib

        iteration = self.loop.iteration if per_iteration else 0
        return (self.project.seed * 1_000_003 + iteration * 7919 + zlib.crc32(stage.encode())) % 2**31


class ConfigError(ValueError):
    """params.yaml is missing, unreadable, or does not match the schema."""


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            got = item.get("input")
            got_text = "" if isinstance(got, dict) else f" (got {got!r})"
            lines.append(f"  {key}: {item['msg']}{got_text}")
    return "\n".join(lines)


def parse_params(data: object, source: str = PARAMS_FILE) -> Params:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        return Params.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, source)) from None


def given_settings(given: Params, baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings a caller actually gave, as a nested dict: the keys set explicitly in ``given``
    (pydantic's fields-set, so a partial ``{"train": {"steps": 12}}`` is one key, not every default),
    less those equal to ``baseline``.

    ``baseline`` is what the caller's form started from (a deployment's default parameters, a
    snapshot of params.yaml taken when it was served): a value left as the form showed it is not a
    wish to change the workspace, which may have moved on since (the loop bumps loop.iteration)."""
    wanted = given.model_dump(mode="json", exclude_unset=True)
    return _changed(wanted, baseline) if baseline is not None else wanted


def _changed(wanted: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in wanted.items():
        before = baseline.get(key, _MISSING) if isinstance(baseline, Mapping) else _MISSING
        if isinstance(value, dict) and isinstance(before, Mapping):
            nested = _changed(value, before)
            if nested:
                out[key] = nested
        elif value != before:
            out[key] = value
    return out


_MISSING = object()


def merge_settings(base: Params, settings: Mapping[str, Any], source: str) -> Params:
    """``base`` with ``settings`` (a nested dict, possibly partial) laid over it, validated as a whole:
    a bad value fails here, with ``source`` and the key named, before anything is written."""

    return parse_params(deep_merge(base.model_dump(mode="json"), settings), source)


def load_params(workspace: Path | str = ".") -> Params:
    """Read and validate ``params.yaml`` of a workspace. Never called at import time."""
    import yaml

    path = Path(workspace) / PARAMS_FILE
    if not path.exists():
        raise ConfigError(f"{path}: not found (run `closedloop init` to create a workspace)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_params(data, str(path))


def write_params(workspace: Path | str, params: Params) -> bool:
    """Write ``params`` into params.yaml, keeping the file's comments and key order.

    Returns True when the file changed. Every key is written, defaults included, because DVC reads
    the exact keys each stage lists from this file; values already right are left untouched, so a
    params.yaml a person wrote stays readable after the loop bumps ``loop.iteration``.
    """
    from ruamel.yaml import YAML

    path = Path(workspace) / PARAMS_FILE
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 120
    document = yaml.load(path.read_text()) if path.exists() else None
    if document is None:
        from ruamel.yaml.comments import CommentedMap

        document = CommentedMap()
    changed = _merge(document, params.model_dump(mode="json"))
    if changed or not path.exists():
        tmp = path.with_suffix(".yaml.tmp")
        with tmp.open("w") as handle:
            yaml.dump(document, handle)
        tmp.replace(path)
    return changed


def _merge(document: dict, wanted: dict) -> bool:
    changed = False
    for key, value in wanted.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            changed |= _merge(document[key], value)
        elif key not in document or document[key] != value:
            document[key] = value
            changed = True
    return changed


def default_params_yaml() -> str:
    """params.yaml with every default and each field's description as a comment."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    def build(model: BaseModel) -> CommentedMap:
        node = CommentedMap()
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            node[name] = build(value) if isinstance(value, BaseModel) else _plain(value)
            if info.description:
                node.yaml_add_eol_comment(info.description, name)
        return node

    yaml = YAML()
    yaml.width = 120
    buffer = io.StringIO()
    yaml.dump(build(Params()), buffer)
    header = (
        "# closedloop — the one config file, typed by closedloop/config.py.\n"
        "# Unknown keys and wrong types are errors that name the key. The loop sets loop.iteration.\n"
    )
    return header + buffer.getvalue()


def _plain(value):
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value
