"""Live progress of a running study: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import time


def _best_text(best) -> str:
    if best is None:
        return "best: -"
    return f"best {100 * best.peak_fraction:.2f} % ({best.tflops_per_gpu:.4g} TFLOPS/GPU) {best.layout.key()}"


class ProgressView:
    def __init__(self, study: str, budget: int, stream):
        self.study, self.budget, self.stream = study, budget, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self._bar = None
        self._seen_last = None

    def __enter__(self):
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._bar = Progress(TextColumn("[bold]{task.fields[study]}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[best]}"),
                                 console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("search", total=self.budget, study=self.study, best="best: -")
        return self

    def __exit__(self, *exc):
        if self._bar:
            self._bar.stop()

    def update(self, p) -> None:
        if self._bar:
            self._bar.update(self._task, completed=p.ran, best=_best_text(p.best) + f"  running {p.running}"
                             + (f"  pruned {p.pruned}" if p.pruned else ""))
            return
        last = p.last
        if last is not None and last is not self._seen_last:
            self._seen_last = last
            val = f"{100 * last.peak_fraction:.2f} %" if last.peak_fraction is not None else "-"
            print(f"[{time.strftime('%H:%M:%S')}] trial {last.number} {last.status} {val} {last.layout.key()}  "
                  f"({p.ran}/{p.budget} ran, {p.pruned} pruned)  {_best_text(p.best)}", file=self.stream, flush=True)
