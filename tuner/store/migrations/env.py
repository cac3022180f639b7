"""Alembic's environment for tuner's store: run by alembic.command on the connection tuner already
has (Config.attributes["connection"], inside the store's own transaction); no alembic.ini."""

from alembic import context

from tuner.store.migrations import VERSION_TABLE
from tuner.store.models import Base

context.configure(connection=context.config.attributes["connection"], target_metadata=Base.metadata,
                  version_table=VERSION_TABLE)
with context.begin_transaction():   # the caller's transaction: commits or rolls back with it
    context.run_migrations()
