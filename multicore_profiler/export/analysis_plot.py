"""A picture of the speed-up curves: for each stage, the predicted makespan over the
observed one as the stage's compute is made faster (Coz's question, drawn).

matplotlib is imported when a picture is drawn, not with the package.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from multicore_profiler.errors import ExportError
from multicore_profiler.export.analysis_text import speedup_medians
from multicore_profiler.export.files import save_figure


def plot_speedup_curves(curves: pa.Table, path: Path | str) -> Path:
    """Draw a ``speedup_curves`` table into an image (PNG, or whatever ``path``'s suffix
    names): one line per stage, x the stage's speed-up in percent, y the median over the
    faithful invocations of predicted / observed makespan. ``ExportError`` where no
    invocation has a prediction."""
    from matplotlib.figure import Figure

    path = Path(path)
    medians = [
        row for row in speedup_medians(curves).to_pylist() if row["median_ratio"] is not None
    ]
    if not medians:
        raise ExportError("the speed-up curves have no prediction to draw (no faithful invocation)")
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.subplots()
    for stage in dict.fromkeys(row["stage"] for row in medians):
        points = [row for row in medians if row["stage"] == stage]
        axes.plot(
            [100 * row["speedup"] for row in points],
            [row["median_ratio"] for row in points],
            marker="o",
            label=stage,
        )
    axes.set_xlabel("stage speed-up (% less compute time)")
    axes.set_ylabel("predicted / observed makespan (median)")
    axes.set_title("What a faster stage buys (what-if replay)")
    axes.grid(alpha=0.3)
    axes.legend(title="stage")
    return save_figure(figure, path)
