"""Token-aware fair share: weighted virtual token counters per (lane, member).

A prompt token costs `w_in`, an output token `w_out`, divided by the pair's weight. The
backlogged pair with the least counter goes next. A pair that turns backlogged is lifted
to the least counter of the pairs already backlogged (with none, the least there was when
some last were), so nobody banks credit while idle: a member who was away while another
used the lane alone does not come back owed everything the other was served
(Sheng et al., "Fairness in Serving Large Language Models", VTC).

A pair is charged for what ran (`Scheduler.update`), never for a step that found no KV slot or
failed. While a step is planned, `pick` also counts what the chunks placed so far would cost
(`Step.planned`), so one step shares its prefill among the pairs as if they had been charged.
"""

from __future__ import annotations

from typing import AbstractSet, Callable, Mapping

Key = tuple[str, str]


class FairShare:
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0):
        self.w_in = w_in
        self.w_out = w_out
        self.counters: dict[Key, float] = {}
        self.backlogged: set[Key] = set()
        self.floor = 0.0  # the least counter of the pairs backlogged when some last were
        self._output_cost: dict[float, float] = {}  # per weight, what an output token costs

    def set_backlogged(self, keys: AbstractSet[Key]) -> None:
        """Tell which pairs have work now; newcomers are lifted to the least active counter."""
        if keys != self.backlogged:  # (most steps the same pairs: nothing to lift, nothing to copy)
            newcomers = keys - self.backlogged
            if newcomers:
                floor = min((self.counters.get(k, 0.0) for k in self.backlogged & keys), default=self.floor)
                for key in newcomers:
                    self.counters[key] = max(self.counters.get(key, 0.0), floor)
            self.backlogged = set(keys)
        if keys:  # (every step: a list, where a generator resumes once a pair)
            self.floor = min([self.counters.get(k, 0.0) for k in keys])

    def pick(self, keys, held: Mapping[str, int] | None = None, planned: dict[Key, float] | None = None) -> Key | None:
        """The pair that goes next (`rank`'s first), None with no pair."""
        return min(keys, key=self._order(held, planned), default=None)

    def rank(self, keys, held: Mapping[str, int] | None = None, planned: dict[Key, float] | None = None,
             first: Mapping[str, int] | None = None) -> list[Key]:
        """The pairs in the order they go: the least counter (plus what it was `planned` this step)
        first; on a tie (a newcomer is lifted to the least), the one whose member holds fewer
        sequences (`held`, per member), so a member with nothing running goes before a busy one.
        `first`: what orders pairs before fair share does, per lane (its priority). The first pair
        is the next to go; the rest keep this order until a counter, a plan or a holding changes."""
        return sorted(keys, key=self._order(held, planned, first))

    def _order(self, held: Mapping[str, int] | None, planned: dict[Key, float] | None,
               first: Mapping[str, int] | None = None) -> Callable[[Key], tuple]:
        planned, counters = planned or {}, self.counters
        return lambda k: (first[k[0]] if first else 0, counters.get(k, 0.0) + planned.get(k, 0.0),
                          held[k[1]] if held else 0, k)

    def cost(self, *, weight: float, num_in: int = 0, num_out: int = 0) -> float:
        """What `num_in` prompt and `num_out` output tokens cost a pair of this weight."""
        return (self.w_in * num_in + self.w_out * num_out) / weight

    def charge(self, key: Key, *, weight: float, num_in: int = 0, num_out: int = 0) -> None:
        self.counters[key] = self.counters.get(key, 0.0) + self.cost(weight=weight, num_in=num_in, num_out=num_out)

    def output_cost(self, weight: float) -> float:
        """`cost(weight=weight, num_out=1)`, kept per weight (an output token is charged for every
        sequence every step: `Scheduler._settle` adds it to the counters itself)."""
        cost = self._output_cost.get(weight)
        if cost is None:
            cost = self._output_cost[weight] = self.cost(weight=weight, num_out=1)
        return cost

    def counter(self, key: Key) -> float:
        return self.counters.get(key, 0.0)
