"""A step-cost model fitted online: how long a step of a given shape takes.

    step_ms = a * decodes + b * tokens + c * token_kcells + d * outputs

`decodes` is the number of llama_decode calls the step makes (one per context with tokens in
it: each pays the weights' fixed pass), `tokens` every token of the step, `token_kcells` each
token times the KV cells in use in its context, in thousands (in a unified cache each token
attends over all of them: a chat's decode gets slower while a long document sits in the same
cache), and `outputs` the rows whose logits are computed and sampled.
The fit is exponentially weighted least squares, pulled gently toward a deliberately slow
prior so the first steps on a slow CPU stay short; on a fast GPU it quickly lets steps grow.
The scheduler asks it how many tokens fit a time target.

The fit cannot be poisoned by a noisy neighbour. A neighbour (a compile, a transcode) slows
every step by about the same factor, so the model keeps that factor apart: `contention`, within
[1, MAX_CONTENTION], believed slowly (a single slow step moves it little) and let go quickly (a
few steps at the machine's pace bring it back to 1). The machine's own fit learns each step
divided by it, and robustly: a step still more than SLOW_CLIP times off its prediction either
way (contention coming or going faster than the factor follows) teaches it nothing. A step far faster than predicted means
the fit is stale (the prior on a GPU): half of what was learnt is forgotten at once. What was
learnt fades with time (HALF_LIFE_S) as well as with steps, and every coefficient stays within
[FLOOR, CEILING]. Predictions are the machine's fit times the contention. The first WARM_STEPS steps, and the first
after a long idle, are learnt from as they come: the prior is a guess, not a machine.
"""

from __future__ import annotations

from operator import add, itemgetter, mul
from typing import NamedTuple

NAMES = ("base", "per_token", "per_token_per_kcell", "per_output")  # a, b, c, d
PRIOR = (5.0, 3.0, 1.0, 1.0)  # ms
FLOOR = (0.0, 1e-3, 0.0, 0.0)  # no coefficient goes below this
# Nor above this: a 70B model on a desktop CPU is within it; a fit beyond it is contention.
CEILING = (2000.0, 500.0, 100.0, 200.0)
SLOW_CLIP = 1.5  # a step slower than this many times the fit (after contention) teaches it nothing
FAST_STEP = 0.5  # a step below this fraction of its prediction makes the fit forget half it knew
HALF_LIFE_S = 300.0  # what was learnt counts half after this long
MAX_CONTENTION = 100.0
# How far one step moves the contention factor toward what it saw (in log terms): slowly, so an
# odd slow step (a page fault, a GC pause) is not believed; quickly down after a step LEAVING
# times it or less, so steps run at full size again within a few steps of the neighbour leaving.
RISE, FALL = 0.05, 0.5
LEAVING = 0.8
WARM_STEPS = 20  # the first steps (and the first after a long idle) are all learnt from as they are


def named(coefficients: tuple[float, ...]) -> dict[str, float]:
    return {name: round(v, 4) for name, v in zip(NAMES, coefficients)}


class StepShape(NamedTuple):
    """What a step's cost depends on (the model's features)."""
    decodes: int = 1
    tokens: int = 0
    token_kcells: float = 0.0
    outputs: int = 0

    def plus(self, other: "StepShape") -> "StepShape":
        return StepShape(*map(add, self, other))


class StepCostModel:
    def __init__(self, prior: tuple[float, ...] = PRIOR, decay: float = 0.99, prior_weight: float = 2.0):
        self.decay = decay  # about the last 100 steps: a drain of a few long answers, every step the
        self.prior = prior  # same shape, must not wash out what the varied steps before it taught
        n = len(prior)
        self.xx = [[0.0] * n for _ in range(n)]  # decayed sums of x x^T and x y over observed steps
        self.xy = [0.0] * n
        self._last_seen: float | None = None  # when the last step was observed (s)
        self.contention = 1.0  # how many times slower than the machine's fit steps run now
        self._seen = 0.0  # steps learnt from, decayed like the sums
        # The prior: steps of typical shapes costed by the prior coefficients, never decayed,
        # so a feature the steps have not yet varied keeps its prior value. Each counts as a
        # step of unit size: weighted by their size, the prior's large shapes outweighed many
        # small real steps, holding a slow machine's token cost (or a GPU's) near the prior's.
        self._ridge = [[0.0] * n for _ in range(n)]
        self._ridge_y = [0.0] * n
        for x in ((1, 1, 0, 1), (1, 64, 0, 1), (1, 64, 128, 1), (1, 16, 16, 16)):
            y = sum(p * xi for p, xi in zip(prior, x))
            w = prior_weight / 4 / sum(xi * xi for xi in x)  # unit length: see above
            for i in range(n):
                self._ridge_y[i] += w * x[i] * y
                for j in range(n):
                    self._ridge[i][j] += w * x[i] * x[j]
        self._coef: tuple[float, ...] | None = None
        self._scaled: tuple[tuple[float, ...], float, tuple[float, ...]] | None = None  # `coefficients`'

    def observe(self, x: StepShape, elapsed_ms: float, now: float | None = None) -> None:
        """Learn from a step that took `elapsed_ms`, observed at `now` (seconds, any clock)."""
        fitted = max(predicted_ms(self.machine, x), 1.0)
        y = elapsed_ms
        if self._seen >= WARM_STEPS:  # until then every step is the machine's (the prior is a guess)
            self._contend(elapsed_ms / fitted)
            y = elapsed_ms / self.contention
            if y > SLOW_CLIP * fitted or (self.contention > 1.0 and y < fitted / SLOW_CLIP):
                return  # contention coming or going faster than the factor follows: nothing about the machine
        keep = self.decay * self._fading(now)
        if y < FAST_STEP * fitted:
            keep *= 0.5
        self._seen = self._seen * keep + 1.0
        xx, xy = self.xx, self.xy
        x0, x1, x2, x3 = x  # a step's four features, written out (a comprehension a row cost more than its sums)
        for i, xi in enumerate(x):
            xy[i] = xy[i] * keep + xi * y
            s0, s1, s2, s3 = xx[i]
            xx[i] = [s0 * keep + xi * x0, s1 * keep + xi * x1, s2 * keep + xi * x2, s3 * keep + xi * x3]
        self._coef = None

    def slowed(self, factor: float) -> None:
        """Steps run `factor` times slower from now (faster below 1) for a reason known at once: the
        core watch gave llama.cpp fewer threads because a neighbour took a core. The contention takes
        it whole, within its bounds, rather than over the ~10 s the steps would take to teach it
        (RISE); what is off either way the steps then correct as they do any contention."""
        self.contention = min(max(self.contention * factor, 1.0), MAX_CONTENTION)

    def _contend(self, ratio: float) -> None:
        """Follow the steps' slowdown: a step's noise either way moves it alike, a step clearly
        faster than the contention believed (the neighbour left) brings it down at once."""
        rate = FALL if ratio < LEAVING * self.contention else RISE
        moved = self.contention * (ratio / self.contention) ** rate
        self.contention = min(max(moved, 1.0), MAX_CONTENTION)

    def _fading(self, now: float | None) -> float:
        """How much of what was learnt still counts, after the time since the last step."""
        if now is None:
            return 1.0
        last, self._last_seen = self._last_seen, now
        return 1.0 if last is None else 0.5 ** (max(now - last, 0.0) / HALF_LIFE_S)

    @property
    def coefficients(self) -> tuple[float, ...]:
        """(a, b, c, d) in ms as steps cost now: the machine's fit times the contention (asked
        several times a step: made again only when the fit or the contention changed)."""
        machine, contention = self.machine, self.contention
        cached = self._scaled
        if cached is None or cached[0] is not machine or cached[1] != contention:
            # Without contention the machine's own (c * 1.0 is c, to the bit): most steps.
            scaled = machine if contention == 1.0 else tuple(c * contention for c in machine)
            cached = self._scaled = machine, contention, scaled
        return cached[2]

    @property
    def machine(self) -> tuple[float, ...]:
        """(a, b, c, d) in ms of the machine alone, each held within [FLOOR, CEILING]."""
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, ...]:
        """Least squares with the coefficients the data would push out of bounds held at the bound.
        (Asked once a step, so kept lean: the sums are added up once; the first solve reads them
        as they are; each later one gets rows over the free coefficients, their right-hand sides
        less the held ones' part, added up in the order they were held and kept per row from one
        solve to the next. Every solve is the same arithmetic in the same order as ever, so the
        fit is the same to the last bit: tests/sched/test_costmodel.py compares it with the plain
        form over many histories.)"""
        n = len(self.prior)
        whole = []  # the sums and the prior's, each row ending with its x·y (four features, written out)
        for (s0, s1, s2, s3), (r0, r1, r2, r3), xy, ridge_y in zip(self.xx, self._ridge, self.xy, self._ridge_y):
            whole.append([s0 + r0, s1 + r1, s2 + r2, s3 + r3, xy + ridge_y])
        coef = [0.0] * n  # a fixed coefficient holds its bound
        free = list(range(n))
        held = [0] * n  # per row, the held coefficients' part of its right-hand side (a sum from 0)
        rows = whole  # every coefficient free: the sums as they are (a solve of up to four rows reads them only)
        while True:
            sol = _SOLVES[len(rows)](rows)  # (`_solve` of up to four rows)
            if sol is None:
                return self.prior
            out, kept = [], []  # the free ones the data push out of bounds, and the rest
            for i, value in zip(free, sol):
                if FLOOR[i] <= value <= CEILING[i]:
                    coef[i] = value
                    kept.append(i)
                else:  # held at the bound it crossed
                    coef[i] = FLOOR[i] if value < FLOOR[i] else CEILING[i]
                    out.append(i)
            if not out or not kept:
                return tuple(coef)
            free = kept
            pick = itemgetter(*free) if len(free) > 1 else _one(free[0])
            rows = []
            for i in free:
                row = whole[i]
                part = held[i]
                for k in out:
                    part = part + row[k] * coef[k]
                held[i] = part
                rows.append((*pick(row), row[n] - part))

    def predict_ms(self, x: StepShape) -> float:
        return predicted_ms(self.coefficients, x)

    def call_tokens(self) -> float:
        """A decode call's fixed cost in tokens' worth (a/b): what background pays for a call of its own."""
        a, b, _, _ = self.coefficients
        return a / b

    def tokens_per_kcell(self) -> float:
        """1000·b/c: what keeping a cached prefix costs against reading it again (`KVPools.expire`)."""
        _, b, c, _ = self.coefficients
        return 1000.0 * b / c if c > 0 else float("inf")

    def tokens_within(self, target_ms: float, base: StepShape, context_cells: int, new_decode: bool) -> int:
        """The most tokens a step of shape `base` may add within the target, in a context of
        `context_cells` cells (`new_decode`: one that has no tokens in the step yet)."""
        return tokens_within(self.coefficients, target_ms, base, context_cells, new_decode)


def tokens_within(coefficients: tuple[float, ...], target_ms: float, base: StepShape, context_cells: int,
                  new_decode: bool) -> int:
    """`StepCostModel.tokens_within` as the model stood when it gave `coefficients`."""
    a, b, c, d = coefficients
    left = target_ms - predicted_ms(coefficients, base) - (a if new_decode else 0.0)
    return max(int(left / (b + c * context_cells / 1000.0)), 0)


def predicted_ms(coefficients: tuple[float, ...], x: StepShape) -> float:
    """A step of shape `x` by `coefficients`: c * xi for each, added in order (asked several times a step)."""
    return sum(map(mul, coefficients, x))


def _one(i: int):
    """`itemgetter` of one index, as a tuple (as `itemgetter` of several gives)."""
    return lambda row: (row[i],)


def _solve(m: list[list[float]]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (the first largest pivot) of the rows `m`, each
    ending with its right-hand side (changed in place, up to four rows read only); None when singular."""
    n = len(m)
    if n <= 4:  # every fit's (four coefficients): written out
        return _SOLVES[n](m)
    for col in range(n):
        pivot, largest = col, abs(m[col][col])
        for r in range(col + 1, n):
            size = abs(m[r][col])
            if size > largest:
                pivot, largest = r, size
        if largest < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        top = m[col]
        rest = range(col + 1, n + 1)  # column `col` itself is never read again below the pivot
        for row in m[col + 1:]:
            f = row[col] / top[col]
            for k in rest:
                row[k] -= f * top[k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        row = m[r]
        total = 0
        for k in range(r + 1, n):
            total = total + row[k] * x[k]
        x[r] = (row[n] - total) / row[r]
    return x


def _solve_small(m: list[list[float]]) -> list[float] | None:
    """`_solve` of one or two rows, written out: the same operations in the same order (a sum
    starts from the integer 0, as there), without the loops' cost (most steps' fits end in these)."""
    if len(m) == 1:
        (a, y), = m
        return None if abs(a) < 1e-12 else [(y - 0) / a]
    top, row = m
    if abs(row[0]) > abs(top[0]):
        top, row = row, top
    if abs(top[0]) < 1e-12:
        return None
    f = row[0] / top[0]
    d, y = row[1] - f * top[1], row[2] - f * top[2]
    if abs(d) < 1e-12:
        return None
    x1 = (y - 0) / d
    return [(top[2] - (0 + top[1] * x1)) / top[0], x1]


def _solve3(m: list[list[float]]) -> list[float] | None:
    """`_solve` of three rows, written out as `_solve_small` is: the first largest pivot of each
    column, each row below it less its multiple, the sums from the integer 0; the rows eliminated
    are new tuples, each without the column done. (A fit solves its four coefficients, then three
    when one is held at a bound, every step: loops over four columns cost it three times as much.)"""
    a, b, c = m
    p, big = 0, abs(a[0])
    s = abs(b[0])
    if s > big:
        p, big = 1, s
    s = abs(c[0])
    if s > big:
        p, big = 2, s
    if big < 1e-12:
        return None
    if p == 1:
        a, b = b, a
    elif p == 2:
        a, c = c, a
    t0, t1, t2, ty = a
    f = b[0] / t0
    b = b[1] - f * t1, b[2] - f * t2, b[3] - f * ty
    f = c[0] / t0
    c = c[1] - f * t1, c[2] - f * t2, c[3] - f * ty
    if abs(c[0]) > abs(b[0]):
        b, c = c, b
    u1, u2, uy = b
    if abs(u1) < 1e-12:
        return None
    f = c[0] / u1
    v2, vy = c[1] - f * u2, c[2] - f * uy
    if abs(v2) < 1e-12:
        return None
    x2 = (vy - 0) / v2
    x1 = (uy - (0 + u2 * x2)) / u1
    return [(ty - ((0 + t1 * x1) + t2 * x2)) / t0, x1, x2]


def _solve4(m: list[list[float]]) -> list[float] | None:
    """`_solve` of four rows, written out as `_solve3` is."""
    a, b, c, d = m
    p, big = 0, abs(a[0])
    s = abs(b[0])
    if s > big:
        p, big = 1, s
    s = abs(c[0])
    if s > big:
        p, big = 2, s
    s = abs(d[0])
    if s > big:
        p, big = 3, s
    if big < 1e-12:
        return None
    if p == 1:
        a, b = b, a
    elif p == 2:
        a, c = c, a
    elif p == 3:
        a, d = d, a
    t0, t1, t2, t3, ty = a
    f = b[0] / t0
    b = b[1] - f * t1, b[2] - f * t2, b[3] - f * t3, b[4] - f * ty
    f = c[0] / t0
    c = c[1] - f * t1, c[2] - f * t2, c[3] - f * t3, c[4] - f * ty
    f = d[0] / t0
    d = d[1] - f * t1, d[2] - f * t2, d[3] - f * t3, d[4] - f * ty
    p, big = 0, abs(b[0])
    s = abs(c[0])
    if s > big:
        p, big = 1, s
    s = abs(d[0])
    if s > big:
        p, big = 2, s
    if big < 1e-12:
        return None
    if p == 1:
        b, c = c, b
    elif p == 2:
        b, d = d, b
    u1, u2, u3, uy = b
    f = c[0] / u1
    c = c[1] - f * u2, c[2] - f * u3, c[3] - f * uy
    f = d[0] / u1
    d = d[1] - f * u2, d[2] - f * u3, d[3] - f * uy
    if abs(d[0]) > abs(c[0]):
        c, d = d, c
    v2, v3, vy = c
    if abs(v2) < 1e-12:
        return None
    f = d[0] / v2
    w3, wy = d[1] - f * v3, d[2] - f * vy
    if abs(w3) < 1e-12:
        return None
    x3 = (wy - 0) / w3
    x2 = (vy - (0 + v3 * x3)) / v2
    x1 = (uy - ((0 + u2 * x2) + u3 * x3)) / u1
    return [(ty - (((0 + t1 * x1) + t2 * x2) + t3 * x3)) / t0, x1, x2, x3]


_SOLVES = {1: _solve_small, 2: _solve_small, 3: _solve3, 4: _solve4}
