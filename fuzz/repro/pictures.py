"""SVG pictures of oracle reports: where a split was judged, where it first differs, and on which layer kinds.

Each picture reads only the report dict an oracle writes (schema 2; older reports without "layers" fall back to
the "kinds" letters) and writes one small, byte-deterministic SVG:

- `handoff_picture`: cut set × offset heat map, one panel per hand-off mode;
- `sweep_picture`: cut set × phase grid;
- `battery_picture`: row × lane grid of a family-certify run;
- `report_picture`: the picture for whichever oracle wrote the report (None when there is none yet).

Beside the cut axis a layer-kind strip (one cell per layer, SWA hatched, MoE dotted) and, per cut set, its
cuts as lines between layers, so a reader sees which layer kind each stage starts on.

Every artist a reader or a test may look for carries a gid, which matplotlib writes as `<g id="...">`:
`cell:<mode>:<cuts>:<t>:<status>` (hand-off), `cell:<cuts>:<phase>:<status>` (sweep),
`cell:<row>:<lane>:<status>` (battery), `marked:<same key without status>` for the cell a finding, crash or
timeout is located at, `layer:<i>:<kind>[:swa][:moe]` for strip cells, `cuts:<cuts>` for a cut set's lines and
`diverges:<cuts>:<layer>` for a sweep's first differing layer. Cut sets are labelled "3", "2,6" or "none" (the
unsplit model). Text stays `<text>` (svg.fonttype none), so labels are readable in the file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import matplotlib
import matplotlib.style
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

# Okabe-Ito hues (distinguishable with the common colour-vision deficiencies) for the statuses a reader acts on;
# greys and white for "nothing was judged here". Lightness differs too, so pass vs finding survives greyscale.
STATUS_COLOURS: dict[str, str] = {
    "pass": "#009E73",
    "finding": "#D55E00",
    "crash": "#E69F00",
    "timeout": "#F0E442",
    "numerics": "#56B4E9",
    "known": "#CC79A7",
    "unsupported": "#999999",
    "missing": "#000000",
    "skipped": "#DDDDDD",
    "not-run": "#FFFFFF",
    "not-judged": "#FFFFFF",
}
STATUS_LABELS: dict[str, str] = {"not-run": "not run", "not-judged": "not judged"}

# Paul Tol's muted hues, kept apart from the status palette so a strip cell never reads as a verdict.
KIND_COLOURS: dict[str, str] = {
    "attention": "#332288",
    "recurrent": "#DDCC77",
    "both": "#882255",
    "mlp": "#DDDDDD",
    "unknown": "#FFFFFF",
}
KIND_OF_LETTER: dict[str, str] = {"A": "attention", "R": "recurrent", "B": "both", "M": "mlp"}
_LETTER_OF_KIND = {v: k for k, v in KIND_OF_LETTER.items()}
_DARK_KINDS = ("attention", "both")  # white hatch, dots and outline on these

# Oracles that predate schema 2 wrote "diverged" for a finding.
_ALIASES = {"diverged": "finding"}
# Statuses that sit at one place (an offset, a phase): that cell gets the outline and the "×".
_LOCATED = frozenset({"finding", "crash", "timeout"})
# White cells need an outline to be seen; "not judged" is hatched so it is not mistaken for "not run".
_CELL_STYLE: dict[str, dict[str, Any]] = {
    "not-run": {"edgecolor": "#BBBBBB", "linewidth": 0.5},
    "not-judged": {"edgecolor": "#BBBBBB", "linewidth": 0.5, "hatch": "////"},
    "skipped": {"edgecolor": "#BBBBBB", "linewidth": 0.5},
}
# DejaVu Sans ships with matplotlib: the same metrics (so the same layout) on every machine, and a one-name
# font-family on each <text> instead of matplotlib's ten fallbacks.
_RC = {"svg.hashsalt": "family-certify", "svg.fonttype": "none", "font.family": "sans-serif",
       "font.sans-serif": ["DejaVu Sans"], "font.size": 7.0, "hatch.linewidth": 0.6}

_ROW = 0.2  # inches per grid row
_OFFSET_COL = 0.2  # inches per hand-off offset column
_PHASE_COL = 0.55  # inches per sweep phase column: the phase names sit above it unrotated
_LANE_COL = 0.3
_LAYER = 0.16  # inches per layer in the strip and the cut track
_GAP = 0.1  # fraction of a cell left blank between cells
_NOTE_CHARS = 60

F = TypeVar("F", bound=Callable[..., Any])


# ---- reading reports ------------------------------------------------------------------------------------
def status_of(word: Any) -> str:
    """A status word as the pictures colour it ("diverged" is the pre-schema-2 spelling of "finding")."""
    s = str(word or "missing")
    return _ALIASES.get(s, s)


def cut_label(cuts: Iterable[int]) -> str:
    cuts = list(cuts)
    return ",".join(str(c) for c in cuts) if cuts else "none"


def report_layers(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One {"kind", "swa", "moe"} per layer: from "layers" when the report has them, else from the "kinds"
    letters (without SWA or MoE, which the letters do not carry)."""
    given = report.get("layers")
    if given:
        layers = [{"kind": str(x.get("kind") or "unknown"), "swa": bool(x.get("swa")), "moe": bool(x.get("moe"))}
                  for x in given]
    else:
        layers = [{"kind": KIND_OF_LETTER.get(c, "unknown"), "swa": False, "moe": False}
                  for c in str(report.get("kinds") or "")]
    n = report.get("n_layer")
    if isinstance(n, int) and len(layers) < n:
        layers += [{"kind": "unknown", "swa": False, "moe": False}] * (n - len(layers))
    return layers


def _records(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-cut-set records, each completed from the report's findings list where it lacks a location (an
    oracle may keep where it differs only in the finding)."""
    findings = [f for f in report.get("findings") or [] if isinstance(f, Mapping)]
    out = []
    for rec in report.get("results") or []:
        rec = dict(rec)
        cuts = list(rec.get("cuts") or [])
        for f in findings:
            if list(f.get("cuts") or []) == cuts:
                for k in ("offset", "mode", "phase", "stage", "layer", "step", "position"):
                    if rec.get(k) is None and f.get(k) is not None:
                        rec[k] = f[k]
                if not rec.get("reason") and f.get("message"):
                    rec["reason"] = f["message"]
                break
        rec["status"] = status_of(rec.get("status"))
        out.append(rec)
    return out


def handoff_offsets(config: Mapping[str, Any], records: Sequence[Mapping[str, Any]] = ()) -> list[int]:
    """The offsets t a hand-off tries, in order: prompt offsets 1..P-1, then one per decode step after it."""
    if "prompt_len" in config:
        p = int(config["prompt_len"])
        decode = min(int(config.get("decode_offsets", 0) or 0), int(config.get("tokens", 0) or 0))
        return list(range(1, p)) + list(range(p, p + decode))
    # no config: as many offsets as the longest cut set tried, numbered from 1
    return list(range(1, 1 + max((int(r.get("offsets") or 0) for r in records), default=0)))


def handoff_grid(report: Mapping[str, Any]) -> tuple[list[str], list[int], list[str], dict[tuple[str, int], list[str]],
                                                        list[tuple[str, int, int]]]:
    """(row labels, offsets, modes, {(mode, row): status per offset}, marked (mode, row, column) cells).

    Offsets run in order and, at each offset, the modes in config order; a cut set stops at the offset where
    it differs, so the modes after the differing one at that offset and every later offset were not run.
    """
    config = report.get("config") or {}
    records = _records(report)
    offsets = handoff_offsets(config, records)
    modes = [str(m) for m in config.get("modes") or ("full", "partial")]
    labels = [cut_label(r.get("cuts") or []) for r in records]
    grid: dict[tuple[str, int], list[str]] = {}
    marks: list[tuple[str, int, int]] = []
    for i, rec in enumerate(records):
        s = rec["status"]
        rows = {m: ["not-run"] * len(offsets) for m in modes}
        tried = rec.get("offsets")
        if s == "pass":
            n = len(offsets) if tried is None else min(int(tried), len(offsets))
            for m in modes:
                rows[m][:n] = ["pass"] * n
        elif s == "unsupported":
            for m in modes:
                rows[m] = ["unsupported"] * len(offsets)
        else:
            t = rec.get("offset")
            j = offsets.index(t) if t in offsets else (int(tried) - 1 if tried else None)
            if j is None or j >= len(offsets):
                # failed before the first offset (a stage that does not load): the whole row is that failure
                for m in modes:
                    rows[m] = [s] * len(offsets)
            else:
                for m in modes:
                    rows[m][:j] = ["pass"] * j
                # a schema-2 finding may name the mode as its "phase"; "bytes" is the full export's byte
                # accounting, checked right after the full hand-off at t passed
                mode = rec.get("mode") or rec.get("phase")
                mode = "full" if mode == "bytes" else mode
                if mode in rows:
                    k = modes.index(mode)
                    for m in modes[:k]:
                        rows[m][j] = "pass"
                    rows[mode][j] = s
                    if s in _LOCATED:
                        marks.append((mode, i, j))
                else:  # located at an offset but not in a mode (a crash): every mode at t is suspect
                    for m in modes:
                        rows[m][j] = s
        busy = config.get("busy_offsets")
        if "busy" in rows and busy is not None:  # busy hand-offs run at a few offsets only
            rows["busy"] = [x if t in busy or x != "pass" else "not-run"
                            for t, x in zip(offsets, rows["busy"], strict=True)]
        for m in modes:
            grid[(m, i)] = rows[m]
    return labels, offsets, modes, grid, marks


def sweep_grid(report: Mapping[str, Any]) -> tuple[list[str], list[str], list[list[str]], list[tuple[int, int]]]:
    """(row labels, phases, status per row and phase, marked (row, column) cells). A finding cut set is judged
    at the phase where it first differs; its other phases are "not judged"."""
    config = report.get("config") or {}
    records = _records(report)
    phases = [str(p) for p in config.get("phases") or ("prefill", "decode", "batched")]
    labels = [cut_label(r.get("cuts") or []) for r in records]
    grid: list[list[str]] = []
    marks: list[tuple[int, int]] = []
    for i, rec in enumerate(records):
        s = rec["status"]
        if s in ("pass", "unsupported"):
            row = [s] * len(phases)
        elif rec.get("phase") in phases:
            j = phases.index(rec["phase"])
            row = ["not-judged"] * len(phases)
            row[j] = s
            if s in _LOCATED:
                marks.append((i, j))
        else:
            row = [s] * len(phases)
        grid.append(row)
    return labels, phases, grid, marks


# ---- drawing ------------------------------------------------------------------------------------------------
def _gid(*parts: Any) -> str:
    # an SVG id holds no whitespace
    return ":".join("_".join(str(p).split()) for p in parts)


def _truncate(text: str, n: int = _NOTE_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _colour(status: str) -> str:
    return STATUS_COLOURS.get(status, STATUS_COLOURS["missing"])


class _Page:
    """A figure laid out in inches from its top-left corner; saved with the tight box, so the generous size
    given up front costs nothing."""

    def __init__(self, width: float, height: float) -> None:
        self.w, self.h = width, height
        self.fig = Figure(figsize=(width, height))
        FigureCanvasSVG(self.fig)

    def axes(self, x: float, y: float, w: float, h: float) -> Axes:
        ax = self.fig.add_axes((x / self.w, 1 - (y + h) / self.h, max(w, 1e-3) / self.w, max(h, 1e-3) / self.h))
        ax.patch.set_visible(False)
        for sp in ax.spines.values():
            sp.set_visible(False)
        ax.tick_params(length=0, pad=2)
        return ax

    def text(self, x: float, y: float, s: str, **kw: Any) -> None:
        self.fig.text(x / self.w, 1 - y / self.h, s, va="top", **kw)

    def legend(self, x: float, y: float, handles: list[Any], ncols: int) -> None:
        if handles:
            self.fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(x / self.w, 1 - y / self.h),
                            ncols=ncols, frameon=False, fontsize=7, handlelength=1.2, handleheight=1.0,
                            columnspacing=1.0, borderaxespad=0)

    def save(self, out: Path) -> Path:
        out.parent.mkdir(parents=True, exist_ok=True)
        self.fig.savefig(out, format="svg", metadata={"Date": None}, bbox_inches="tight", pad_inches=0.08)
        return out


def _draw(fn: F) -> F:
    """Run a drawing function under matplotlib's default style plus ours, restored afterwards: the user's
    matplotlibrc must not change the bytes, and nothing leaks into other figures."""

    @functools.wraps(fn)
    def run(*args: Any, **kw: Any) -> Any:
        with matplotlib.style.context("default"), matplotlib.rc_context(_RC):
            return fn(*args, **kw)

    return run  # type: ignore[return-value]


def _cell(ax: Axes, x: float, y: float, status: str, gid: str) -> None:
    style = {"linewidth": 0, "edgecolor": "none", **_CELL_STYLE.get(status, {})}
    r = Rectangle((x + _GAP / 2, y + _GAP / 2), 1 - _GAP, 1 - _GAP, facecolor=_colour(status), gid=gid, **style)
    r.set_clip_on(False)  # also keeps a clip-path attribute off every cell
    ax.add_artist(r)  # not add_patch: the grid's limits are set, and re-fitting them per cell was a tenth of a picture


def _mark(ax: Axes, x: float, y: float, gid: str) -> None:
    r = Rectangle((x + _GAP / 2, y + _GAP / 2), 1 - _GAP, 1 - _GAP, facecolor="none", edgecolor="#000000",
                  linewidth=1.6, gid=gid)
    r.set_clip_on(False)
    ax.add_artist(r)
    ax.text(x + 0.5, y + 0.5, "×", ha="center", va="center", fontsize=8, fontweight="bold", color="#000000")


def _grid_axes(ax: Axes, n_cols: int, n_rows: int) -> None:
    ax.set_xlim(0, max(n_cols, 1))
    ax.set_ylim(max(n_rows, 1), 0)  # first row on top
    ax.set_yticks([])


def _layer_strip(page: _Page, x: float, y: float, layers: Sequence[Mapping[str, Any]]) -> None:
    """The layer kinds, one cell per layer, layer 0 on the left, above the cut track at (x, y)."""
    n = len(layers)
    ax = page.axes(x, y, n * _LAYER, 0.22)
    ax.set_xlim(0, max(n, 1))
    ax.set_ylim(1, 0)
    ax.set_yticks([])
    step = 1 if n <= 24 else 4
    ax.set_xticks([i + 0.5 for i in range(0, n, step)], [str(i) for i in range(0, n, step)], fontsize=6)
    ax.xaxis.set_ticks_position("top")
    for i, layer in enumerate(layers):
        kind = str(layer["kind"])
        flags = [f for f in ("swa", "moe") if layer.get(f)]
        dark = kind in _DARK_KINDS
        # the edge colour is the SWA hatch's colour; only the palest kinds get a drawn outline
        r = Rectangle((i + 0.04, 0.05), 0.92, 0.9, facecolor=KIND_COLOURS.get(kind, KIND_COLOURS["unknown"]),
                      edgecolor="#FFFFFF" if dark else "#555555", linewidth=0.4 if kind in ("mlp", "unknown") else 0,
                      hatch="////" if layer.get("swa") else None, gid=_gid("layer", i, kind, *flags))
        r.set_clip_on(False)
        ax.add_artist(r)
    for dark in (False, True):
        moe = [i + 0.5 for i, x in enumerate(layers) if x.get("moe") and (str(x["kind"]) in _DARK_KINDS) == dark]
        if moe:  # one artist for all MoE dots of a shade (the strip cell's gid already says ":moe")
            ax.plot(moe, [0.5] * len(moe), marker="o", markersize=2.6, linestyle="none",
                    color="#FFFFFF" if dark else "#000000", clip_on=False)


def _cut_track(page: _Page, x: float, y: float, labels: Sequence[str], cuts: Sequence[Sequence[int]], n_layer: int,
               rows: int) -> Axes:
    """Per cut set, its cuts drawn as lines between layers, under the strip; the row labels on its left."""
    ax = page.axes(x, y, n_layer * _LAYER, max(rows, 1) * _ROW)
    ax.set_xlim(0, max(n_layer, 1))
    ax.set_ylim(max(rows, 1), 0)
    ax.set_xticks([])
    ax.set_yticks([i + 0.5 for i in range(len(labels))], list(labels), fontsize=7)
    if n_layer and labels:
        ax.vlines(range(n_layer + 1), 0, len(labels), colors="#E4E4E4", linewidth=0.4)
        ax.hlines([i + 0.5 for i in range(len(labels))], 0, n_layer, colors="#BBBBBB", linewidth=0.8)
    for i, (label, cs) in enumerate(zip(labels, cuts, strict=True)):
        if cs:
            ax.vlines(list(cs), i + 0.12, i + 0.88, colors="#000000", linewidth=1.6, gid=_gid("cuts", label))
    return ax


def _status_handles(present: Iterable[str]) -> list[Any]:
    seen = set(present)
    order = [s for s in STATUS_COLOURS if s in seen] + sorted(seen - set(STATUS_COLOURS))
    out: list[Any] = []
    for s in order:
        style = {"edgecolor": "none", "linewidth": 0, **_CELL_STYLE.get(s, {})}
        out.append(Patch(facecolor=_colour(s), label=STATUS_LABELS.get(s, s), **style))
    return out


def _kind_handles(layers: Sequence[Mapping[str, Any]]) -> list[Any]:
    kinds = {str(x["kind"]) for x in layers}
    out: list[Any] = [Patch(facecolor=KIND_COLOURS[k], edgecolor="none", label=f"{k} layer")
                      for k in KIND_COLOURS if k in kinds]
    if any(x.get("swa") for x in layers):
        out.append(Patch(facecolor="#FFFFFF", edgecolor="#555555", linewidth=0.4, hatch="////", label="SWA"))
    if any(x.get("moe") for x in layers):
        out.append(Line2D([], [], marker="o", markersize=2.6, color="#000000", linestyle="none", label="MoE"))
    return out


def _title(report: Mapping[str, Any]) -> str:
    fixture = Path(str(report.get("fixture") or "?")).name
    kinds = report.get("kinds") or "".join(_LETTER_OF_KIND.get(str(x["kind"]), "?") for x in report_layers(report))
    return (f"{report.get('oracle', '?')}  {fixture}  ({report.get('arch', '?')}, "
            f"{len(report_layers(report))} layers {kinds})  —  {status_of(report.get('status'))}")


def _notes(ax: Axes, x: float, records: Sequence[Mapping[str, Any]]) -> None:
    """A truncated reason right of each row that did not pass: the picture stays tooltip-free."""
    for i, rec in enumerate(records):
        if rec["status"] != "pass" and rec.get("reason"):
            ax.text(x, i + 0.5, _truncate(rec["reason"]), ha="left", va="center", fontsize=6, color="#444444",
                    clip_on=False)


def _no_rows(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", fontsize=7, color="#444444")


@_draw
def handoff_picture(report: Mapping[str, Any], out: Path | str) -> Path:
    """Cut set × offset heat map per hand-off mode, beside the layer-kind strip and each cut set's cuts."""
    labels, offsets, modes, grid, marks = handoff_grid(report)
    records = _records(report)
    layers = report_layers(report)
    n_layer, rows, cols = len(layers), len(labels), len(offsets)
    prompt_len = (report.get("config") or {}).get("prompt_len")
    left, top = 0.9, 0.95
    panel_w = max(cols, 1) * _OFFSET_COL
    panels_x = left + n_layer * _LAYER + 0.3
    width = panels_x + len(modes) * (panel_w + 0.3) + 4.0
    height = top + max(rows, 1) * _ROW + 1.6
    page = _Page(width, height)
    page.text(0.1, 0.1, _title(report), fontsize=8)
    _layer_strip(page, left, top - 0.3, layers)
    _cut_track(page, left, top, labels, [r.get("cuts") or [] for r in records], n_layer, rows)
    present = set()
    ax = None
    for k, mode in enumerate(modes):
        ax = page.axes(panels_x + k * (panel_w + 0.3), top, panel_w, max(rows, 1) * _ROW)
        _grid_axes(ax, cols, rows)
        ax.set_xticks([j + 0.5 for j in range(cols)], [str(t) for t in offsets], fontsize=6)
        ax.xaxis.set_ticks_position("top")
        ax.set_title(f"{mode} hand-off at t", fontsize=7, pad=10)
        if isinstance(prompt_len, int) and prompt_len in offsets:
            # offsets from here on hand off after decode steps, not inside the prompt
            ax.axvline(offsets.index(prompt_len), color="#444444", linewidth=0.8, linestyle=(0, (2, 2)))
        for i, label in enumerate(labels):
            for j, t in enumerate(offsets):
                s = grid[(mode, i)][j]
                present.add(s)
                _cell(ax, j, i, s, _gid("cell", mode, label, t, s))
        for m, i, j in marks:
            if m == mode:
                _mark(ax, j, i, _gid("marked", mode, labels[i], offsets[j]))
        if not rows:
            _no_rows(ax, "cut sets")
    if ax is not None:
        _notes(ax, cols + 0.3, records)
    legend_y = top + max(rows, 1) * _ROW + 0.15
    page.legend(left - 0.8, legend_y, _status_handles(present), ncols=6)
    page.legend(left - 0.8, legend_y + 0.3, _kind_handles(layers), ncols=6)
    if isinstance(prompt_len, int) and prompt_len in offsets:
        page.text(left - 0.8, legend_y + 0.62, f"dashed line: hand-offs after decode steps (t ≥ {prompt_len}); "
                  "× the offset where a cut set first differs", fontsize=6, color="#444444")
    return page.save(Path(out))


@_draw
def sweep_picture(report: Mapping[str, Any], out: Path | str) -> Path:
    """Cut set × phase grid beside the layer-kind strip, each cut set's cuts and its first differing layer."""
    labels, phases, grid, marks = sweep_grid(report)
    records = _records(report)
    layers = report_layers(report)
    n_layer, rows, cols = len(layers), len(labels), len(phases)
    left, top = 0.9, 0.95
    panel_w = max(cols, 1) * _PHASE_COL
    panel_x = left + n_layer * _LAYER + 0.3
    page = _Page(panel_x + panel_w + 4.5, top + max(rows, 1) * _ROW + 1.4)
    control = (report.get("control") or {}).get("status")
    page.text(0.1, 0.1, _title(report) + (f"  (control: {status_of(control)})" if control else ""), fontsize=8)
    _layer_strip(page, left, top - 0.3, layers)
    track = _cut_track(page, left, top, labels, [r.get("cuts") or [] for r in records], n_layer, rows)
    for i, rec in enumerate(records):
        layer = rec.get("layer")
        if rec["status"] not in ("pass", "unsupported") and isinstance(layer, int) and 0 <= layer < n_layer:
            track.plot([layer + 0.5], [i + 0.5], marker="x", markersize=4, markeredgewidth=1.2,
                       color=STATUS_COLOURS["finding"], clip_on=False, gid=_gid("diverges", labels[i], layer))
    ax = page.axes(panel_x, top, panel_w, max(rows, 1) * _ROW)
    _grid_axes(ax, cols, rows)
    ax.set_xticks([j + 0.5 for j in range(cols)], phases, fontsize=7)
    ax.xaxis.set_ticks_position("top")
    present = set()
    for i, label in enumerate(labels):
        for j, phase in enumerate(phases):
            s = grid[i][j]
            present.add(s)
            _cell(ax, j, i, s, _gid("cell", label, phase, s))
    for i, j in marks:
        _mark(ax, j, i, _gid("marked", labels[i], phases[j]))
    if not rows:
        _no_rows(ax, "cut sets")
    _notes(ax, cols + 0.15, records)
    legend_y = top + max(rows, 1) * _ROW + 0.15
    handles = _status_handles(present)
    if any(r["status"] not in ("pass", "unsupported") and isinstance(r.get("layer"), int) for r in records):
        handles.append(Line2D([], [], marker="x", markersize=4, markeredgewidth=1.2, linestyle="none",
                              color=STATUS_COLOURS["finding"], label="first differing layer"))
    page.legend(left - 0.8, legend_y, handles, ncols=5)
    page.legend(left - 0.8, legend_y + 0.3, _kind_handles(layers), ncols=6)
    return page.save(Path(out))


@_draw
def battery_picture(lanes: Sequence[Mapping[str, Any]], out: Path | str, lane_order: Sequence[str] = ()) -> Path:
    """Row × lane grid of a family-certify run: rows in the order given, lanes in `lane_order` then by first
    appearance; a lane a row has no entry for is drawn "not run"."""
    rows: list[str] = []
    present_lanes = {str(e["lane"]) for e in lanes}
    cols: list[str] = [ln for ln in lane_order if ln in present_lanes]
    status: dict[tuple[str, str], str] = {}
    for e in lanes:
        row, lane = str(e["row"]), str(e["lane"])
        if row not in rows:
            rows.append(row)
        if lane not in cols:
            cols.append(lane)
        status[(row, lane)] = status_of(e.get("status"))
    left, top = 1.4, 1.0
    page = _Page(left + max(len(cols), 1) * _LANE_COL + 3.0, top + max(len(rows), 1) * _ROW + 1.0)
    ax = page.axes(left, top, max(len(cols), 1) * _LANE_COL, max(len(rows), 1) * _ROW)
    _grid_axes(ax, len(cols), len(rows))
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows, fontsize=7)
    ax.set_xticks([j + 0.5 for j in range(len(cols))], cols, fontsize=7, rotation=45, ha="left",
                  rotation_mode="anchor")
    ax.xaxis.set_ticks_position("top")
    present = set()
    for i, row in enumerate(rows):
        for j, lane in enumerate(cols):
            s = status.get((row, lane), "not-run")
            present.add(s)
            _cell(ax, j, i, s, _gid("cell", row, lane, s))
    if not rows:
        _no_rows(ax, "lanes")
    page.legend(left + max(len(cols), 1) * _LANE_COL + 0.2, top, _status_handles(present), ncols=1)
    return page.save(Path(out))


def report_picture(report: Mapping[str, Any], out: Path | str) -> Path | None:
    """The picture for the oracle that wrote the report, or None when that oracle has none yet."""
    oracle = report.get("oracle")
    if oracle == "handoff":
        return handoff_picture(report, out)
    if oracle == "sweep":
        return sweep_picture(report, out)
    return None
