"""Megatron-Core's fixed cost per step, measured by Megatron-LM's own CI, as a model VARIANT that is not applied
(issues 25 / 26).

Run: python benchmarks/step_floor.py [--only NAME ...]   (the CI step tuner predicts and the floor it leaves, then the
     published-run benchmarks -- moe, framework, llama, hardware, scaling -- with the floor in place; the model itself
     is left as it was. Deterministic, ~4 min.)

The question (docs/benchmarks.md, issues 25 / 26): runs at <= 1 sequence per GPU are predicted too fast by a roughly
fixed amount (Llama 3 8B cp 2 on 32-256 B200: measured 0.19-0.22 s a step, predicted 0.145 s), and every strong-
scaling series with a stated layout has a larger fixed part c in step = a / N + c than predicted.

What a Megatron-Core step does besides the forward / backward and the collectives tuner counts (megatron/training/
training.py `train_step` at d98e8a64dd): zero_grad_buffer over every model chunk, the optimizer's Python walk over its
parameter groups (megatron/core/optimizer/optimizer.py `step`), a gradient-norm all-reduce read back to the host
(megatron/core/optimizer/clip_grads.py `get_grad_norm_fp32`: `total_norm.item()`, a device synchronisation, after which
the optimizer's and the next step's first kernels start from an empty queue), the learning-rate scheduler, the last
stage's loss all-reduce over the dp x cp group, and logging. None of it grows with the model's compute.

Its size, fitted on no training row: Megatron-LM's CI runs a 12-layer GPT (hidden 512, 8 heads, sequence 1,024,
micro-batch 4, global batch 32: one micro-batch per rank) at tp 1, pp 1 with the distributed optimizer on one DGX
H100 (8 GPUs) and on two GB200 trays (2 x 4), and commits every step's time (tests/functional_tests/test_cases/gpt/
<case>/golden_values_dev_dgx_{h100,gb200}.json @ d98e8a64dd, "iteration-time", steps 4 on; nodes and GPUs in
tests/test_utils/recipes/{h100,gb200}/gpt.yaml). The cases' medians (CI_CASES): H100 49.3, 53.1, 53.2, 83.0, 86.2 ms,
GB200 66.9, 70.6, 74.2, 76.3 ms; their median (53.2 / 72.4 ms) less tuner's own prediction of that step (20.7 / 5.3 ms)
is the floor: 32.5 ms on an x86 host (DGX H100, B200, B300), 67.1 ms on Grace (GB200 / GB300 trays). The CI logs every
step with --log-params-norm and --log-num-zeros-in-grad (two more host-synchronised reductions): an upper bound for
a run that logs less. Applied to Megatron-Core on CUDA clusters only (no source for ROCm hosts or other frameworks).

Why it is not applied (figures in docs/benchmarks.md): it moves what it was meant to -- B200 median 20.8 -> 17.8 %,
GB200 21.3 -> 16.6 %, strong scaling answer 0.032 -> 0.024 -- but other families the other way: GB300 11.7 -> 13.2 %,
Megatron-LM r0.8's weak series (first point a 1.7B GPT on 48 H100, a 0.5 s step) worst 0.208 -> 0.289, Llama bf16
rows 5.9 -> 6.1 %. The CI floor is too large for Megatron-LM's own 2024 H100 runs and too small for the B200 8B rows'
growth with DP (0.047 s at 32-128 GPUs, 0.074 s at 256): the missing cost is not one constant per host.
On rows added after it was committed (b044da0's MLPerf Training v6.0 GB300 rows, held out): Llama 3 8B NVFP4 on
72 GPUs +9.3 -> -20.7 %, DeepSeek-V3 on 8,192 GPUs -17.0 -> -19.6 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tuner.layout import Layout  # noqa: E402
from tuner.perfmodel import predict, step_floor  # noqa: E402
from tuner.specs import ModelSpec, load_cluster, make_workload  # noqa: E402

#: iteration-time medians (ms, steps 4 on) of Megatron-LM's tp1 pp1 distributed-optimizer CI cases @ d98e8a64dd
CI_CASES = {
    "h100": {"gpt3_mcore_te_tp1_pp1_frozen_resume_torch_dist_dist_optimizer": 49.3,
             "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer": 53.1,
             "gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather": 53.2,
             "gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files": 83.0,
             "gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset": 86.2},
    "gb200": {"gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer": 66.9,
              "gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather": 70.6,
              "gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset": 74.2,
              "gpt3_mcore_te_tp1_pp1_dist_optimizer_no_mmap_bin_files": 76.3},
}
#: the CI's GPT (model_config.yaml of those cases: GPT-2 BPE vocabulary, padded to 50,304 by Megatron)
CI_GPT = ModelSpec.from_dict({"name": "megatron-ci-gpt", "num_layers": 12, "hidden_size": 512, "num_attention_heads": 8,
                              "seq_length": 1024, "vocab_size": 50304, "global_batch": 32}, "benchmarks/step_floor.py")
CI_LAYOUT = Layout(tp=1, pp=1, dp=8, micro_batch=4, zero_stage=1, recompute="none")
HOST_OF_CI = {"h100": "x86", "gb200": "grace"}
GRACE_HOSTED = ("gb200", "gb300")       # presets whose GPUs sit on Grace CPUs (NVL72 trays)


def ci_step(cluster: str) -> float:
    """Tuner's predicted step (s) of the CI configuration on `cluster`, as the model stands."""
    w = make_workload(CI_GPT, 8 // load_cluster(cluster).gpus_per_node, cluster, 32, "bf16", "megatron-core")
    return predict(CI_LAYOUT, w).step_time_s


def floors_ms() -> dict[str, float]:
    """The floor per host: the CI cases' median less tuner's predicted CI step on the machine they ran on."""
    return {HOST_OF_CI[c]: statistics.median(v.values()) - 1e3 * ci_step(c) for c, v in CI_CASES.items()}


class Variant:
    """The model with Megatron-Core's floor once per step (on CUDA clusters whose file states no measured
    step_overhead_ms); everything else as it was. Restores the model on exit."""

    def __enter__(self):
        self.saved = step_floor.step_floor_s
        floors = floors_ms()

        def floor(framework, cluster):
            own = self.saved(framework, cluster)
            if own or framework != "megatron-core" or cluster.software != "cuda":
                return own
            return floors["grace" if cluster.name in GRACE_HOSTED else "x86"] * 1e-3

        step_floor.step_floor_s = floor
        return self

    def __exit__(self, *exc):
        step_floor.step_floor_s = self.saved


def main(argv=None) -> None:
    import framework_accuracy
    import hardware_accuracy
    import llama_accuracy
    import moe_accuracy
    import scaling_accuracy
    benches = {"moe": moe_accuracy, "framework": framework_accuracy, "llama": llama_accuracy,
               "hardware": hardware_accuracy, "scaling": scaling_accuracy}
    ap = argparse.ArgumentParser(description="Megatron-Core's CI step floor as a model variant (not applied)")
    ap.add_argument("--only", nargs="+", choices=sorted(benches), help="run only these benchmarks")
    args = ap.parse_args(argv)
    print("== Megatron-Core's step floor from Megatron-LM's CI (variant, not applied)")
    for c, cases in CI_CASES.items():
        print(f"  {c}: CI median {statistics.median(cases.values()):.1f} ms over {len(cases)} cases, tuner predicts "
              f"{1e3 * ci_step(c):.1f} ms -> floor {statistics.median(cases.values()) - 1e3 * ci_step(c):.1f} ms "
              f"({HOST_OF_CI[c]} host)")
    with Variant():
        for name in args.only or benches:
            print()
            benches[name].main() if name != "scaling" else benches[name].main([])


if __name__ == "__main__":
    main()
