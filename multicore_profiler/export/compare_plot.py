"""A picture of a comparison: each group's durations, base against head, as box plots.

matplotlib is imported when a picture is drawn, not with the package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from multicore_profiler.analysis.compare import Comparison
from multicore_profiler.errors import ExportError
from multicore_profiler.export.files import save_figure

_COLORS = {False: "#4c72b0", True: "#dd8452"}
_VERDICT_COLORS = {"regressed": "#c44e52", "improved": "#55a868"}


def plot_comparison(comparison: Comparison, path: Path | str) -> Path:
    """Draw ``comparison`` into an image (PNG, or whatever ``path``'s suffix names): one row
    per group, in the comparison's order, base and head durations side by side (us,
    symmetric log scale; shares in percent, linear), regressed groups labelled red and
    improved ones green."""
    from matplotlib.figure import Figure

    path = Path(path)
    rows = comparison.rows.to_pylist()
    if not rows:
        raise ExportError("the comparison has no group to draw")
    figure = Figure(figsize=(10, 1.2 + 0.45 * len(rows)), layout="constrained")
    axes = figure.subplots()
    labels = []
    share = comparison.unit == "share"
    for index, row in enumerate(rows):
        key = tuple(row[column] for column in comparison.by)
        sides = comparison.samples[key]
        for side, offset in ((False, 0.18), (True, -0.18)):
            values = sides.get(side)
            if values is None:
                continue
            axes.boxplot(
                np.asarray(values) * 100 if share else np.asarray(values) / 1e3,
                positions=[len(rows) - 1 - index + offset],
                widths=0.3,
                orientation="horizontal",
                showfliers=False,
                patch_artist=True,
                boxprops={"facecolor": _COLORS[side], "alpha": 0.8},
                medianprops={"color": "black"},
            )
        labels.append((" / ".join(str(part) for part in key), row["verdict"]))
    axes.set_yticks(range(len(rows)), [label for label, _ in reversed(labels)])
    for tick, (_, verdict) in zip(axes.get_yticklabels(), reversed(labels), strict=True):
        tick.set_color(_VERDICT_COLORS.get(verdict, "black"))
    if share:
        axes.set_xlabel("share of the makespan on the critical path (%)")
    else:
        axes.set_xscale("symlog", linthresh=1)
        axes.set_xlabel(f"{comparison.level} duration (us)")
    axes.set_title(f"base {comparison.base} (blue) vs head {comparison.head} (orange)")
    axes.grid(axis="x", alpha=0.3)
    return save_figure(figure, path)
