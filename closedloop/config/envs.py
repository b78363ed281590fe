"""The environments (their tasks, benchmark slices and sandbox limits), the generate stage, and how
samples are rewarded and graded."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from closedloop.config.base import Section
from closedloop.sandbox_limits import LIMITS


def _limit(name: str) -> Any:
    """The field of one sandbox limit, from its one declaration (closedloop/sandbox_limits.py): its
    default, its lowest allowed value and its description, as ``Limits`` checks them."""
    spec = LIMITS[name]
    bound = {} if spec.minimum is None else {"gt" if spec.exclusive else "ge": spec.minimum}
    return Field(spec.default, description=spec.description, **bound)


class SandboxParams(Section):
    """Limits and isolation of the sandbox jobs of one environment (see closedloop/sandbox/)."""

    # Each limit as closedloop/sandbox_limits.py declares it, so params.yaml accepts what the sandbox does.
    timeout_s: float = _limit("timeout_s")
    memory_mb: int = _limit("memory_mb")
    max_output_bytes: int = _limit("max_output_bytes")
    disk_mb: int = _limit("disk_mb")
    processes: int = _limit("processes")
    open_files: int = _limit("open_files")
    allow_exec: bool = _limit("allow_exec")
    isolation: Literal["auto", "bwrap", "fork"] = Field(
        "auto",
        description="auto: the strongest level available (bubblewrap + uid + seccomp), saying so when less; "
        "bwrap: refuse to run without bubblewrap; fork: no namespaces.",
    )


class SliceSizes(Section):
    """Tasks per benchmark slice of one environment."""

    core: int = Field(30, ge=0, description="Typical tasks.")
    edge: int = Field(20, ge=0, description="Edge cases: empty inputs, ties, unicode, missing values, boundary numbers.")
    failure_modes: int = Field(20, ge=0, description="The ways models typically fail this environment.")
    heldout: int = Field(10, ge=0, description="Families or combinations the train split never emits: transfer to unseen work.")


class CustomSliceSizes(SliceSizes):
    """Tasks per benchmark slice of a user's environment: no heldout slice unless set, because only the
    environment knows which of its families train never emits (its generate must honour it)."""

    heldout: int = Field(0, ge=0, description="Families or combinations the environment's train split never emits; 0: none.")


class EnvParams(Section):
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
    tests_per_task: int = Field(6, gt=0, description="Test inputs drawn for each generated task.")
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


class EnvsParams(Section):
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


class GenerateParams(Section):
    n_tasks: int = Field(800, gt=0, description="New training tasks per iteration.")
    envs: list[str] = Field(
        default_factory=list,
        description="The environments the new training tasks come from, by their shares; empty: every active "
                    "one. The others are still measured on the benchmark and gated: a transfer run trains on "
                    "[code] and measures all five (the warm start and its references are unchanged).")


class HumanSourceParams(Section):
    """The human review labels as a feedback source (data/labels/human.jsonl, component ``human``)."""

    weight: Optional[float] = Field(
        None, ge=0.0, description="Weight of the human component where a label applies; empty: as much as "
                                  "the environment's heaviest verifier component.",
    )


class FeedbackSourceParams(Section):
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


class RewardParams(Section):
    workers: int = Field(0, ge=0, description="Sandbox worker processes; 0 means one per core.")
    human: HumanSourceParams = HumanSourceParams()
    sources: dict[str, FeedbackSourceParams] = Field(
        default_factory=dict, description="Users' feedback sources by name, beside the verifiers and human labels.",
    )
    round_cost: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Episodes (sample.rounds > 1): taken from an episode's reward per round after the first "
                    "(never below 0), so a first-attempt pass earns most; 0: rounds are free.",
    )

    @field_validator("sources")
    @classmethod
    def _source_names_free(cls, value: dict[str, FeedbackSourceParams]) -> dict[str, FeedbackSourceParams]:
        # The rows name sources as verifier:<env>, component:<env>/<c>, human, combiner, source:<name>.
        bad = sorted(name for name in value if name in ("human", "combiner") or not name.isidentifier())
        if bad:
            raise ValueError(f"source names {bad} are taken or not identifiers (letters, digits, _)")
        return value


class GradeParams(Section):
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

