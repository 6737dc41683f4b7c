"""The simulated clients: what they subscribe to and what they publish.

Pure and deterministic from the ``random.Random`` it is given. Topics look like
``<site>/a<i>/b<j>/c<k>``: the first level is the node whose devices publish
(devices publish at their own node), the next levels take values whose
popularity follows a Zipf law. A subscription watches one site (or every site
with ``+``), may replace a level by ``+`` and may end with ``#``.
"""

from __future__ import annotations

import bisect
import itertools
import random

from .scenario import Workload

__all__ = ["TopicSpace"]


def _cumulative(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))


class TopicSpace:
    def __init__(self, w: Workload, sites: list[str]):
        self.w = w
        self.sites = sites
        self._levels = [_cumulative(n, w.zipf) for n in w.levels]
        self._sites = _cumulative(len(sites), w.site_skew)
        self._qos = list(itertools.accumulate(w.qos))

    def _value(self, rng: random.Random, level: int) -> str:
        cum = self._levels[level]
        i = bisect.bisect_left(cum, rng.random() * cum[-1])
        return f"{chr(97 + level % 26)}{min(i, len(cum) - 1)}"

    def topic(self, rng: random.Random, site: str) -> str:
        return "/".join([site] + [self._value(rng, i) for i in range(len(self._levels))])

    def topic_filter(self, rng: random.Random) -> str:
        w = self.w
        if rng.random() < w.cross_site:
            site = "+"
        else:
            site = self.sites[min(bisect.bisect_left(self._sites, rng.random() * self._sites[-1]), len(self.sites) - 1)]
        levels = [site] + [self._value(rng, i) for i in range(len(self._levels))]
        if rng.random() < w.hash:
            levels = levels[: rng.randrange(1, len(levels))] + ["#"]
        if rng.random() < w.plus:
            body = len(levels) - 1 if levels[-1] == "#" else len(levels)
            if body > 1:
                levels[rng.randrange(1, body)] = "+"
        return "/".join(levels)

    def qos(self, rng: random.Random) -> int:
        return min(bisect.bisect_left(self._qos, rng.random() * self._qos[-1]), 2)

    def subscriptions(self, rng: random.Random, names: list[str]) -> dict[str, list[str]]:
        """The filters of every node: filters_per_node each, then more until distinct_filters."""
        w = self.w
        subs: dict[str, list[str]] = {n: [] for n in names}
        distinct: set[str] = set()
        for n in names:
            mine = set()
            for _ in range(w.filters_per_node):
                f = self.topic_filter(rng)
                if f not in mine:
                    mine.add(f)
                    subs[n].append(f)
            distinct |= mine
        if w.distinct_filters:
            # round-robin over the nodes: each new distinct filter goes to the next node
            i = 0
            for _ in range(50 * w.distinct_filters):  # bounded: a small topic space may run dry
                if len(distinct) >= w.distinct_filters:
                    break
                f = self.topic_filter(rng)
                if f in distinct:
                    continue
                distinct.add(f)
                subs[names[i % len(names)]].append(f)
                i += 1
        return subs
