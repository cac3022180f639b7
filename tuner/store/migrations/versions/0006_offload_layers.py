"""Schema version 6: the layout's CPU activation offloading (offload_layers, Megatron-Core's
--cpu-offloading-num-layers). Adds offload_layers, 0 (off) for every stored trial; layout keys are unchanged (a
dimension at its default is not in the key)."""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:     # existing rows take the default
        batch.add_column(sa.Column("offload_layers", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("trials") as batch:     # the models give no server default
        batch.alter_column("offload_layers", existing_type=sa.Integer(), existing_nullable=False,
                           existing_server_default="0", server_default=None)
