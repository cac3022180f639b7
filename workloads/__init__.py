"""Shipped model and cluster presets (models/*.toml, clusters/*.toml): installed as tuner._presets.workloads.

This file only makes the folder a package, so that pyproject.toml can map it into the wheel and an
editable install; tuner.specs.preset_dir reads the TOML files through importlib.resources.
"""
