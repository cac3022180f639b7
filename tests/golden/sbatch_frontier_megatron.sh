#!/bin/bash
# tuner trial 7 of study "gpt175b-frontier": tp4-pp16-dp2-mb1-z1-rcfull, model "gpt-175b", 16 node(s), template megatron
#SBATCH --job-name=tuner-gpt175b-frontier-7
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --account=abc123
#SBATCH --partition=batch
#SBATCH --time=00:30:00
#SBATCH --output=slurm-%j.out
#SBATCH --open-mode=append

set -uo pipefail
cd /lustre/orion/abc123/results/trials/gpt175b-frontier/7 || exit 1
module load PrgEnv-gnu
module load rocm/5.7.0
module load craype-accel-amd-gfx90a
export NCCL_NET_GDR_LEVEL=3
export FI_CXI_ATS=0
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_CROSS_NIC=1
export MIOPEN_USER_DB_PATH=/tmp/miopen-cache
export MIOPEN_CUSTOM_CACHE_DIR=/tmp/miopen-cache
export TUNER_TRIAL_JSON=/lustre/orion/abc123/results/trials/gpt175b-frontier/7/trial.json
export TUNER_RESULT_JSON=/lustre/orion/abc123/results/trials/gpt175b-frontier/7/result.json
export TUNER_TRIAL_DIR=/lustre/orion/abc123/results/trials/gpt175b-frontier/7
export TUNER_STUDY=gpt175b-frontier
export TUNER_TRIAL=7
export TUNER_TP=4
export TUNER_SEQUENCE_PARALLEL=0
export TUNER_CONTEXT_PARALLEL=1
export TUNER_PP=16
export TUNER_VIRTUAL_PIPELINE=1
export TUNER_PIPELINE_SPLIT=auto
export TUNER_DP=2
export TUNER_EXPERT_PARALLEL=1
export TUNER_EXPERT_TENSOR_PARALLEL=1
export TUNER_MICRO_BATCH=1
export TUNER_ZERO_STAGE=1
export TUNER_RECOMPUTE=full
export TUNER_OFFLOAD_LAYERS=0
export TUNER_ACTIVATION_CHECKPOINTING=1
export TUNER_LAYOUT_KEY=tp4-pp16-dp2-mb1-z1-rcfull
export TUNER_GLOBAL_BATCH=640
export TUNER_NODES=16
export TUNER_GPUS=128
export TUNER_PEAK_TFLOPS=191.5
export TUNER_PRECISION=bf16
export TUNER_FRAMEWORK=megatron-deepspeed
export TUNER_MODEL=gpt-175b
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_PORT="$((20000 + SLURM_JOB_ID % 20000))"
cat > ds_config.json <<'TUNER_DS_CONFIG_EOF'
{"activation_checkpointing": {"contiguous_memory_optimization": false, "cpu_checkpointing": false, "partition_activations": false}, "bf16": {"enabled": true}, "gradient_accumulation_steps": 320, "gradient_clipping": 1.0, "steps_per_print": 1, "train_batch_size": 640, "train_micro_batch_size_per_gpu": 1, "wall_clock_breakdown": false, "zero_optimization": {"stage": 1}}
TUNER_DS_CONFIG_EOF

echo "tuner: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, $SLURM_NTASKS ranks, master $MASTER_ADDR:$MASTER_PORT"
srun --nodes=16 --ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest --kill-on-bad-exit=1 bash -c 'export RANK="$SLURM_PROCID" WORLD_SIZE="$SLURM_NTASKS" LOCAL_RANK="$SLURM_LOCALID"; exec "$@"' tuner-rank \
    python /lustre/orion/abc123/Megatron-DeepSpeed/pretrain_gpt.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 16 --num-layers 96 --hidden-size 12288 --ffn-hidden-size 49152 --num-attention-heads 96 --seq-length 2048 --max-position-embeddings 2048 --use-flash-attn-v2 --micro-batch-size 1 --global-batch-size 640 --train-iters 10 --log-interval 1 --eval-iters 0 --lr 1.0e-4 --min-lr 1.0e-5 --lr-decay-style cosine --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --init-method-std 0.006 --bf16 --checkpoint-activations --deepspeed-activation-checkpointing --deepspeed --deepspeed_config ds_config.json --zero-stage 1 --data-path /lustre/orion/abc123/data/pile_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt
rc=$?
printf '%s\n' "$rc" > exit_status.tmp && mv exit_status.tmp exit_status
exit "$rc"
