"""Schema version 2: rank by training speed. Adds trials.mfu / predicted_mfu, computed from each
trial's stored samples/s and predicted step time with its study's own workload (a study whose workload
no longer loads keeps them empty: never ranked); the speed index (study_id, status, mfu) replaces the
peak_fraction one.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
studies = sa.table("studies", sa.column("id", sa.Integer), sa.column("workload", JSON))
trials = sa.table("trials", sa.column("id", sa.Integer), sa.column("study_id", sa.Integer),
                  sa.column("samples_per_second", sa.Float), sa.column("predicted_step_time_s", sa.Float),
                  sa.column("mfu", sa.Float), sa.column("predicted_mfu", sa.Float))


def upgrade() -> None:
    op.add_column("trials", sa.Column("mfu", sa.Float))
    op.add_column("trials", sa.Column("predicted_mfu", sa.Float))
    op.drop_index("ix_trials_best", "trials", if_exists=True)
    op.drop_index("ix_trials_study_status", "trials", if_exists=True)   # the very first stores had it too
    op.create_index("ix_trials_speed", "trials", ["study_id", "status", "mfu"])
    fill_mfu(op.get_bind())


def fill_mfu(conn) -> None:
    from tuner import metrics
    from tuner.specs import Workload

    set_mfu = (sa.update(trials).where(trials.c.id == sa.bindparam("tid"))
               .values(mfu=sa.bindparam("v_mfu"), predicted_mfu=sa.bindparam("v_pred")))
    for sid, wl in conn.execute(sa.select(studies.c.id, studies.c.workload)).all():
        try:
            w = Workload.from_dict(wl)
        except Exception:        # a study whose workload no longer loads keeps mfu empty (never ranked)
            continue
        rows = [{"tid": tid, "v_mfu": metrics.mfu(sps, w) if sps else None,
                 "v_pred": metrics.mfu(w.global_batch / step, w) if step else None}
                for tid, sps, step in conn.execute(sa.select(trials.c.id, trials.c.samples_per_second,
                                                             trials.c.predicted_step_time_s)
                                                   .where(trials.c.study_id == sid)).all()]
        if rows:
            conn.execute(set_mfu, rows)
