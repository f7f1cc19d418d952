"""The step-cost model learns the machine it runs on, far from its prior either way."""

import random

import pytest

from homeai.sched.costmodel import CEILING, FLOOR, MAX_CONTENTION, PRIOR, StepCostModel, StepShape

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


SMALL_CPU = MACHINES["small model on a CPU"]
SHAPES = (StepShape(1, 1, 0.2, 1), StepShape(1, 8, 4.0, 8), StepShape(1, 64, 20.0, 1))


def _true_ms(shape, slowdown=1.0):
    return slowdown * sum(c * x for c, x in zip(SMALL_CPU, shape))


def _learnt(model, rng, steps, slowdown=1.0, start=0.0, every_s=0.01):
    """Feed `steps` steps of the burst-and-drain mix, `slowdown` times their true cost; the clock after."""
    shapes = list(_a_run(rng))
    now = start
    for k in range(steps):
        shape = shapes[k % len(shapes)]
        now += every_s
        model.observe(shape, _true_ms(shape, slowdown) * rng.uniform(0.97, 1.03), now)
    return now


def _worst_ratio(model, coefficients=None):
    coefficients = coefficients or model.coefficients
    predicted = [sum(c * x for c, x in zip(coefficients, s)) for s in SHAPES]
    return max(max(p / _true_ms(s), _true_ms(s) / p) for p, s in zip(predicted, SHAPES))


def test_a_contention_episode_leaves_the_machines_fit_alone_and_predictions_recover_in_a_few_steps():
    model, rng = StepCostModel(), random.Random(2)
    now = _learnt(model, rng, 600)
    assert _worst_ratio(model) < 1.25
    now = _learnt(model, rng, 900, slowdown=100.0, start=now, every_s=0.1)  # 90 s of steps 100x slower
    assert _worst_ratio(model, model.machine) < 1.5  # contention, not a new machine
    assert model.contention > 10  # while it lasts, steps are believed slow
    for steps in range(1, 100):
        now = _learnt(model, rng, 1, start=now)
        if _worst_ratio(model) < 1.5:
            break
    assert steps <= 10, f"still off by {_worst_ratio(model):.1f}x after {steps} normal steps"


def test_one_slow_step_is_not_believed():
    model, rng = StepCostModel(), random.Random(5)
    now = _learnt(model, rng, 600)
    before = model.predict_ms(SHAPES[0])
    model.observe(SHAPES[0], _true_ms(SHAPES[0], 100.0), now + 0.01)
    assert model.predict_ms(SHAPES[0]) < 1.3 * before


def test_a_lasting_slowdown_of_a_few_times_is_learnt():
    model, rng = StepCostModel(), random.Random(3)
    now = _learnt(model, rng, 600)
    _learnt(model, rng, 1500, slowdown=4.0, start=now)
    for shape in SHAPES:
        assert model.predict_ms(shape) == pytest.approx(_true_ms(shape, 4.0), rel=0.3), shape


def test_the_coefficients_stay_within_their_bounds():
    model = StepCostModel()
    for _ in range(2000):
        model.observe(StepShape(1, 1, 0.0, 1), 60_000.0)  # a minute per token, forever
    assert all(lo <= c <= hi for lo, c, hi in zip(FLOOR, model.machine, CEILING))
    assert 1.0 <= model.contention <= MAX_CONTENTION


def test_what_was_learnt_fades_with_time():
    model, rng = StepCostModel(), random.Random(4)
    now = _learnt(model, rng, 600)
    idle, busy = StepCostModel(), StepCostModel()
    for m, gap in ((idle, 3600.0), (busy, 0.01)):
        m.xx, m.xy = [r[:] for r in model.xx], model.xy[:]
        m._last_seen = now
        m.observe(StepShape(1, 1, 0.0, 1), 20.0, now + gap)  # one step, slower than learnt
    # After an hour idle the earlier steps count for little: the new one moves the fit far more.
    assert idle.machine[0] > 1.2 * busy.machine[0]
