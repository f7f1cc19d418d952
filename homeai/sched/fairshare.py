"""Token-aware fair share: weighted virtual token counters per (lane, member).

A prompt token costs `w_in`, an output token `w_out`, divided by the pair's weight. The
backlogged pair with the least counter goes next. A pair that turns backlogged is lifted
to the least counter of the pairs already backlogged (with none, the least there was when
some last were), so nobody banks credit while idle: a member who was away while another
used the lane alone does not come back owed everything the other was served
(Sheng et al., "Fairness in Serving Large Language Models", VTC).
"""

from __future__ import annotations

from typing import Callable

Key = tuple[str, str]


class FairShare:
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0):
        self.w_in = w_in
        self.w_out = w_out
        self.counters: dict[Key, float] = {}
        self.backlogged: set[Key] = set()
        self.floor = 0.0  # the least counter of the pairs backlogged when some last were

    def set_backlogged(self, keys: set[Key]) -> None:
        """Tell which pairs have work now; newcomers are lifted to the least active counter."""
        newcomers = keys - self.backlogged
        if newcomers:
            floor = min((self.counters.get(k, 0.0) for k in self.backlogged & keys), default=self.floor)
            for key in newcomers:
                self.counters[key] = max(self.counters.get(key, 0.0), floor)
        self.backlogged = set(keys)
        if keys:
            self.floor = min(self.counters.get(k, 0.0) for k in keys)

    def pick(self, keys, held: Callable[[Key], int] | None = None) -> Key | None:
        """The pair with the least counter; on a tie (a newcomer is lifted to the least), the one
        holding fewer sequences (`held`), so a member with nothing running goes before a busy one."""
        return min(keys, key=lambda k: (self.counters.get(k, 0.0), held(k) if held else 0, k), default=None)

    def charge(self, key: Key, *, weight: float, num_in: int = 0, num_out: int = 0) -> None:
        cost = (self.w_in * num_in + self.w_out * num_out) / weight
        self.counters[key] = self.counters.get(key, 0.0) + cost

    def counter(self, key: Key) -> float:
        return self.counters.get(key, 0.0)
