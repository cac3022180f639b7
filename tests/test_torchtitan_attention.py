"""tuner.perfmodel.compute.attention_kernel (issue 26): torchtitan's attention charged as `tuner launch` runs it --
torchtitan @ 238fa9953e4a asks SDPA for cuDNN's fused attention first on every CUDA GPU (the Llama 3 and Qwen3 flavors),
FlexAttention for its DeepSeek-V3 (MLA) flavors; ROCm has no cuDNN (PyTorch's FlashAttention-2 backend)."""

from __future__ import annotations

import dataclasses

from tuner import frameworks
from tuner.layout import Layout
from tuner.perfmodel import compute
from tuner.specs import make_workload


def _attention_s(framework: str, model: str = "llama3-8b", cluster: str = "h100") -> tuple[str, float, float]:
    w = make_workload(model, 1, cluster, global_batch=8, framework=framework)
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, zero_stage=3 if framework == "torchtitan" else 1)
    sh = compute.shape_of(lay, w)
    times = compute.layer_times(w.model, w.cluster, sh)
    return compute.attention_kernel(frameworks.of(w), w), sh.attention_slowdown, times["attention"]


def test_llama3_on_h100_torchtitan_runs_the_fused_attention_as_megatron_core():
    """What launch runs on an H100 is cuDNN's attention: the same seconds as Megatron-Core's fused attention at the
    same shape (it was FA2_ON_HOPPER = 2 times that)."""
    kernel, slowdown, tt = _attention_s("torchtitan")
    fused, _, mcore = _attention_s("megatron-core")
    assert (kernel, fused, slowdown) == ("cudnn", "fused", 1.0)
    assert tt == mcore
    assert _attention_s("torchtitan", cluster="gb200")[:2] == ("cudnn", 1.0)


def test_torchtitan_s_other_kernels():
    assert _attention_s("torchtitan", cluster="mi300x")[:2] == ("flash-attn-2", compute.FA2_ON_HOPPER)   # ROCm
    assert _attention_s("torchtitan", cluster="a100")[:2] == ("cudnn", 1.0)
    kernel, slowdown, _ = _attention_s("torchtitan", model="deepseek-v3")        # MLA: torchtitan's "671B" is flex
    assert (kernel, slowdown) == ("flex", compute.FA2_ON_HOPPER)
    assert compute.kernel_slowdown("flex", make_workload("llama3-8b", 1, "a100").cluster) == 1.0


def test_torchtitan_refuses_context_parallel_with_flex_attention():
    """torchtitan @ 238fa9953e4a: DeepSeekV3ModelArgs.update_from_config raises NotImplementedError for
    context_parallel_degree > 1 with attn_type != "sdpa" (models/deepseek_v3/model/args.py lines 101-109), and its 671B
    flavor runs flex: a layout tuner would launch to fail is refused in one line; Llama 3 with CP is not."""
    fw = frameworks.get("torchtitan")
    dsv3 = make_workload("deepseek-v3", 64, "h100", framework="torchtitan")
    cp = Layout(tp=1, pp=1, dp=256, context_parallel=2, micro_batch=1, zero_stage=3, expert_parallel=8)
    assert "FlexAttention" in fw.refusal(cp, dsv3) and "cp 1" in fw.refusal(cp, dsv3)
    assert fw.refusal(dataclasses.replace(cp, context_parallel=1, dp=512), dsv3) is None
    llama = make_workload("llama3-8b", 2, "h100", global_batch=16, framework="torchtitan")
    assert fw.refusal(Layout(tp=1, pp=1, dp=8, context_parallel=2, micro_batch=1, zero_stage=3), llama) is None
