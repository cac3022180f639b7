"""The results store: studies and trials in SQLite (default) or PostgreSQL. Only this package touches
the database. See store.py for the contract."""

from tuner.store.models import SCHEMA_VERSION, StudyRecord, TrialRecord
from tuner.store.engine import DEFAULT_URL, redact
from tuner.store.store import Store, current, open_store, upgrade

__all__ = ["Store", "StudyRecord", "TrialRecord", "open_store", "DEFAULT_URL", "redact", "SCHEMA_VERSION",
           "upgrade", "current"]
