"""A study's report: rows, figure data, PNG figures and one self-contained HTML page. Pure.

Nothing here touches the store or the file system: the CLI (`tuner report`, `tuner export`) reads the
trials, calls these functions and writes what they return. Figures are drawn with matplotlib's Agg
backend into PNG bytes; the page embeds them as base64 data URIs, so `index.html` alone is the report.

Three rooms: `rows` (the trials as rows and series, also what `tuner trials`, `tuner export` and the
library read), `plots` (the PNG figures) and `page` (the HTML page, `build_report`).
"""

from tuner.report.plots import FIGURES, figures
from tuner.report.page import CSS, Report, build_report, html_table
from tuner.report.rows import (COLLAPSED, EXPORT_COLUMNS, best_so_far, columns_at_default, export_row, export_rows,
                               memory_pairs, model_error, ok_trials, pairs, simulated, status_counts, top_rows,
                               tp_pp_cells, tp_pp_grid)

__all__ = ["FIGURES", "figures", "CSS", "Report", "build_report", "html_table", "COLLAPSED", "EXPORT_COLUMNS",
           "best_so_far", "columns_at_default", "export_row", "export_rows", "memory_pairs", "model_error", "ok_trials",
           "pairs", "simulated", "status_counts", "top_rows", "tp_pp_cells", "tp_pp_grid"]
