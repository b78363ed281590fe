"""docs/configuration-reference.md is the rendering of closedloop/config/, so it cannot drift from it."""

from pathlib import Path

from closedloop.config import Params
from closedloop.config.reference import COMMAND, OUTPUT, render_reference

ROOT = Path(__file__).resolve().parents[2]


def test_committed_reference_is_the_rendering():
    committed = (ROOT / OUTPUT).read_text()
    assert committed == render_reference(), (
        f"{OUTPUT} differs from closedloop/config/; regenerate it from the repository root: {COMMAND}")


def test_every_key_is_in_the_reference_with_its_default():
    reference = render_reference()

    def walk(node: dict, path: str) -> None:
        for key, value in node.items():
            dotted = f"{path}.{key}" if path else key
            if isinstance(value, dict) and value and dotted != "sample.backend":
                walk(value, dotted)
            else:
                assert f"| `{dotted}` |" in reference, dotted

    walk(Params().model_dump(mode="json"), "")
    assert "| `envs.data.sandbox.memory_mb` | `int`, ≥ 32 | `2048` |" in reference  # the section's own default
    assert "| `envs.custom.<name>.entry` | `str` | required |" in reference
    assert "`sample.backend.tensor_parallel_size`" in reference  # each backend's keys
