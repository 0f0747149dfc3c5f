"""Run ``gradpipe`` with the given arguments and write, as JSON, what each figure it
saved shows: per axes its value range and scale, its lines, its bands' extent and
where its legend is, in display pixels (tests/test_run.py reads them)."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

from gradpipe.cli import main

figures: list[dict] = []
original = Figure.savefig


def savefig(self: Figure, *args: object, **kwargs: object) -> None:
    original(self, *args, **kwargs)
    renderer = self.canvas.get_renderer()
    legends = [*self.legends, *(ax.get_legend() for ax in self.axes if ax.get_legend())]
    figures.append({
        "legends": [list(leg.get_window_extent(renderer).bounds) for leg in legends],
        "axes": [{
            "box": list(ax.get_window_extent(renderer).bounds),
            "ylim": list(ax.get_ylim()),
            "yscale": ax.get_yscale(),
            "lines": [{"y": [float(v) for v in line.get_ydata()],
                       "alpha": line.get_alpha()} for line in ax.get_lines()],
            "bands": [[float(p.vertices[:, 1].min()), float(p.vertices[:, 1].max())]
                      for band in ax.collections for p in band.get_paths()],
        } for ax in self.axes],
    })


Figure.savefig = savefig  # type: ignore[method-assign]
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "figures": figures}, out)
