"""The step-cost model learns the machine it runs on, far from its prior either way."""

import random

import pytest

from homeai.sched.costmodel import PRIOR, StepCostModel, StepShape

MACHINES = {
    "large model on a CPU": (85.0, 12.0, 1.5, 1.0),
    "small model on a CPU": (11.0, 3.4, 1.2, 1.0),
    "8B model on a GPU": (12.0, 0.12, 0.01, 0.05),
}


def _a_run(rng):
    """Steps as a burst of chats gives them: prompts read beside decodes, then a long drain
    in which every step decodes the same few sequences (features that move together)."""
    cells = 0
    for step in range(300):
        readers = rng.randint(4, 12)
        prompt = rng.choice([0, 0, 0, rng.randint(8, 64)])
        cells = rng.randint(200, 1500)
        yield StepShape(1, readers + prompt, (readers + prompt) * cells / 1000, readers)
    for step in range(300):
        cells += 2
        yield StepShape(1, 2, 2 * cells / 1000, 2)


@pytest.mark.parametrize("machine", MACHINES)
def test_the_fit_finds_the_machines_costs_after_a_drain(machine):
    true = MACHINES[machine]
    model = StepCostModel()
    rng = random.Random(1)
    for shape in _a_run(rng):
        model.observe(shape, sum(c * x for c, x in zip(true, shape)) * rng.uniform(0.97, 1.03))
    a, b, c, d = model.coefficients
    assert a == pytest.approx(true[0], rel=0.25)
    assert b + d == pytest.approx(true[1] + true[3], rel=0.25)  # per decoded token
    for shape in (StepShape(1, 1, 0.2, 1), StepShape(1, 16, 16.0, 16), StepShape(1, 200, 40.0, 1)):
        want = sum(c * x for c, x in zip(true, shape))
        assert model.predict_ms(shape) == pytest.approx(want, rel=0.2), shape


def test_before_any_step_the_prior_holds():
    model = StepCostModel()
    assert model.coefficients == pytest.approx(PRIOR, rel=1e-6)
