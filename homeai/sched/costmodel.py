"""A step-cost model fitted online: predicted step time = a + b * tokens.

Fitted by exponentially weighted least squares from measured steps, starting from a
deliberately slow prior so the first steps on a slow CPU stay short; on a fast GPU the
fit quickly lets steps grow. The scheduler asks it how many tokens fit a time target.
"""

from __future__ import annotations


class StepCostModel:
    def __init__(self, base_ms: float = 5.0, per_token_ms: float = 3.0, decay: float = 0.97):
        self.decay = decay
        # Prior: two pseudo-observations on the line a + b*x, weight 1 each.
        self.sw = 2.0
        self.sx = 1.0 + 64.0
        self.sy = (base_ms + per_token_ms) + (base_ms + 64 * per_token_ms)
        self.sxx = 1.0 + 64.0 * 64.0
        self.sxy = (base_ms + per_token_ms) + 64.0 * (base_ms + 64 * per_token_ms)

    def observe(self, num_tokens: int, elapsed_ms: float) -> None:
        d = self.decay
        x, y = float(num_tokens), float(elapsed_ms)
        self.sw = self.sw * d + 1.0
        self.sx = self.sx * d + x
        self.sy = self.sy * d + y
        self.sxx = self.sxx * d + x * x
        self.sxy = self.sxy * d + x * y

    @property
    def coefficients(self) -> tuple[float, float]:
        denom = self.sw * self.sxx - self.sx * self.sx
        mean_x, mean_y = self.sx / self.sw, self.sy / self.sw
        if denom <= 1e-9:
            return 0.0, max(mean_y / max(mean_x, 1.0), 1e-3)
        b = (self.sw * self.sxy - self.sx * self.sy) / denom
        b = max(b, 1e-3)
        a = max(mean_y - b * mean_x, 0.0)
        return a, b

    def predict_ms(self, num_tokens: int) -> float:
        a, b = self.coefficients
        return a + b * num_tokens

    def tokens_within(self, target_ms: float) -> int:
        a, b = self.coefficients
        return max(int((target_ms - a) / b), 0)
