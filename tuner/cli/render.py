"""Pure renderers: rows -> table / JSON / CSV text. The CLI prints what these return."""

from __future__ import annotations

import csv
import io
import json

FORMATS = ("table", "json", "csv")


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A text table; layout columns that every row leaves at their default (sp, cp, vp) are left out."""
    if not rows:
        return "(none)"
    dropped = columns_at_default(rows)
    columns = [c for c in columns or list(rows[0]) if c not in dropped]
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, default=str)


def to_csv(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return ""
    columns = columns or list(rows[0])
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()})
    return buf.getvalue()


def render(rows: list[dict], fmt: str, columns: list[str] | None = None, json_obj=None) -> str:
    """Render `rows` in `fmt`; JSON prints `json_obj` when given (e.g. a single object), else the rows."""
    if fmt == "json":
        return to_json(rows if json_obj is None else json_obj)
    if fmt == "csv":                 # click.echo ends the last line: no blank line after the last row
        return to_csv(rows, columns).removesuffix("\n")
    return table(rows, columns)


from tuner.layout import flat_layout  # noqa: E402,F401  (the layout's table columns)
from tuner.report import columns_at_default  # noqa: E402  (one rule for text and HTML tables)
