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
"""

from __future__ import annotations

from typing import NamedTuple

NAMES = ("base", "per_token", "per_token_per_kcell", "per_output")  # a, b, c, d
PRIOR = (5.0, 3.0, 1.0, 1.0)  # ms
FLOOR = (0.0, 1e-3, 0.0, 0.0)  # no coefficient goes below this


def named(coefficients: tuple[float, ...]) -> dict[str, float]:
    return {name: round(v, 4) for name, v in zip(NAMES, coefficients)}


class StepShape(NamedTuple):
    """What a step's cost depends on (the model's features)."""
    decodes: int = 1
    tokens: int = 0
    token_kcells: float = 0.0
    outputs: int = 0

    def plus(self, other: "StepShape") -> "StepShape":
        return StepShape(*(a + b for a, b in zip(self, other)))


class StepCostModel:
    def __init__(self, prior: tuple[float, ...] = PRIOR, decay: float = 0.99, prior_weight: float = 2.0):
        self.decay = decay  # about the last 100 steps: a drain of a few long answers, every step the
        self.prior = prior  # same shape, must not wash out what the varied steps before it taught
        n = len(prior)
        self.xx = [[0.0] * n for _ in range(n)]  # decayed sums of x x^T and x y over observed steps
        self.xy = [0.0] * n
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

    def observe(self, x: StepShape, elapsed_ms: float) -> None:
        d = self.decay
        for i, xi in enumerate(x):
            self.xy[i] = self.xy[i] * d + xi * elapsed_ms
            row = self.xx[i]
            for j, xj in enumerate(x):
                row[j] = row[j] * d + xi * xj
        self._coef = None

    @property
    def coefficients(self) -> tuple[float, ...]:
        """(a, b, c, d) in ms; a coefficient the data would make negative is held at its floor."""
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, ...]:
        n = len(self.prior)
        free = list(range(n))
        fixed = {i: FLOOR[i] for i in range(n)}
        while True:
            a = [[self.xx[i][j] + self._ridge[i][j] for j in free] for i in free]
            y = [self.xy[i] + self._ridge_y[i] - sum((self.xx[i][k] + self._ridge[i][k]) * v
                                                     for k, v in fixed.items() if k not in free) for i in free]
            sol = _solve(a, y)
            coef = dict(fixed)
            if sol is None:
                return self.prior
            coef.update(zip(free, sol))
            low = [i for i in free if coef[i] < FLOOR[i]]
            if not low:
                return tuple(coef[i] for i in range(n))
            free = [i for i in free if i not in low]

    def predict_ms(self, x: StepShape) -> float:
        return sum(c * xi for c, xi in zip(self.coefficients, x))

    def tokens_within(self, target_ms: float, base: StepShape, context_cells: int, new_decode: bool) -> int:
        """The most tokens a step of shape `base` may add within the target, in a context of
        `context_cells` cells (`new_decode`: one that has no tokens in the step yet)."""
        a, b, c, d = self.coefficients
        left = target_ms - self.predict_ms(base) - (a if new_decode else 0.0)
        return max(int(left / (b + c * context_cells / 1000.0)), 0)


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x
