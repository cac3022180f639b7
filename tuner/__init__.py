"""tuner: search for the fastest parallel layout of a large-model training run."""

__version__ = "0.1.0"
