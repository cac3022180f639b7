"""The 3D-parallel GPT training harness that runs inside a trial (see train.py for the protocol).

Launch: `torchrun --standalone --nproc_per_node N -m tuner.runners.harness.train` with
TUNER_TRIAL_JSON set. Importing this package imports neither torch nor deepspeed.
"""
