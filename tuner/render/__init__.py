"""Pure renderers: a layout and a workload in, text or a dict out. No I/O, no subprocess, no torch.

- `dsconfig`: the DeepSpeed config (ds_config.json) — the one renderer of it, for the bundled harness
  and for Megatron-DeepSpeed;
- `megatron`: the arguments of Megatron-DeepSpeed's `pretrain_gpt.py` (and its DeepSpeed config);
- `mcore`: the arguments of Megatron-LM's (Megatron-Core) `pretrain_gpt.py` (`tuner launch --framework megatron-core`);
- `torchtitan`: a torchtitan TOML job file (`tuner launch --framework torchtitan`);
- `sbatch`: the sbatch script of one trial, from the cluster's [slurm] table;
- `launch`: the files `tuner launch` writes (ds_config.json, megatron_args.txt, launch.sbatch, layout.json;
  per --framework).

The runners (local harness, slurm) and `tuner launch` import from here, so a trial and a launched run
get the same files. Each renderer has golden files under tests/golden/.
"""
