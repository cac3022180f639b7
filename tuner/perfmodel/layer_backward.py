"""What one Megatron-Core layer's backward holds on top of the activations a stage keeps (issue 24): pure functions.

A pipeline stage that is not the last (and the last one after its loss) peaks in the backward of the first layer it
runs backward -- its last layer, with every in-flight micro-batch's kept activations still alive (under full recompute,
the checkpoints and that layer's recomputed activations). Read from megatron-core 0.16.1 and checked against the live
tensors at the peak of fake-tensor rows (benchmarks/measure_memory_mcore.py, FRESH2):
- tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward: `grad_input =
  grad_output.matmul(weight)`; the weight gradient `grad_output.t().matmul(total_input)` in the parameters' bf16 at
  the measured flags (gradient_accumulation_fusion=False), and with gradient-accumulation fusion (Megatron-LM's default,
  which tuner's launch keeps) a bf16 tensor of the same shape all the same (`torch.empty(weight.main_grad.shape,
  dtype=input.dtype)`, or TransformerEngine's get_dummy_wgrad), so both runs hold 2 bytes per parameter of the linear
  until distributed/distributed_data_parallel.py's grad-accumulator hook adds it into main_grad and drops it
  (`param.grad = None`); with sequence parallelism the row-parallel linear's gradient is all-gathered whole
  (mappings.py _gather_along_first_dim) and the column-parallel one's input gradient is computed whole and
  reduce-scattered into a new s/t tensor (`sub_grad_input`);
- fusions/fused_bias_gelu.py, fused_bias_swiglu.py: the activation's backward writes one tensor of its input's shape;
- each autograd node's saved tensors are freed when it returns, so the MLP's moments are, beyond the kept activations
  (T = s*b/cp tokens per rank, f the FFN width, f1 = 2f for SwiGLU's fc1, h the hidden size, t the TP degree):
  fc2's weight gradient: its output gradient T*h (the SP gather; without SP the dropout's input gradient, tuner's
  launch keeping Megatron-LM's hidden dropout), its input gradient T*f/t and its weight gradient h*f/t;
  the activation's backward: T*f1/t (fc2's saved input is freed by then);
  fc1's weight gradient: fc2's input and the activation's saved input freed (-T*f/t net), the input gradient T*h
  (and its T*h/t reduce-scattered copy with SP) and the weight gradient f1*h/t.
  The attention block's moments come after the MLP's kept tensors are freed, and are smaller.
- The gradient the layer receives (the pipeline's received gradient on a stage that is not the last, the final norm's
  input gradient on the last): T*h/t with SP, T*h without, alive through the layer's MLP.
- pp = 1 with tied embeddings: the output layer's bf16 weight gradient (V*h/t) waits in the shared weight's
  accumulator until the embedding's backward adds its own, so it is alive through every layer's backward.
- Full recompute (tensor_parallel/random.py CheckpointFunction.backward): the recomputed layer's output, T*h/t with SP,
  is alive through that layer's backward beside its recomputed activations (the next layer's checkpoint is the first
  forward's output, another tensor) -- checked on FRESH2's GPT tp 4 pp 2 stage 0 (issue 24 round 8, second pass).
The MoE layers' backward (routed experts) is not derived: 0 for an MoE model.
"""

from __future__ import annotations


def megatron_backward_bytes(model, t: int, sp: bool, tokens: float, pp: int, recompute: str = "none") -> float:
    """Bytes one rank holds in a dense Megatron-Core layer's backward beyond the stage's kept activations: the received
    gradient and the largest of the MLP's three moments (module docstring), plus the tied output layer's weight
    gradient where pp = 1 and the recomputed layer's output under full recompute. `tokens`: a rank's share of a
    micro-batch in sequences (Shape.tokens)."""
    if model.is_moe:
        return 0.0
    h, f = model.hidden_size, model.ffn_hidden_size
    f1 = 2.0 * f if model.ffn_type == "swiglu" else f
    n = model.seq_length * tokens
    received = n * h / (t if sp else 1)
    fc2 = n * h + n * f / t + h * f / t
    act = n * f1 / t
    fc1 = n * h - n * f / t + (n * h / t if sp else 0.0) + f1 * h / t
    tied = model.vocab_size * h / t if pp == 1 and model.tie_embeddings else 0.0
    output = received if recompute == "full" else 0.0
    return 2.0 * (received + max(fc2, act, fc1) + tied + output)
