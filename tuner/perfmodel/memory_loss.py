"""The memory outside the layers at the loss, phase by phase: torchtitan (FSDP2, one pipeline stage) and Megatron-Core's
last stage (`megatron_loss_bytes`, at the end): pure functions (issue 24).

A torchtitan step peaks in one of three phases, each holding the layers' kept activations (or none) and its own
working set; tuner.perfmodel.memory.stage_memory takes the largest:
- the loss (`loss_phase`): every layer's kept activations are live and the LM head runs, derived below from
  torchtitan 0.3.0's components/loss.py (ChunkedLossWrapper, CrossEntropyLoss, _LossParallelCrossEntropy) and
  torch 2.13's FSDP2 (fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce, _fsdp_param.py
  to_accumulated_grad_if_needed);
- a layer's backward: the kept activations, the recomputed layer's working activations (full recompute) and one
  layer's FSDP buffers (memory.fsdp_buffers' account, unchanged);
- the embedding's backward, last: only the embedding unit's FSDP buffers.
Every term was checked against the tracker's categories (Activation, Temp, Unsharded Param / Grad) of TUNING rows
of benchmarks/data/memory_measured_torchtitan.toml, which all peak in the loss.
"""

from __future__ import annotations

#: torchtitan 0.3.0's ChunkedLossWrapper default (components/loss.py, num_chunks 8), which the fake-tensor
#: measurements ran; the torchtitan tuner launches (238fa9953e4a) computes its loss un-chunked.
MEASURED_LOSS_CHUNKS = 8
LAUNCHED_LOSS_CHUNKS = 1

#: The final RMSNorm's saved tensors per s*b*h element (h/t of it with sequence parallelism): torch 2.13's
#: rms_norm decomposition saves its fp32 upcast input and the fp32 normalised input (4 + 4; checked with
#: saved_tensors_hooks on nn.RMSNorm over a bf16 input, on the CPU the measurements ran on).
FINAL_NORM_SAVED = 8.0


#: A compiled un-chunked loss (torchtitan compiles the loss with the model: tuner's torchtitan compiles with fp8)
#: fuses the upcast, log-softmax and its backward, so none of the eager fp32 temporaries exist: it keeps tuner's
#: earlier account, 4 bytes per s*b*V/t element (fp32 logits) -- NOT derived from inductor's kernels (the one
#: published compiled run with a stated peak, Trainy's H200 Llama 3 8B fp8, states 2 % more than this predicts).
COMPILED_LOSS_BYTES = 4.0


def loss_phase(model, tp: int, sp: bool, tokens: float, micro_batch: int, shards: int,
               chunks: int = LAUNCHED_LOSS_CHUNKS, compiled: bool = False) -> tuple[float, float]:
    """(activations, FSDP buffers) torchtitan holds outside the layers at its loss's peak on one rank, in bytes.

    Both losses: the final norm's saved fp32 tensors (FINAL_NORM_SAVED per element, split by t with sequence
    parallelism) and its bf16 output `pred`, whole on every TP rank (the root norm's output is replicated over TP
    before the LM head), held by the trainer through the loss: 2 bytes per s*b*h element.

    Chunked (ChunkedLossWrapper, `chunks` > 1): the peak is the LM head's reduce-scatter in the last chunk's
    backward (the [norm, lm_head] unit's reshard and gradient sync are off for chunks 0..N-2). Live: the detached
    chunks' contiguous copies of `pred` (2 bytes, only when the local batch is > 1: with one sequence they are
    views), GradAccumulator's fp32 buffer (4), the last chunk's bf16 logits (2 s*b*V/t / chunks, held by the loop)
    and, per LM-head parameter on the rank (V*h/t): the gathered bf16 weight (2), the last chunk's bf16 gradient
    (2), FSDP's fp32 accumulated gradient (4, to_accumulated_grad_if_needed), the fp32 reduce-scatter input (4) and
    its output (4/d) -- 12 + 4/d bytes.

    Un-chunked (CrossEntropyLoss on the full logits): the peak is the loss's backward, before the LM head's: the
    fp32 log-probabilities it saved and its backward's fp32 temporaries, per s*b*V/t element 12 bytes at tp 1
    (F.cross_entropy: log_softmax's output, nll_loss's gradient, log_softmax's gradient) and 16 with loss parallel
    (_LossParallelCrossEntropy: log_probs, zeros_like(log_probs), exp(log_probs) and their sum), with the
    gathered bf16 LM head (2 bytes per parameter); the bf16 logits were freed with `pred` (`del pred` before
    backward in Trainer.forward_backward_step). `compiled`: COMPILED_LOSS_BYTES instead."""
    s, h, v = model.seq_length, model.hidden_size, model.vocab_size
    sbh, logits, head = s * tokens * h, s * tokens * v / tp, v * h / tp
    both = (FINAL_NORM_SAVED / (tp if sp else 1) + 2.0) * sbh
    if chunks > 1:
        copies = 2.0 * sbh if micro_batch > 1 else 0.0
        return both + copies + 4.0 * sbh + 2.0 * logits / chunks, (12.0 + 4.0 / max(1, shards)) * head
    per = COMPILED_LOSS_BYTES if compiled else 16.0 if tp > 1 else 12.0
    return both + per * logits, 2.0 * head


def megatron_loss_bytes(model, tp: int, sp: bool, tokens: float) -> float:
    """What Megatron-Core's last stage holds beyond the layers' kept activations at its loss's peak, per micro-batch, in
    bytes: the larger of two moments of megatron-core 0.16.1's unfused vocab-parallel loss (tuner launches no
    --cross-entropy-loss-fusion), both with the final norm's saved input (the last layer's output) and the output
    layer's saved input (the norm's bf16 output), 2 + 2 bytes per s*b*h element (h/t of it with sequence parallelism):
    - the loss's forward (tensor_parallel/cross_entropy.py calculate_logits_max: `vocab_parallel_logits.float()` while
      the output layer's bf16 logits are alive; the exp and the softmax run in place): 2 + 4 bytes per s*b*V/t logit;
    - the output layer's backward (tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward:
      the fp32 gradient of the logits is freed once cast): the bf16 gradient of the logits (2 per logit), the bf16
      weight gradient (2 per V*h/t parameter: grad_output.t().matmul(total_input), or the dummy wgrad tensor with
      gradient-accumulation fusion) and the input gradient grad_output.matmul(weight), 2 bytes per s*b*h element
      whole on every TP rank (plus its reduce-scattered h/t share with sequence parallelism).
    Checked against the tracker's live tensors at the peak of fake-tensor rows (benchmarks/measure_memory_mcore.py)."""
    s, h, v = model.seq_length, model.hidden_size, model.vocab_size
    sbh, logits = s * tokens * h, s * tokens * v / tp
    kept = 4.0 * sbh / (tp if sp else 1)
    forward = 6.0 * logits
    backward = 2.0 * logits + 2.0 * v * h / tp + 2.0 * sbh * (1.0 + (1.0 / tp if sp else 0.0))
    return kept + max(forward, backward)
