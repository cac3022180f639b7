"""Live progress of a running study: on a terminal a rich view (bar with time left, best-so-far, a
table of running and recent trials, shown as each starts and ends); otherwise one plain line per
trial that starts and one per trial that ends."""

from __future__ import annotations

import time

RECENT = 8


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def _best_text(best) -> str:
    if best is None:
        return "best: -"
    return f"fastest {best.samples_per_second:.4g} samples/s (MFU {100 * best.mfu:.2f} %) {best.layout.key()}"


class ProgressView:
    def __init__(self, study: str, budget: int, stream):
        self.study, self.budget, self.stream = study, budget, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self._live = None
        self._seen_last = None
        self._started: set[int] = set()

    def __enter__(self):
        if self.tty:
            from rich.console import Console
            from rich.live import Live
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._bar = Progress(TextColumn("[bold]{task.fields[study]}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("left"), TimeRemainingColumn())
            self._task = self._bar.add_task("search", total=self.budget, study=self.study)
            self._live = Live(self._bar, console=Console(file=self.stream), refresh_per_second=4)
            self._live.start()
        return self

    def __exit__(self, *exc):
        if self._live:
            try:
                self._live.stop()
            except (OSError, ValueError):
                pass

    def _view(self, p):
        from rich.console import Group
        from rich.table import Table
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col, width in (("trial", 5), ("status", 11), ("layout", 25), ("samples/s", 9), ("MFU", 8)):
            table.add_column(col, justify="right" if col in ("trial", "samples/s", "MFU") else "left",
                             no_wrap=True, min_width=width)
        table.add_column("message", no_wrap=True, overflow="ellipsis")
        for number, layout in p.running_trials:
            table.add_row(str(number), "[yellow]running", layout.key(), "", "", "")
        for t in p.finished[-RECENT:][::-1]:
            colour = "green" if t.status.value == "ok" else "red"
            table.add_row(str(t.number), f"[{colour}]{t.status}", t.layout.key(),
                          "-" if t.samples_per_second is None else f"{t.samples_per_second:.4g}", _pct(t.mfu),
                          (t.result.message or "")[:40])
        summary = f"{_best_text(p.best)}   ran {p.ran}/{p.budget}, running {p.running}, pruned {p.pruned}"
        return Group(self._bar, summary, table)

    def update(self, p) -> None:
        """Show `p`; an output that fails (a closed pipe or terminal) is switched off, never fatal."""
        if self.stream is None:
            return
        try:
            self._show(p)
        except (OSError, ValueError):   # EPIPE, a closed terminal, a closed file
            self.stream, self._live = None, None

    def _show(self, p) -> None:
        if self._live:
            self._bar.update(self._task, completed=p.ran)
            self._live.update(self._view(p))
            return
        for number, layout in p.running_trials:           # what started since the last update
            if number not in self._started:
                self._started.add(number)
                print(f"[{time.strftime('%H:%M:%S')}] trial {number} running {layout.key()}", file=self.stream,
                      flush=True)
        last = p.last
        if last is not None and last is not self._seen_last:
            self._seen_last = last
            print(f"[{time.strftime('%H:%M:%S')}] trial {last.number} {last.status} MFU {_pct(last.mfu)} "
                  f"{last.layout.key()}  ({p.ran}/{p.budget} ran, {p.pruned} pruned)  {_best_text(p.best)}",
                  file=self.stream, flush=True)
