"""Schema version 1: meta, studies, and trials with the six layout fields of 2023 (tp, pp, dp,
micro_batch, zero_stage, activation_checkpointing), ranked by peak_fraction.

A frozen copy of that schema, not the live models: revisions never import tuner.store.models.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
STAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False))
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        *(sa.Column(c, sa.String(200), nullable=False) for c in ("model_name", "cluster_name")),
        *(sa.Column(c, sa.Integer, nullable=False) for c in ("nodes", "global_batch")),
        *(sa.Column(c, JSON, nullable=False) for c in ("workload", "space")),
        *(sa.Column(c, sa.String(64), nullable=False) for c in ("searcher", "runner")),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created", STAMP, nullable=False),
        sa.Column("tuner_version", sa.String(32), nullable=False))
    op.create_index("ix_studies_workload", "studies", ["model_name", "cluster_name", "nodes"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("studies.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("layout_key", sa.String(64), nullable=False),
        *(sa.Column(c, sa.Integer, nullable=False) for c in ("tp", "pp", "dp", "micro_batch", "zero_stage")),
        sa.Column("activation_checkpointing", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        *(sa.Column(c, sa.Float) for c in ("tflops_per_gpu", "peak_fraction", "samples_per_second",
                                           "peak_memory_gb", "predicted_tflops_per_gpu", "predicted_peak_fraction",
                                           "predicted_memory_gb", "predicted_step_time_s")),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("log_path", sa.Text),
        sa.Column("runner", sa.String(64), nullable=False),
        *(sa.Column(c, STAMP) for c in ("started_at", "ended_at")),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("extra", JSON, nullable=False),
        sa.UniqueConstraint("study_id", "number", name="uq_trials_study_number"),
        sa.UniqueConstraint("study_id", "layout_key", name="uq_trials_study_layout"))
    op.create_index("ix_trials_best", "trials", ["study_id", "status", "peak_fraction"])
