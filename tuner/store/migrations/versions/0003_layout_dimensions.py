"""Schema version 3: today's layout dimensions. Adds sequence_parallel (off), context_parallel (1),
virtual_pipeline (1) and recompute, which replaces activation_checkpointing (true: full, false: none);
layout keys are rewritten in the new form (tp4-pp16-dp2-mb1-z1-ac1 -> ...-rcfull). The layout columns
are NOT NULL (a few schema-2 stores had them nullable).

activation_checkpointing goes through batch_alter_table: SQLite recreates the table (any SQLite, not
only >= 3.35, which has DROP COLUMN), PostgreSQL alters it in place.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

# Plain-string defaults ('0' is false for PostgreSQL and SQLite alike): SQLite adds such a column in place;
# an expression default would make it recreate the table once more.
ADDED = {"sequence_parallel": (sa.Boolean(), "0"), "context_parallel": (sa.Integer(), "1"),
         "virtual_pipeline": (sa.Integer(), "1"), "recompute": (sa.String(16), "full")}
INTS = ("tp", "pp", "dp", "micro_batch", "zero_stage")


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:     # existing rows take the defaults
        for name, (type_, default) in ADDED.items():
            batch.add_column(sa.Column(name, type_, nullable=False, server_default=default))
    op.execute("UPDATE trials SET recompute = CASE WHEN activation_checkpointing THEN 'full' ELSE 'none' END")
    # an old key ends in -ac1 / -ac0 and names no new dimension (all at their defaults): one statement
    op.execute("UPDATE trials SET layout_key = REPLACE(REPLACE(layout_key, '-ac1', '-rcfull'), '-ac0', '-rcnone')")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("activation_checkpointing")
        for name, (type_, default) in ADDED.items():   # the models give no server default
            batch.alter_column(name, existing_type=type_, existing_nullable=False, existing_server_default=default,
                               server_default=None)
        for name in INTS:
            batch.alter_column(name, existing_type=sa.Integer(), nullable=False)
