"""How a spec file's keys are checked: known, present where required, of their type, positive (the fixed
overheads and "none" counts may be 0) and small enough for the store's 32-bit columns. Used by the model and the
cluster specs alike."""

from __future__ import annotations

from typing import Any

from tuner.errors import SpecError

MAX_INT = 2**31 - 1   # every count is stored in 32-bit integer columns (PostgreSQL INTEGER)

#: Numbers that may be 0: the fixed overheads (measured as none) and counts whose 0 means "none".
ALLOW_ZERO = frozenset({"microbatch_overhead_ms", "step_overhead_ms", "num_experts", "num_shared_experts",
                        "moe_first_dense_layers", "mtp_num_layers"})


def check_keys(kind: str, path: str, data: dict, keys: dict[str, tuple[type, Any]]) -> dict:
    """`data` with every key of `keys` (type, default; a default of ... means required): unknown, missing,
    mistyped, non-positive (but ALLOW_ZERO) or too large values refused in one SpecError line."""
    unknown = sorted(set(data) - set(keys))
    if unknown:
        shown = ", ".join(k if k.isidentifier() else repr(k) for k in unknown)   # one line, whatever the key
        raise SpecError(f"{path}: unknown {kind} key(s) {shown}; valid keys: {', '.join(keys)}")
    missing = [k for k, (_, d) in keys.items() if d is ... and data.get(k) is None]
    if missing:
        raise SpecError(f"{path}: missing {kind} key(s) {', '.join(missing)}; valid keys: {', '.join(keys)}")
    out = {}
    for k, (typ, default) in keys.items():
        if data.get(k) is None:  # absent (a stored spec keeps unset optional keys as None)
            out[k] = default
            continue
        v = data[k]
        ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            raise SpecError(f"{path}: {kind} key '{k}' must be {typ.__name__}, got {type(v).__name__} ({v!r})")
        if typ in (int, float) and not (v > 0 or (k in ALLOW_ZERO and v == 0)):   # also refuses NaN
            raise SpecError(f"{path}: {kind} key '{k}' must be {'>=' if k in ALLOW_ZERO else '>'} 0, got {v}")
        if typ is int and v > MAX_INT or typ is float and v == float("inf"):
            raise SpecError(f"{path}: {kind} key '{k}' must be at most {MAX_INT}, got {v}")
        if k == "name" and not (v.strip() and v.isprintable() and len(v) <= 200):
            raise SpecError(f"{path}: {kind} name {v[:200]!r} must be one printable line of at most 200 characters")
        out[k] = v
    return out
