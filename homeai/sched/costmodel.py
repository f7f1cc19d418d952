"""A step-cost model fitted online: how long a step of a given shape takes.

    step_ms = a + b * tokens + c * tokens * context_k + d * outputs

`tokens` is every token of the step, `context_k` the KV cells in use in thousands (in a
unified cache each token attends over all of them: a chat's decode gets slower while a long
document sits in the cache), and `outputs` the rows whose logits are computed and sampled.
The fit is exponentially weighted least squares, pulled gently toward a deliberately slow
prior so the first steps on a slow CPU stay short; on a fast GPU it quickly lets steps grow.
The scheduler asks it how many tokens fit a time target.
"""

from __future__ import annotations

NAMES = ("base", "per_token", "per_token_per_kcell", "per_output")  # a, b, c, d
PRIOR = (5.0, 3.0, 1.0, 1.0)  # ms
FLOOR = (0.0, 1e-3, 0.0, 0.0)  # no coefficient goes below this


def named(coefficients: tuple[float, ...]) -> dict[str, float]:
    return {name: round(v, 4) for name, v in zip(NAMES, coefficients)}


def _features(tokens: float, context_k: float, outputs: float) -> tuple[float, ...]:
    return 1.0, tokens, tokens * context_k, outputs


class StepCostModel:
    def __init__(self, prior: tuple[float, ...] = PRIOR, decay: float = 0.97, prior_weight: float = 2.0):
        self.decay = decay
        self.prior = prior
        n = len(prior)
        self.xx = [[0.0] * n for _ in range(n)]  # decayed sums of x x^T and x y over observed steps
        self.xy = [0.0] * n
        # The prior: steps of typical shapes costed by the prior coefficients, never decayed,
        # so a feature the steps have not yet varied keeps its prior value.
        self._ridge = [[0.0] * n for _ in range(n)]
        self._ridge_y = [0.0] * n
        for shape in ((1, 0, 1), (64, 0, 1), (64, 2, 1), (16, 1, 16)):
            x = _features(*shape)
            y = sum(p * xi for p, xi in zip(prior, x))
            for i in range(n):
                self._ridge_y[i] += prior_weight / 4 * x[i] * y
                for j in range(n):
                    self._ridge[i][j] += prior_weight / 4 * x[i] * x[j]
        self._coef: tuple[float, ...] | None = None

    def observe(self, num_tokens: int, elapsed_ms: float, context_cells: int = 0, outputs: int = 0) -> None:
        x = _features(num_tokens, context_cells / 1000.0, outputs)
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

    def predict_ms(self, num_tokens: int, context_cells: int = 0, outputs: int = 0) -> float:
        x = _features(num_tokens, context_cells / 1000.0, outputs)
        return sum(c * xi for c, xi in zip(self.coefficients, x))

    def tokens_within(self, target_ms: float, context_cells: int = 0, outputs: int = 0) -> int:
        """The most tokens a step over this context, sampling `outputs` rows, may carry within the target."""
        a, b, c, d = self.coefficients
        per_token = b + c * context_cells / 1000.0
        return max(int((target_ms - a - d * outputs) / per_token), 0)


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
