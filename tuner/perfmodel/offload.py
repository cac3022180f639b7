"""Megatron-Core's CPU activation offloading (the layout's offload_layers: --cpu-offloading-num-layers N, activations
offloaded, weights not), as TransformerEngine runs it. Pure.

Megatron-Core's TransformerBlock asks TransformerEngine for its offload context with the block's layer count
(megatron/core/transformer/transformer_block.py lines 304-318 at NVIDIA/Megatron-LM d98e8a64ddf3);
TransformerEngine's AsyncDoubleBufferGroupOffloadHandler (transformer_engine/pytorch/cpu_offload.py at v2.7, the one
Megatron-Bridge's GB200 / GB300 recipes ran; `layer_window_map` lines 340-349, synchronize_on_group_commit_forward
lines 481-538, on_group_commit_backward lines 610-633) offloads the first N layers' saved activations:
- forward: layer g's copy to the host (on its own d2h stream) is awaited at the end of layer window[g]'s forward
  ("stream synchronization both ways"), then the layer's activations are freed and the next group's copy starts.
  So copy 0 runs under layers 1 .. window[0]'s forward, copy g under layers window[g-1] + 1 .. window[g]'s, one at a
  time; what a copy takes beyond that compute is the compute stream's wait;
- backward: the reload of group g (h2d stream) starts before layer window[g]'s backward, after the compute stream has
  waited for the reload before it; group 0's is awaited before layer 0's backward: the same spans of layers, run
  backward.
The other layers keep their activations until their backward (resident_layers).
Bandwidth: data-parallel ranks run the same schedule, so every GPU of a node copies the same way at once; a copy moves
at what one GPU gets then (the cluster's host_d2h_gbps / host_h2d_gbps: nvbandwidth's all_to_host / host_to_all
memcpy_ce, copy engines), not the link's peak: on an 8x H800 HGX node 44.8 GB/s to the host and 55.2 from it of PCIe
Gen5 x16's 63, on a GB200 tray 182.1 / 168.5 (the cluster files cite them). Forward copies only go to the host and
backward reloads only come back, so neither direction is charged the other's traffic.
The NIC beside them (shared_rates): an HGX GPU has one PCIe x16 link, to its PCIe switch, and its NIC sits behind that
switch too (nvidia-smi topo: GPU PIX NIC, NVIDIA/nccl#1264 on HGX H100, vllm-project/vllm#31594 on HGX B200), so the
NIC's GPUDirect RDMA traffic crosses the same link as the copies: what the NIC sends it reads from the GPU's memory
(GPU -> switch, the lanes the forward's copies to the host use), what it receives it writes there (switch -> GPU, the
backward's reloads). PCIe is full duplex: each direction has its own 16 lanes, so only flows the same way share.
Where the cluster says so (nic_shares_host_link), the layout's inter-node data-parallel traffic that runs under the
same phase (the parameter gathers under the forward, the gradient reduce / reduce-scatter and ZeRO-3's re-gathers
under the backward) runs at the NIC's rate for the share of the phase it is busy; then the copy gets what it leaves of
the link's peak (host_link_gbps), never more than it gets alone, and the rest of the phase its own rate. DGX A100
shares differently: two GPUs and their NICs sit behind one PCIe Gen4 switch with one x16 uplink (GPU PXB GPU, GPU PXB
NIC: NVIDIA/nccl#1505), so the pair's copies share the uplink -- in the cluster's halved per-GPU rates (a100.toml),
not a rule here -- while a NIC's GPUDirect traffic turns at the switch and shares only its GPU's own x16 link, which
the rule above describes. HGX B300 is not described: its NIC's traffic shares the GPU's Gen6 x16 link to the
ConnectX-8's switch, while the copies are bounded by the Gen5 x16 link on to the CPU (b300.toml): not charged.
ASSUMPTION: the network flow is served first (its time is the model's own, unchanged) and the collective's seconds are
spread evenly over the phase's compute. Not charged (ESTIMATE: small): the copy engine's HBM traffic beside the
compute (<= 55 of 3,350 GB/s on H100, 182 of 8,000 on GB200: under 2.3 %)."""

from __future__ import annotations

import functools


def windows(layers: int, offloaded: int) -> list[int]:
    """TransformerEngine's layer_window_map: the layer at whose end of forward offloaded group g is freed."""
    out, constant = [], 0
    for g in range(offloaded):
        w = (layers // offloaded) * (g + 1) - 1
        if g < layers % offloaded:
            w, constant = w + g + 1, g + 1
        else:
            w += constant
        out.append(w)
    return out


@functools.lru_cache(maxsize=None)
def resident_layers(layers: int, offloaded: int) -> int:
    """Layers whose activations are on the GPU at once when the first `offloaded` of `layers` are offloaded: offloaded
    layer g stays until the forward of layer windows()[g] has run; the other layers stay until their backward. The
    largest count over the forward (the backward reloads one group ahead of it). `layers` when nothing is offloaded."""
    if offloaded <= 0:
        return layers
    window = windows(layers, offloaded)
    return max(max(0, c + 1 - offloaded) + sum(1 for g in range(min(c + 1, offloaded)) if window[g] >= c)
               for c in range(layers))


def spans(layers: int, offloaded: int) -> list[int]:
    """The layers whose compute each group's copy runs under (the module's docstring): window[0], then the gaps."""
    window = windows(layers, offloaded)
    return [window[0]] + [b - a for a, b in zip(window, window[1:])]


def exposed_seconds(layers: int, offloaded: int, d2h_s: float, h2d_s: float, forward_s: float,
                    backward_s: float) -> float:
    """Seconds per micro-batch the compute stream waits for the copies: each group's copy to the host (`d2h_s`)
    beyond the forward of the layers it runs under (`forward_s` a layer), and its reload (`h2d_s`) beyond their
    backward. The copies are `Tensor.copy_(non_blocking=True)` between device and pinned host memory (offload / reload,
    cpu_offload.py lines 243-272 at v2.7): cudaMemcpyAsync on a copy engine, no SM taken from the compute."""
    return sum(exposed_parts(layers, offloaded, d2h_s, h2d_s, forward_s, backward_s))


def exposed_parts(layers: int, offloaded: int, d2h_s: float, h2d_s: float, forward_s: float,
                  backward_s: float) -> tuple[float, float]:
    """exposed_seconds' forward waits (the copies to the host) and backward waits (the reloads) apart."""
    if offloaded <= 0:
        return 0.0, 0.0
    n = span_counts(layers, offloaded)
    return (sum(c * max(0.0, d2h_s - k * forward_s) for k, c in n),
            sum(c * max(0.0, h2d_s - k * backward_s) for k, c in n))


@functools.lru_cache(maxsize=None)
def span_counts(layers: int, offloaded: int) -> tuple[tuple[int, int], ...]:
    """spans() as (span, how many groups have it): a few distinct spans however many groups (busy_share asks
    exposed_parts dozens of times a layout)."""
    n = spans(layers, offloaded)
    return tuple((k, n.count(k)) for k in sorted(set(n)))


def busy_share(nic_s: float, kernels_s: float, waits) -> float:
    """The share of a phase the NIC is busy when its `nic_s` seconds spread evenly over the phase's whole length: its
    kernels' `kernels_s` and the compute stream's waits for the copies, `waits(share)`, which the share lengthens (the
    copies move slower while the NIC runs): the s with s (kernels_s + waits(s)) = nic_s. The left side grows with s,
    so one s solves it (bisection on [0, nic_s / kernels_s], the kernels alone; 0 where the NIC sends nothing).
    Taken over the kernels alone, a phase the copies outlast would have the NIC busy longer than it runs and the
    copies slowed by more than its seconds can take from them (benchmarks/invariants.py)."""
    if nic_s <= 0 or kernels_s <= 0:
        return 0.0
    lo, hi = 0.0, nic_s / kernels_s
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mid * (kernels_s + waits(mid)) < nic_s else (lo, mid)
    return hi


BISECTIONS = 40     # busy_share's steps: the share to 2^-40 of its bound


def shared_rates(d2h: float, h2d: float, link: float, nic: float, forward_busy: float,
                 backward_busy: float) -> tuple[float, float]:
    """GB/s the copies get to and from the host (`d2h`, `h2d`: what they get with every GPU of the node copying)
    while the GPU's NIC moves `nic` GB/s each way over the same PCIe link (peak `link` a direction) for the shares
    `forward_busy` / `backward_busy` (0 .. 1) of the forward and the backward: while the NIC runs the copy gets what
    it leaves of the link (the module's docstring), otherwise its own rate; a copy spans the phase, so it moves at the
    two rates' mean weighted by those shares. 0 shares: `d2h`, `h2d` unchanged."""
    def rate(alone: float, busy: float) -> float:
        return alone if busy <= 0 else alone - min(1.0, busy) * max(0.0, alone - (link - min(nic, link)))
    return rate(d2h, forward_busy), rate(h2d, backward_busy)
