# Alembic revisions of tuner's store, NNNN_slug.py, revision "NNNN" = schema version NNNN. A package so
# that setuptools ships the files; Alembic skips this __init__. See tuner/store/migrations/__init__.py.
