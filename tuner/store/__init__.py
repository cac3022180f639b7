"""The results store: studies and trials in SQLite (default) or PostgreSQL. Only this package touches
the database. See store.py for the contract."""

from tuner.store.models import SCHEMA_VERSION, StudyRecord, TrialRecord
from tuner.store.store import DEFAULT_URL, Store, open_store, redact, upgrade

__all__ = ["Store", "StudyRecord", "TrialRecord", "open_store", "DEFAULT_URL", "redact", "SCHEMA_VERSION",
           "upgrade"]
