"""More of benchmarks/seen.py's SEEN (choices made after seeing rows, each with the rows it saw), kept here because
seen.py is at the house size; seen.py merges SEEN_MOE into SEEN (its names are read from there, or from published.py).
Imported while seen.py is being read: `_saw` and `held_out` are defined there before SEEN."""

from __future__ import annotations

from seen import _saw, held_out

SEEN_MOE = {
    # issue 25 item 3 (s10): group-limited routing in the flex dispatcher's reach (tuner/perfmodel/moe_exchange.hit_probability:
    # DeepSeek-V3's 4 of 8 expert groups, from Megatron-Core's group_limited_topk and router, no constant fitted), looked for
    # after the in-split MoE rows had been printed (the two flex DeepSeek-V3 runs on 1,024 H100, -17.0 / -14.8 %); it moves
    # only the flex-dispatcher DeepSeek-V3 rows, so it names those that were printed (no hashed-out row's error was)
    "group-limited routing in the flex dispatcher's reach (tuner/perfmodel/moe_exchange.hit_probability)": (
        "speed", lambda r: r.get("model") == "deepseek-v3" and str(r.get("dispatcher", "")).startswith("flex")
        and not held_out(r) and _saw(r, "issue 25 / 26 second read of the twelfth session")),
}
