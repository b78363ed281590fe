"""The train stage's budget: the step count follows what the batch brought, references ride along capped."""

from __future__ import annotations

import pytest

from closedloop.training.modes.supervised import training_budget

DEFAULTS = dict(mode="rft", steps=None, epochs=3.0, reference_fraction=0.25, batch_size=32)


def test_epochs_over_the_new_examples_and_a_capped_share_of_references():
    budget = training_budget(982, 1500, **DEFAULTS)
    assert budget.references == 327  # 327 / (982 + 327) <= 0.25
    assert budget.references / (982 + budget.references) <= 0.25 < (budget.references + 1) / (983 + budget.references)
    assert budget.steps == 123  # ceil(3 * 1309 / 32)
    assert budget.reason == "3 epochs of 1309 examples at batch 32"


def test_the_budget_grows_with_the_batch():
    small, large = training_budget(100, 1500, **DEFAULTS), training_budget(1000, 1500, **DEFAULTS)
    assert large.steps > 5 * small.steps and large.references > small.references


def test_references_never_exceed_what_there_is():
    assert training_budget(10_000, 1500, **DEFAULTS).references == 1500


def test_nothing_new_trains_nothing_in_rft():
    budget = training_budget(0, 1500, **DEFAULTS)
    assert budget.steps == 0 and budget.references == 0


def test_explicit_steps_override_the_epochs():
    budget = training_budget(982, 1500, **{**DEFAULTS, "steps": 400})
    assert budget.steps == 400 and budget.references == 327 and budget.reason == "train.steps: 400"
    assert training_budget(0, 1500, **{**DEFAULTS, "steps": 400}).steps == 0  # no data: no steps


def test_no_cap_keeps_every_reference_as_before():
    budget = training_budget(982, 1500, **{**DEFAULTS, "reference_fraction": None, "steps": 400})
    assert budget.references == 1500 and budget.steps == 400
    assert training_budget(0, 1500, **{**DEFAULTS, "reference_fraction": None}).steps == 141  # references alone


@pytest.mark.parametrize("steps, expected", [(None, 141), (50, 50)])
def test_sft_trains_on_every_reference(steps, expected):
    budget = training_budget(982, 1500, **{**DEFAULTS, "mode": "sft", "steps": steps})
    assert budget.references == 1500 and budget.steps == expected  # sft's mix is the references alone
