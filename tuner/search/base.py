"""The Searcher protocol and what every searcher shares: bookkeeping, failure memory, candidate mapping.

Contract (tests/test_searchers.py checks it for every registered searcher):
- `ask(n)` returns up to n distinct layouts, all members of `candidates`, none asked or told before;
  [] once every candidate has been asked or told.
- `tell(layout, result)` takes a finished result of its own ask or a replayed one it never asked
  (resume); a told layout is never proposed afterwards.
- A status other than ok is a failure: never proposed again, and its neighbourhood is deferred. An
  out-of-memory or pruned (does not fit) layout makes every layout of the same (tp, cp, pp, vp, dp) that
  needs at least as much memory -- a micro-batch as large or larger, less recompute, sequence
  parallelism off where it was on, a ZeRO stage as low or lower -- "deferred": proposed only after every other unproposed candidate.
Pure: no I/O, no threads; the driver serialises calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tuner.layout import BY_NAME, DIMENSIONS, SEARCHED, Layout, recomputes_at_least
from tuner.trial import Status, TrialResult

#: The dimensions a searcher chooses; dp follows from tp * cp * pp * dp = GPUs.
DIMS = SEARCHED
_LOG2 = {d.name for d in DIMENSIONS if d.log2}
#: Failures that say "this does not fit in memory".
MEMORY_FAILURES = frozenset({Status.OOM, Status.PRUNED})
_DEFERRED_PENALTY = 1e6   # added to a deferred candidate's distance so that it comes after the rest

if TYPE_CHECKING:         # numpy is imported where a searcher is made: every CLI command imports this module
    import numpy as np    # (through the options), and numpy is a quarter of its start-up


@runtime_checkable
class Searcher(Protocol):
    name: str

    def ask(self, n: int) -> list[Layout]: ...

    def tell(self, layout: Layout, result: TrialResult) -> None: ...


def objective(result: TrialResult) -> float | None:
    """The value searchers maximise: MFU (training speed), or None when the trial is a failure."""
    if result.status == Status.OK and result.mfu is not None:
        return float(result.mfu)
    return None


def needs_more_memory(a: Layout, b: Layout) -> bool:
    """Whether `a` needs at least as much memory per GPU as `b` (same tp, pp, dp; a != b; offloading no more of its
    layers' activations to the host: an offloaded twin of an OOM'd layout is what rescues it)."""
    return (a != b and (a.tp, a.pp, a.dp) == (b.tp, b.pp, b.dp) and a.micro_batch >= b.micro_batch
            and a.offload_layers <= b.offload_layers
            and (a.context_parallel, a.virtual_pipeline, a.expert_parallel, a.expert_tensor_parallel)
            == (b.context_parallel, b.virtual_pipeline, b.expert_parallel, b.expert_tensor_parallel)
            and a.zero_stage <= b.zero_stage and a.sequence_parallel <= b.sequence_parallel
            and recomputes_at_least(b.recompute, a.recompute))   # module sets are not a chain (issue 25)


class BaseSearcher:
    """Bookkeeping shared by all searchers. Subclasses implement `_propose` and may hook `_observe`.

    `_propose(n)` returns candidate indices or raw proposals (dicts of DIMS values), or calls
    `_take(p)` itself; `ask` maps each non-candidate, used or (while others remain) deferred proposal
    to the nearest unused candidate and fills up to n from a seeded fallback order, deferred last.
    """

    name = "base"
    stopped = False                  # True once the searcher stops the study early (ask returns [])
    confidence: float | None = None  # P(no layout beats the recommended one by the stop threshold)
    stop_reason: str | None = None

    def __init__(self, candidates: list[Layout], *, seed: int = 0, **_ignored):
        import numpy as np
        self.seed = int(seed)
        self.candidates: list[Layout] = sorted(set(candidates))
        self.index = {lay: i for i, lay in enumerate(self.candidates)}
        n = len(self.candidates)
        # choices per dimension, from the candidates themselves
        self.choices = {d: sorted({getattr(c, d) for c in self.candidates}, key=BY_NAME[d].ordinal) for d in DIMS}
        self.X = np.array([self.encode(c.as_dict()) for c in self.candidates]).reshape(n, len(DIMS))
        self.used = np.zeros(n, dtype=bool)        # asked or told
        self.deferred = np.zeros(n, dtype=bool)    # dominated by a memory failure
        self.told: dict[Layout, TrialResult] = {}
        self.asked: set[Layout] = set()
        self.failures: list[tuple[Layout, Status]] = []
        self._groups: dict[tuple[int, int, int], list[int]] = {}
        for i, c in enumerate(self.candidates):
            self._groups.setdefault((c.tp, c.pp, c.dp), []).append(i)
        self._by_dims = {tuple(getattr(c, d) for d in DIMS): i for i, c in enumerate(self.candidates)}
        self._fallback = np.random.default_rng([self.seed, 7]).permutation(n)

    # ---- encoding -------------------------------------------------------------------------------
    def encode(self, values: dict) -> list[float]:
        """A point in [0, 1]^len(DIMS): each dimension over its range (log2 where declared so)."""
        import numpy as np
        out = []
        for d in DIMS:
            dim = BY_NAME[d]
            v = dim.ordinal(values[d])
            ch = [dim.ordinal(c) for c in self.choices.get(d) or [values[d]]]
            if d in _LOG2:
                lo, hi = np.log2(max(ch[0], 1)), np.log2(max(ch[-1], 1))
                out.append((np.log2(max(v, 1)) - lo) / (hi - lo) if hi > lo else 0.0)
            else:
                lo, hi = float(ch[0]), float(ch[-1])
                out.append((v - lo) / (hi - lo) if hi > lo else 0.0)
        return out

    # ---- the protocol ---------------------------------------------------------------------------
    @property
    def remaining(self) -> int:
        return int((~self.used).sum())

    def ask(self, n: int) -> list[Layout]:
        n = min(int(n), self.remaining)
        if n <= 0:
            return []
        self._batch: list[int] = []
        for p in self._propose(n):
            if len(self._batch) == n:
                break
            self._take(p)
        if len(self._batch) < n:
            for i in self._priority(self._fallback)[:n - len(self._batch)]:
                self._take(i)
        layouts = [self.candidates[i] for i in self._batch]
        self.asked.update(layouts)
        return layouts

    def tell(self, layout: Layout, result: TrialResult) -> None:
        if not result.status.finished:
            raise ValueError(f"tell() takes a finished result; {layout.key()} is {result.status} "
                             "(the driver runs interrupted trials again and tells their new result)")
        first = layout not in self.told
        self.told[layout] = result
        i = self.index.get(layout)
        if i is not None:
            self.used[i] = True
        if objective(result) is None and first:
            self.failures.append((layout, result.status))
            if result.status in MEMORY_FAILURES:
                for j in self._groups.get((layout.tp, layout.pp, layout.dp), ()):
                    if needs_more_memory(self.candidates[j], layout):
                        self.deferred[j] = True
        if first:
            self._observe(layout, result, asked=layout in self.asked)

    def tell_claimed_elsewhere(self, layout: Layout) -> None:
        """Another driver claimed `layout` (a shared study): never propose it again."""
        i = self.index.get(layout)
        if i is not None:
            self.used[i] = True

    # ---- hooks ----------------------------------------------------------------------------------
    def _propose(self, n: int) -> list:
        return []

    def _observe(self, layout: Layout, result: TrialResult, asked: bool) -> None:
        pass

    # ---- helpers for subclasses -----------------------------------------------------------------
    def _priority(self, order: np.ndarray) -> list[int]:
        """The unused indices of `order`, non-deferred first, each tier in `order`'s order."""
        order = order[~self.used[order]]
        late = self.deferred[order]
        return [int(i) for i in order[~late]] + [int(i) for i in order[late]]

    def _take(self, p) -> int | None:
        """Resolve proposal `p` to an unused candidate, mark it used and add it to this ask's batch."""
        i = self._resolve(p)
        if i is not None:
            self.used[i] = True
            self._batch.append(i)
        return i

    def _resolve(self, p) -> int | None:
        """An unused candidate index for proposal `p` (an index or a dict of DIMS values)."""
        import numpy as np
        if self.remaining == 0:
            return None
        if isinstance(p, (int, np.integer)):
            i, values = int(p), self.candidates[int(p)].as_dict()
        else:
            values = p
            i = self._by_dims.get(tuple(values[d] for d in DIMS))
        if i is not None and not self.used[i] and (not self.deferred[i] or self.deferred[~self.used].all()):
            return i
        return self.nearest(values)

    def nearest(self, values: dict) -> int | None:
        """The unused candidate closest to `values` (non-deferred first; ties to the lowest index)."""
        import numpy as np
        free = np.flatnonzero(~self.used)
        if free.size == 0:
            return None
        d = ((self.X[free] - np.asarray(self.encode(values))) ** 2).sum(axis=1)
        d = d + _DEFERRED_PENALTY * self.deferred[free]
        return int(free[int(np.argmin(d))])


class OrderedSearcher(BaseSearcher):
    """Proposes candidates in a fixed order (a permutation of indices), deferred ones last.

    The next proposals depend only on the seed and the set of used candidates, so a process that
    replays the same tells proposes the same layouts.
    """

    def __init__(self, candidates: list[Layout], order: np.ndarray, **kw):
        import numpy as np
        super().__init__(candidates, **kw)
        self.order = np.asarray(order, dtype=int)
        self._start = 0   # every entry before it is used

    def _propose(self, n: int) -> list:
        while self._start < len(self.order) and self.used[self.order[self._start]]:
            self._start += 1
        out: list[int] = []
        rest = self.order[self._start:]
        for i in rest[~self.used[rest] & ~self.deferred[rest]]:
            if len(out) == n:
                return out
            out.append(int(i))
        for i in rest[~self.used[rest] & self.deferred[rest]]:
            if len(out) == n:
                break
            out.append(int(i))
        return out
