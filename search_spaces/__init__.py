"""Shipped search spaces (*.toml): installed as tuner._presets.search_spaces.

This file only makes the folder a package, so that pyproject.toml can map it into the wheel and an
editable install; tuner.space.load_space reads the TOML files through importlib.resources.
"""
