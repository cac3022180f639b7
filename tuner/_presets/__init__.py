"""The presets shipped with tuner, read through importlib.resources (see tuner.presets.preset_dir).

`tuner._presets.workloads` (models/, clusters/) and `tuner._presets.search_spaces` are the repository's
top-level workloads/ and search_spaces/ folders, mapped here by pyproject.toml's package-dir: a wheel
carries them under tuner/_presets/, an editable install finds them where they are.
"""
