"""A trial's life in the store, fenced: claim, record, finish, interrupt; and a study's settings changed
under its row lock (the lease's one decision, tuner.lease.take).

A driver's claim and its results carry the epoch of its lease: once the study was taken over the store
refuses them (Displaced), and a claim is refused once the study's trials reach the budget stored with it
(BudgetSpent). A claim is unique per layout (PostgreSQL: the study row locked, a race caught by the unique
key and retried), so two drivers never run the same layout.
"""

from __future__ import annotations

from typing import Callable, Iterable

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from tuner.errors import BudgetSpent, Displaced, StoreError
from tuner.layout import Layout
from tuner.perfmodel.prediction import Prediction
from tuner.store.models import MEASURED, PREDICTED, StudyRow, TrialRow, scrub, utcnow
from tuner.store.session import Database
from tuner.trial import Status, TrialResult


class Claims(Database):
    """The fenced writes of a study's trials (and of its settings, for the lease)."""

    def modify_study_settings(self, name: str, change: Callable[[dict], dict | None]) -> None:
        """Read-modify-write of a study's settings under a row lock (one decision among many drivers):
        `change(settings)` returns the keys to merge, or None; an exception it raises aborts the write."""
        def modify(s: Session) -> None:
            row = s.execute(select(StudyRow).where(StudyRow.id == self._study_id(s, name))
                            .with_for_update()).scalar_one()
            new = change(dict(row.settings or {}))
            if new is not None:
                row.settings = {**(row.settings or {}), **scrub(dict(new))}
        self._tx(modify, f"updating study '{name}'", write=True)

    def _fence(self, s: Session, sid: int, study: str, epoch: int | None) -> dict:
        """The study's settings; Displaced when `epoch` (a driver's lease) is not the study's any more."""
        settings = s.execute(select(StudyRow.settings).where(StudyRow.id == sid)).scalar() or {}
        if epoch is not None and int(settings.get("epoch") or 0) != epoch:
            raise Displaced(study)
        return settings

    def _claim(self, s: Session, study: str, layout: Layout, prediction: Prediction | None, runner: str,
               budget: int | None = None, epoch: int | None = None) -> int | None:
        sid = self._study_id(s, study, lock=True)     # serialises claims on one study (PostgreSQL)
        if epoch is not None:                          # a driver's claim: fenced, within the stored budget
            settings = self._fence(s, sid, study, epoch)
            budget = budget if budget is not None else settings.get("budget")
        if budget is not None:                         # the budget holds across every driver of the study
            spent = s.execute(select(func.count()).where(TrialRow.study_id == sid, TrialRow.status.not_in(
                [Status.PRUNED.value, Status.INTERRUPTED.value]))).scalar()
            if spent >= budget:
                raise BudgetSpent(f"study '{study}' has run or is running {spent} trial(s) of its budget of {budget}")
        key = layout.key()
        row = s.execute(select(TrialRow).where(TrialRow.study_id == sid, TrialRow.layout_key == key)).scalar()
        now = utcnow()
        if row is not None:
            reclaimed = s.execute(update(TrialRow).where(TrialRow.id == row.id, TrialRow.status == Status.INTERRUPTED.value)
                                  .values(status=Status.RUNNING.value, attempts=TrialRow.attempts + 1, runner=runner,
                                          started_at=now, ended_at=None, message="")).rowcount
            return row.number if reclaimed == 1 else None
        number = (s.execute(select(func.max(TrialRow.number)).where(TrialRow.study_id == sid)).scalar() or 0) + 1
        predicted = {col: (getattr(prediction, attr) if prediction is not None else None)
                     for col, attr in PREDICTED.items()}
        s.add(TrialRow(study_id=sid, number=number, layout_key=key, **layout.as_dict(), status=Status.RUNNING.value,
                       **predicted, message="", runner=runner, started_at=now, attempts=1, extra={}))
        s.flush()
        return number

    def _finish(self, s: Session, sid: int, number: int, result: TrialResult, extra: dict | None) -> None:
        row = s.execute(select(TrialRow).where(TrialRow.study_id == sid, TrialRow.number == number)).scalar()
        if row is None:
            raise StoreError(f"trial {number} is not in this study: claim it with claim_trial first")
        for name in MEASURED:
            setattr(row, name, getattr(result, name))
        row.status = Status(result.status).value
        row.message = scrub(result.message or "")
        row.log_path = result.log_path
        row.ended_at = utcnow()
        extra = {**result.extra, **(extra or {})}     # the reserved peak, when the runner read one
        if extra:
            row.extra = {**(row.extra or {}), **scrub(dict(extra))}

    def claim_trial(self, study: str, layout: Layout, prediction: Prediction | None, runner: str,
                    budget: int | None = None, epoch: int | None = None) -> int | None:
        """Mark `layout` running in `study` and return its trial number, or None if another has it.
        With `budget`, or `epoch` (a driver's lease, tuner.lease) and the budget stored with the study
        now: BudgetSpent when the study's trials that ran or run (not pruned) reach it. With `epoch`:
        Displaced when the study was taken over since."""
        return self._tx(lambda s: self._claim(s, study, layout, prediction, runner, budget, epoch),
                        f"claiming {layout.key()} in study '{study}'", write=True, retry_conflicts=True)

    def record_trial(self, study: str, layout: Layout, prediction: Prediction | None, result: TrialResult,
                     runner: str, epoch: int | None = None) -> int | None:
        """Claim and finish in one transaction (a layout pruned without running)."""
        def record(s: Session) -> int | None:
            if epoch is not None:
                self._fence(s, self._study_id(s, study, lock=True), study, epoch)
            number = self._claim(s, study, layout, prediction, runner)
            if number is not None:
                self._finish(s, self._study_id(s, study), number, result, None)
            return number
        return self._tx(record, f"recording {layout.key()} in study '{study}'", write=True, retry_conflicts=True)

    def finish_trial(self, study: str, number: int, result: TrialResult, extra: dict | None = None,
                     epoch: int | None = None) -> None:
        """Store a claimed trial's result; with `epoch`, Displaced (nothing written) when the study was
        taken over since that driver's lease."""
        def finish(s: Session) -> None:
            sid = self._study_id(s, study)
            if epoch is not None:
                self._fence(s, sid, study, epoch)
            self._finish(s, sid, number, result, extra)
        self._tx(finish, f"finishing trial {number} of study '{study}'", write=True)

    def mark_interrupted(self, study: str, numbers: Iterable[int] | None = None) -> int:
        """Running trials -> interrupted (all of the study's, or those numbers); returns how many."""
        nums = None if numbers is None else list(numbers)
        def mark(s: Session) -> int:
            q = update(TrialRow).where(TrialRow.study_id == self._study_id(s, study),
                                       TrialRow.status == Status.RUNNING.value)
            if nums is not None:
                q = q.where(TrialRow.number.in_(nums))
            return s.execute(q.values(status=Status.INTERRUPTED.value, ended_at=utcnow())).rowcount
        return 0 if nums == [] else self._tx(mark, f"marking trials of study '{study}' interrupted", write=True)
