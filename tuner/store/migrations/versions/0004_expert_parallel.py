"""Schema version 4: expert parallelism (mixtures of experts). Adds expert_parallel and
expert_tensor_parallel, 1 for every stored trial (a dense layout's); layout keys are unchanged (a
dimension at its default is not in the key)."""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

ADDED = ("expert_parallel", "expert_tensor_parallel")


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:     # existing rows take the default
        for name in ADDED:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("trials") as batch:     # the models give no server default
        for name in ADDED:
            batch.alter_column(name, existing_type=sa.Integer(), existing_nullable=False, existing_server_default="1",
                               server_default=None)
