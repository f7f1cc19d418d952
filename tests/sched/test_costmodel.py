"""The step-cost model learns the machine it runs on, far from its prior either way."""

import math
import random

import pytest

from homeai.sched.costmodel import CEILING, FLOOR, MAX_CONTENTION, PRIOR, StepCostModel, StepShape, _solve

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


def _plain_fit(model):
    """The fit written plainly (as it was before it was made lean): the sums added to the prior's,
    each solve on fresh copies, the right-hand sides kept apart."""
    n = len(model.prior)
    a_all = [[x + r for x, r in zip(xx_row, ridge_row)] for xx_row, ridge_row in zip(model.xx, model._ridge)]
    y_all = [x + r for x, r in zip(model.xy, model._ridge_y)]
    coef, free, fixed = [0.0] * n, list(range(n)), []
    while True:
        a = [[a_all[i][j] for j in free] for i in free]
        y = [y_all[i] - _added(a_all[i][k] * coef[k] for k in fixed) for i in free]
        sol = _plain_solve(a, y)
        if sol is None:
            return model.prior
        for i, value in zip(free, sol):
            coef[i] = value
        out = [i for i in free if not FLOOR[i] <= coef[i] <= CEILING[i]]
        if not out:
            return tuple(coef)
        for i in out:
            coef[i] = FLOOR[i] if coef[i] < FLOOR[i] else CEILING[i]
        fixed += out
        free = [i for i in free if i not in out]
        if not free:
            return tuple(coef)


def _added(terms):
    """The terms added up in order from 0 (as `sum` did before Python 3.12 compensated it)."""
    total = 0
    for term in terms:
        total = total + term
    return total


def _plain_solve(a, y):
    n = len(y)
    m = [row + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))  # the first largest
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - _added(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def test_the_fit_is_the_plain_least_squares_to_the_last_bit():
    """The fit asked each step is kept lean; it must stay the same arithmetic as the plain form
    (the simulated benchmarks' JSON and the scheduler's trace depend on every bit)."""
    solves = set()
    for seed in range(40):
        rng, model, now = random.Random(seed), StepCostModel(), 0.0
        true = (rng.uniform(0.01, 50), rng.uniform(0.001, 10), rng.uniform(0, 3), rng.uniform(0, 3))
        for _ in range(rng.randint(1, 300)):
            n, prompt = rng.choice([1, 1, 2, 4, 16, 64]), rng.choice([0, 0, rng.randint(1, 500)])
            shape = StepShape(rng.choice([1, 1, 2]), n + prompt, (n + prompt) * rng.randint(0, 60000) / 1000, n)
            now += rng.uniform(0, 30) if rng.random() < 0.05 else 0.001
            model.observe(shape, sum(c * x for c, x in zip(true, shape)) * rng.uniform(0.5, 3) * rng.choice([1, 1, 5]), now)
            fit = model._fit()
            assert repr(fit) == repr(_plain_fit(model))
            solves.add(sum(1 for c, lo, hi in zip(fit, FLOOR, CEILING) if c in (lo, hi)))
    assert len(solves) >= 2  # histories with coefficients held at a bound and without


def test_the_solves_written_out_are_the_plain_elimination_to_the_last_bit():
    """Systems of one to four rows (every fit's) are solved by code written out: the same
    operations as the plain elimination, pivots tied or swapped, signed zeros, infinities, NaNs and
    singular systems included."""
    rng = random.Random(7)

    def value():
        return rng.choice([0.0, -0.0, 1e-13, -1e-13, math.inf, math.nan] + [rng.uniform(-1, 1) * 10 ** rng.randint(-8, 6)] * 14)

    for _ in range(40_000):
        n = rng.choice([1, 2, 3, 4])
        rows = [[value() for _ in range(n + 1)] for _ in range(n)]
        if n > 1 and rng.random() < 0.2:
            rows[1][0] = -rows[0][0]  # a tie for the first pivot: the first row keeps it
        if n > 2 and rng.random() < 0.2:
            rows[2][1] = rows[1][1]
        if rng.random() < 0.2:
            for row in rows:
                row[n] = rng.choice([0.0, -0.0])  # a zero solution: its zeros' signs are the sums' order
        if rng.random() < 0.1:
            rows[-1] = list(rows[0])  # singular
        plain = _plain_solve([row[:n] for row in rows], [row[n] for row in rows])
        assert repr(_solve([row[:] for row in rows])) == repr(plain)
