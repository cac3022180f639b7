"""The pipeline's step, simulated op by op: 1F1B and Megatron's interleaved 1F1B, with jitter and stragglers.

Each pipeline rank runs its own list of forward (F) and backward (B) ops in the order its framework's
schedule issues them (Megatron-LM schedules.py: forward_backward_pipelining_without_interleaving, and
..._with_interleaving: warm-up (pp - rank - 1) * 2 + (vp - 1) * pp forwards, then one forward and one
backward in turn, then the cool-down backwards; model chunk of the k-th op from k mod (pp * vp)). An op
starts once its rank is free and its input has arrived: F of chunk c of micro-batch i needs F(c, i) of
the previous rank (rank pp-1's F(c-1, i) on rank 0) plus the p2p send; B needs B of the next rank (rank
0's B(c+1, i) on the last), and the last chunk's B its own F. Every op pays the framework's host cost per
micro-batch and stage, is scaled by its rank's straggler factor and by a log-normal jitter drawn per op.
Nothing assumes the closed form (m + p - 1) x stage time: bubbles, uneven stages and slow ranks come out
of the simulation. Long runs are simulated on two shorter ones and extrapolated along their steady period.
"""

from __future__ import annotations

import numpy as np


def order(pp: int, vp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """(kind, chunk, micro-batch) of rank's ops in issue order."""
    total = m * vp
    if vp == 1:
        warm = min(pp - rank - 1, m)
    else:
        warm = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)

    def op(k: int, forward: bool) -> tuple[str, int, int]:
        in_group = k % (pp * vp)
        chunk = in_group // pp
        if not forward:
            chunk = vp - chunk - 1
        return ("F" if forward else "B", chunk, (k // (pp * vp)) * pp + in_group % pp)

    ops = [op(k, True) for k in range(warm)]
    for j in range(total - warm):
        ops += [op(warm + j, True), op(j, False)]
    ops += [op(k, False) for k in range(total - warm, total)]
    return ops


def makespan(fwd, bwd, p2p: float, host: float, slow, jitter: float, m: int, rng) -> float:
    """Seconds from the first forward to the last backward. fwd[r][c], bwd[r][c]: one micro-batch of
    chunk c on rank r; p2p: a send between ranks; host: per op; slow[r]: rank r's factor."""
    pp, vp = len(fwd), len(fwd[0])
    if pp == 1:                          # one rank: its ops back to back
        z = np.exp(jitter * rng.standard_normal((2, m))) if jitter else np.ones((2, m))
        return float(((fwd[0][0] * z[0] + bwd[0][0] * z[1]) * slow[0]).sum() + 2 * m * host)
    orders = [order(pp, vp, m, r) for r in range(pp)]
    noise = [np.exp(jitter * rng.standard_normal(len(o))) if jitter else np.ones(len(o)) for o in orders]
    done = {}
    free = [0.0] * pp
    pos = [0] * pp
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(pp):
            o = orders[r]
            while pos[r] < len(o):
                kind, c, i = o[pos[r]]
                dep = _dependency(kind, c, i, r, pp, vp)
                if dep is not None and dep not in done:
                    break
                arrive = 0.0 if dep is None else done[dep] + (p2p if dep[3] != r else 0.0)
                dur = (fwd[r][c] if kind == "F" else bwd[r][c]) * slow[r] * noise[r][pos[r]] + host
                done[(kind, c, i, r)] = free[r] = max(free[r], arrive) + dur
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")
    return max(free)


def _dependency(kind: str, c: int, i: int, r: int, pp: int, vp: int):
    if kind == "F":
        if r > 0:
            return ("F", c, i, r - 1)
        return ("F", c - 1, i, pp - 1) if c > 0 else None
    if r < pp - 1:
        return ("B", c, i, r + 1)
    return ("B", c + 1, i, 0) if c < vp - 1 else ("F", c, i, r)


def pipeline_time(fwd, bwd, p2p: float, host: float, slow, jitter: float, m: int, rng, cap: int = 8) -> float:
    """makespan for m micro-batches; beyond pp + cap of them (rounded up to whole groups of pp with
    interleaving), two shorter runs set the steady period the rest adds."""
    pp, vp = len(fwd), len(fwd[0])
    step = pp if vp > 1 else 1
    m1 = -(-(pp + cap) // step) * step
    if m <= m1 + step * max(1, cap // step):
        return makespan(fwd, bwd, p2p, host, slow, jitter, m, rng)
    m2 = m1 + step * max(1, cap // step)
    t1 = makespan(fwd, bwd, p2p, host, slow, jitter, m1, rng)
    t2 = makespan(fwd, bwd, p2p, host, slow, jitter, m2, rng)
    return t2 + (m - m2) * max(t2 - t1, 0.0) / (m2 - m1)
