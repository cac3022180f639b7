"""Schema version 5: the layout's pipeline split (tuner.pipeline_split). Adds pipeline_split, 'auto' for every
stored trial (the split every layout had before splits had names: equal stages, or Megatron-Core's
embedding- and loss-aware one); layout keys are unchanged (a dimension at its default is not in the key)."""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:     # existing rows take the default
        batch.add_column(sa.Column("pipeline_split", sa.String(16), nullable=False, server_default="auto"))
    with op.batch_alter_table("trials") as batch:     # the models give no server default
        batch.alter_column("pipeline_split", existing_type=sa.String(16), existing_nullable=False,
                           existing_server_default="auto", server_default=None)
