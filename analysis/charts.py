"""Small SVG charts as strings: the one chart implementation the dashboard, the API and the
pasteable reports (``sme2-client report``) share.

numpy and the standard library only (no matplotlib, nothing fetched at run time). Every chart
is a complete ``<svg>`` element with a ``viewBox`` (it scales to its container), an accessible
``<title>`` and ``<desc>`` as its first children (``role="img"``), colours and fonts as
attributes (no stylesheet needed: it renders the same inline in the dashboard, in an HTML
report and as an image), every piece of text escaped, and a ``<title>`` on each mark so a
hover says the exact number. Non-finite values are dropped; a chart with nothing to draw says
so instead of failing.

- :func:`distribution_chart`: latency distribution per arm (violin with the p10..p90 box and
  the median), several arms side by side on one axis;
- :func:`category_bars`: stacked bars of the five categories (analysis/categories.py) per arm,
  in ms, on one scale so arms compare by length;
- :func:`forest_plot`: one row per comparison, ratio and 95% interval on a log axis, the
  minimum-effect band around 1, coloured by verdict;
- :func:`line_chart`: a time series (one point per night/experiment) with each point's spread
  (low..high) as a band and whiskers, and change marks (regression/improvement);
- :func:`scaling_chart`: speedup against thread count, one series per arm (analysis/scaling.py;
  the server's chart: per device x core mask x SME2 setting), each point's 95% interval as a
  whisker, the ideal (linear) speedup dashed, a legend naming every series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

from .categories import CATEGORIES
from .types import Section

FONT = "system-ui, -apple-system, Segoe UI, Roboto, sans-serif"
INK, MUTED, GRID, BG = "#1d2330", "#6a7282", "#e2e5ea", "#ffffff"
CATEGORY_COLOURS = dict(zip(CATEGORIES, ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b3aca6")))
ARM_COLOURS = ("#4e79a7", "#8a5cd0", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
VERDICT_COLOURS = {"speedup": "#1f8a4c", "slowdown": "#b4232c", "no significant difference": "#6a7282",
                   "insufficient data": "#8a5a00"}
CHANGE_COLOURS = {"regression": "#b4232c", "improvement": "#1f8a4c"}


# --- what the charts draw: read once from the JSON the callers pass (extra keys ignored) ----

@dataclass(kw_only=True)
class ForestRow(Section):
    """One forest_plot row: a comparison's ratio baseline/candidate and its interval."""

    label: str = ""
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None = None
    sentence: str | None = None
    note: str | None = None
    emulated: bool | None = None


@dataclass(kw_only=True)
class LinePoint(Section):
    """One line_chart point (a SeriesPoint's JSON): its median and spread."""

    median_ms: float | None = None
    low_ms: float | None = None
    high_ms: float | None = None
    at: str | None = None
    experiment_id: int | None = None


@dataclass(kw_only=True)
class LineChange(Section):
    """One line_chart change mark (a SeriesChange's JSON)."""

    point_index: int | None = None
    direction: str | None = None
    status: str | None = None
    ratio: float | None = None
    experiment_id: int | None = None
    baseline_experiment_id: int | None = None


@dataclass(kw_only=True)
class Estimate(Section):
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass(kw_only=True)
class ThreadsPoint(Section):
    """One scaling_chart point: a thread count's speedup (analysis.scaling's view)."""

    threads: int
    speedup: Estimate | None = None
    efficiency: Estimate | None = None
    median_ms: float | None = None


@dataclass(kw_only=True)
class ScalingSeries(Section):
    """One scaling_chart series (an arm of analysis.scaling's view, named by the caller)."""

    name: str | None = None
    base_threads: int | None = None
    enough_threads: int | None = None
    points: list[ThreadsPoint] | None = None
    device: str | None = None
    core_mask: str | None = None
    sme2: str | None = None


# --- helpers -------------------------------------------------------------------------------

def _esc(s) -> str:
    """Text for an element body or an attribute value: &, <, >, " and ' escaped."""
    return escape(str(s), quote=True)


def _coord(x: float) -> str:
    """A coordinate: two decimals, no trailing zeros (small files, stable output)."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _finite(values) -> np.ndarray:
    """A 1-D float array of the finite values (None, NaN, inf and non-numbers dropped)."""
    try:  # the common case, a list of floats: one numpy conversion, no Python loop
        a = np.asarray(values if values is not None else (), dtype=np.float64).ravel()
        return a[np.isfinite(a)]
    except (TypeError, ValueError):
        pass
    out = []
    for v in values if values is not None else ():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out.append(f)
    return np.asarray(out, dtype=np.float64)


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def fmt(v: float | None, digits: int = 4) -> str:
    """Four significant digits, as the dashboard shows milliseconds: 0.04215, 12.35, 1235."""
    if v is None or not math.isfinite(v):
        return "—"
    if v == 0:
        return "0"
    mag = int(math.floor(math.log10(abs(v))))
    decimals = max(0, digits - 1 - mag)
    return f"{v:.{decimals}f}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


# Advance widths of DejaVu Sans, regular and bold, in thousandths of an em, for ASCII 32..126. Of the
# fonts FONT resolves to, it is the widest (Linux falls back to it; SF, Segoe UI and Roboto are
# narrower), so a label measured with it fits wherever the chart is drawn.
_WIDTHS = {
    False: (318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636,
            636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698, 770, 632,
            575, 775, 752, 295, 295, 656, 557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685,
            611, 685, 390, 337, 390, 838, 500, 500, 613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579,
            278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838),
    True: (348, 456, 521, 838, 696, 1002, 872, 306, 457, 457, 523, 838, 380, 415, 380, 365, 696, 696, 696,
           696, 696, 696, 696, 696, 696, 696, 400, 400, 838, 838, 838, 580, 1000, 774, 762, 734, 830, 683,
           683, 821, 837, 372, 372, 775, 637, 995, 837, 850, 733, 850, 770, 720, 682, 812, 774, 1103, 771,
           724, 725, 457, 365, 457, 838, 500, 500, 675, 716, 593, 716, 678, 435, 716, 712, 343, 343, 665,
           343, 1042, 712, 687, 716, 716, 493, 595, 478, 712, 652, 924, 645, 652, 582, 712, 365, 712, 838),
}
_MIDDLE_DOT = {False: 318, True: 380}


def text_px(s, size: float = 12, bold: bool = False) -> float:
    """The width of s drawn at `size` px (bold or not), measured as DejaVu Sans draws it; a
    character outside ASCII counts a full em (the dot and the arrows the labels use, their own)."""
    table = _WIDTHS[bool(bold)]
    em = 0
    for ch in str(s):
        code = ord(ch)
        em += (table[code - 32] if 32 <= code < 127 else _MIDDLE_DOT[bool(bold)] if ch == "·"
               else 838 if ch in "→×" else 1000)
    return em * size / 1000


def _fit(s, max_px: float, size: float = 12, bold: bool = False) -> str:
    """s shortened with an ellipsis to at most max_px at that size."""
    s = str(s)
    if text_px(s, size, bold) <= max_px:
        return s
    while s and text_px(s + "…", size, bold) > max_px:
        s = s[:-1]
    return s.rstrip() + "…"


def _wrap(s, max_px: float, *, size: float = 12, bold: bool = False, lines: int = 2) -> list[str]:
    """s broken into at most `lines` lines of max_px, at spaces (a " · " stays at the end of its line;
    a word longer than a line is broken inside); what the last line cannot hold is cut with "…"."""
    words: list[str] = []
    for w in str(s).split(" "):
        if words and w in ("·", "→", "|"):
            words[-1] += " " + w
        elif w:
            words.append(w)
    out: list[str] = []
    while words and len(out) < lines:
        line = words.pop(0)
        while text_px(line, size, bold) > max_px and len(out) < lines - 1:  # a word wider than a line
            cut = next((i for i in range(len(line) - 1, 0, -1) if text_px(line[:i], size, bold) <= max_px), 1)
            out.append(line[:cut])
            line = line[cut:]
        while words and text_px(f"{line} {words[0]}", size, bold) <= max_px:
            line += " " + words.pop(0)
        out.append(line)
    if words or (out and text_px(out[-1], size, bold) > max_px):
        out[-1] = _fit(" ".join([out[-1], *words]), max_px, size, bold)  # the next word did not fit: cut
    return out or [""]


def _label(x: float, y: float, s, max_px: float, *, lines: int = 1, line_h: float | None = None,
           size: int | None = None, weight: str | None = None, **kw) -> str:
    """A label of at most `lines` lines of max_px from y down (one <tspan> a line): wrapped at
    spaces, the rest cut with "…"; a cut label keeps its full text in a <title> (hover) and in
    data-full (for a reader or a test)."""
    shown = _wrap(s, max_px, size=size or 12, bold=bool(weight), lines=lines)
    cut = " ".join(shown) != " ".join(str(s).split())
    if len(shown) == 1:
        el = _text(x, y, shown[0], size=size, weight=weight, **kw)
    else:
        step = line_h or (size or 12) + 3
        spans = "".join(f'<tspan x="{_coord(x)}" y="{_coord(y + i * step)}">{_esc(line)}</tspan>'
                        for i, line in enumerate(shown))
        el = _text(x, y, "", size=size, weight=weight, **kw).replace("></text>", f">{spans}</text>")
    if not cut:
        return el
    return el.replace("<text ", f'<text data-full="{_esc(s)}" ', 1).replace("</text>", f"<title>{_esc(s)}</title></text>")


def line_count(s, max_px: float, *, size: float = 12, bold: bool = False, lines: int = 2) -> int:
    """How many lines _label draws s in."""
    return len(_wrap(s, max_px, size=size, bold=bold, lines=lines))


NOTE_LINE = 15    # a note's lines (size 11), wrapped to two


def _notes(x: float, y: float, notes: Sequence[str], max_px: float, cls: str) -> tuple[list[str], float]:
    """Muted notes from baseline y down, each wrapped to two lines: the elements and the height they take."""
    out, h = [], 0.0
    for note in notes:
        out.append(_label(x, y + h, note, max_px, lines=2, line_h=NOTE_LINE, size=11, fill=MUTED, cls=cls))
        h += NOTE_LINE * line_count(note, max_px, size=11) + 3
    return out, h


TITLE_LINE = 18   # a wrapped title's second line, and how far it moves the chart down


def _open(width: int, height: int, title: str, desc: str, kind: str) -> list[str]:
    """The <svg> with its title, description and background; the title wraps to two lines (cut
    after that, whole in <title>), moving the plot below it down. The plot is a group that
    _close ends."""
    lines = _wrap(title, width - 24, size=14, bold=True, lines=2)
    extra = TITLE_LINE * (len(lines) - 1)
    total = math.ceil(height + extra)
    heading = "".join(f'<tspan x="12" y="{20 + TITLE_LINE * i}">{_esc(line)}</tspan>' for i, line in enumerate(lines))
    if " ".join(lines) != " ".join(title.split()):   # cut: the whole title on hovering it too
        heading += f"<title>{_esc(title)}</title>"
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-{_esc(kind)}" data-chart="{_esc(kind)}" '
            f'viewBox="0 0 {width} {total}" width="{width}" height="{total}" role="img" '
            f'font-family="{_esc(FONT)}" font-size="12" fill="{INK}">',
            f"<title>{_esc(title)}</title>", f"<desc>{_esc(desc)}</desc>",
            f'<rect class="bg" x="0" y="0" width="{width}" height="{total}" fill="{BG}"/>',
            f'<text class="chart-title" x="12" y="20" font-size="14" font-weight="600">{heading}</text>',
            f'<g class="plot" transform="translate(0 {extra})">' if extra else '<g class="plot">']


def _close(parts: list[str]) -> str:
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _text(x: float, y: float, s, *, anchor: str = "start", size: int | None = None, fill: str | None = None,
          weight: str | None = None, cls: str | None = None, rotate: float | None = None) -> str:
    attrs = [f'x="{_coord(x)}"', f'y="{_coord(y)}"']
    if anchor != "start":
        attrs.append(f'text-anchor="{anchor}"')
    if size:
        attrs.append(f'font-size="{size}"')
    if fill:
        attrs.append(f'fill="{fill}"')
    if weight:
        attrs.append(f'font-weight="{weight}"')
    if cls:
        attrs.append(f'class="{_esc(cls)}"')
    if rotate is not None:
        attrs.append(f'transform="rotate({_coord(rotate)} {_coord(x)} {_coord(y)})"')
    return f"<text {' '.join(attrs)}>{_esc(s)}</text>"


def _empty(parts: list[str], width: int, height: int, message: str) -> str:
    parts.append(_text(width / 2, height / 2, message, anchor="middle", fill=MUTED, cls="empty"))
    return _close(parts)


def _y_axis(parts: list[str], ticks: Sequence[float], y_of, x0: float, x1: float, label: str, top: float,
            bottom: float, fmt_tick=lambda t: f"{t:g}") -> None:
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{_coord(x0)}" y1="{_coord(y)}" x2="{_coord(x1)}" y2="{_coord(y)}" stroke="{GRID}"/>')
        parts.append(_text(x0 - 6, y + 4, fmt_tick(t), anchor="end", size=11, fill=MUTED))
    if label:
        # The rotated title sits left of the widest tick label (its descenders reach ~3 px right of
        # its baseline): at x=14 it overlapped labels like "0.00345". Where even the margin's edge
        # is too close, it goes above the axis.
        widest = max((text_px(fmt_tick(t), 11) for t in ticks), default=0)
        x = min(14.0, x0 - 6 - widest - 5)
        if x >= 10:  # the glyphs' cap height (~8 px) stays inside the image
            parts.append(_text(x, (top + bottom) / 2, label, anchor="middle", size=11, fill=MUTED, rotate=-90))
        else:
            parts.append(_text(x0, top - 8, label, size=11, fill=MUTED))


# --- latency distribution ------------------------------------------------------------------

KDE_BINS = 2048  # above this many samples the density is computed from a fine histogram (cost independent of n)


def _kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Gaussian kernel density of x (sorted) on grid (Silverman's bandwidth), vectorised. A long run
    (100,000 iterations x 20 sessions) is binned first: grid x bins, not grid x samples."""
    n = x.size
    sd = float(x.std(ddof=1)) if n > 1 else 0.0
    q75, q25 = _sorted_percentile(x, 75), _sorted_percentile(x, 25)
    spread = min(sd, float(q75 - q25) / 1.34) if q75 > q25 else sd
    bw = 0.9 * spread * n ** -0.2 if spread > 0 else 0.0
    if bw <= 0:
        bw = max(abs(float(x.mean())) * 1e-3, 1e-9)
    if n > KDE_BINS:
        counts, edges = np.histogram(x, bins=KDE_BINS)
        centres, weights = (edges[:-1] + edges[1:]) / 2, counts.astype(np.float64)
    else:
        centres, weights = x, np.ones(n)
    z = (grid[:, None] - centres[None, :]) / bw
    return (np.exp(-0.5 * z * z) * weights[None, :]).sum(axis=1) / (n * bw * math.sqrt(2 * math.pi))


def _sorted_percentile(s: np.ndarray, p: float, method: str = "linear") -> float:
    """The p-th percentile of a SORTED array, as numpy's percentile with that method."""
    pos = p / 100.0 * (s.size - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if method == "lower":
        return float(s[lo])
    if method == "higher":
        return float(s[hi])
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def _fences(x: np.ndarray) -> tuple[float, float]:
    """(x sorted) The range a violin's axis must show: Tukey's far-out fences (quartiles -/+ 3 IQR), widened
    to the p10..p90 box the chart draws, so a few 30x first-iteration outliers (10 of 200, or 1 of 10)
    do not flatten every violin into a line; what lies beyond is counted at the axis edge."""
    q1, q3 = _sorted_percentile(x, 25), _sorted_percentile(x, 75)
    # sample values, not interpolations: with 10 samples an interpolated p90 lands near the outlier
    p10, p90 = _sorted_percentile(x, 10, "higher"), _sorted_percentile(x, 90, "lower")
    iqr = q3 - q1
    if iqr <= 0:
        iqr = abs(_sorted_percentile(x, 50)) * 0.05
    return min(q1 - 3 * iqr, p10), max(q3 + 3 * iqr, p90)


LABEL_LINES, LABEL_LINE_H = 3, 14   # an arm's name under its violin: wrapped to this many lines


def distribution_chart(arms: Sequence[tuple[str, Iterable[float]]], *, title: str = "Latency distribution",
                       unit: str = "ms", width: int = 640, height: int = 300, emulated: str | None = None,
                       left_out: Sequence[str] = ()) -> str:
    """Violin per arm (kernel density, each violin scaled to its own peak), with the p10..p90
    box, the median as a white bar and n under each; samples beyond the far-out fences are
    counted at the axis edge (the statistics include them). ``arms``: ``[(label, samples), ...]``,
    measured ones only: an emulator's times are no latency, so they never share this axis.
    ``emulated``: what ran every arm (nothing is drawn, the chart says so); ``left_out``: lines
    under the chart naming what was not drawn and why."""
    data = [(str(label), np.sort(_finite(samples))) for label, samples in arms]  # sorted once: every quantile is O(1)
    desc = "; ".join(f"{lab}: n={x.size}" + (f", median {fmt(_sorted_percentile(x, 50))} {unit}, p10 "
                                             f"{fmt(_sorted_percentile(x, 10))}, p90 {fmt(_sorted_percentile(x, 90))}"
                                             if x.size else "")
                     for lab, x in data) or "no arms"
    if left_out:
        desc += "; not drawn: " + "; ".join(map(str, left_out))
    drawn = [(lab, x) for lab, x in data if x.size]
    height = height if drawn else 90   # only a sentence to show
    slot = (width - 64 - 12) / max(len(data), 1)
    lines = max([line_count(lab, slot - 10, bold=True, lines=LABEL_LINES) for lab, _ in data] + [1])
    below = LABEL_LINE_H * (lines - 1)   # the plot keeps its height; wrapped names make the chart taller
    notes, notes_h = _notes(12, (height + below if drawn else height) + 8, left_out, width - 24, "left-out")
    parts = _open(width, (height + below if drawn else height) + int(notes_h), title,
                  f"Violin plot of per-iteration latency in {unit}. {desc}.", "distribution")
    parts += notes
    if emulated and not drawn:
        return _empty(parts, width, height, f"emulated ({_fit(emulated, 300)}): no latency figures")
    if not drawn:
        return _empty(parts, width, height, "no latency samples")
    left, right, top, bottom = 64, 12, 40, height - 40
    fences = {id(x): _fences(x) for _, x in drawn}
    lo = min(max(float(x.min()), fences[id(x)][0]) for _, x in drawn)
    hi = max(min(float(x.max()), fences[id(x)][1]) for _, x in drawn)
    pad = (hi - lo) * 0.05 or max(abs(hi) * 0.05, 1e-6)
    ticks = nice_ticks(lo - pad, hi + pad)
    lo_ax, hi_ax = min([lo - pad] + ticks), max([hi + pad] + ticks)

    def y_of(v: float) -> float:
        return bottom - (v - lo_ax) / (hi_ax - lo_ax) * (bottom - top)

    _y_axis(parts, ticks, y_of, left, width - right, f"latency ({unit})", top, bottom)
    half = min(slot * 0.42, 90)
    grid = np.linspace(lo_ax, hi_ax, 96)
    for i, (label, x) in enumerate(data):
        cx = left + slot * (i + 0.5)
        colour = ARM_COLOURS[i % len(ARM_COLOURS)]
        parts.append(f'<g class="arm" data-label="{_esc(label)}" data-n="{x.size}">')
        parts.append(_label(cx, bottom + 16, label, slot - 10, lines=LABEL_LINES, line_h=LABEL_LINE_H,
                            anchor="middle", weight="600"))
        parts.append(_text(cx, bottom + 30 + below, f"n={x.size}", anchor="middle", size=11, fill=MUTED))
        if not x.size:
            parts.append(_text(cx, (top + bottom) / 2, "no samples", anchor="middle", fill=MUTED))
            parts.append("</g>")
            continue
        med, p10, p90 = _sorted_percentile(x, 50), _sorted_percentile(x, 10), _sorted_percentile(x, 90)
        tip = f"{label}: median {fmt(med)} {unit}, p10 {fmt(p10)}, p90 {fmt(p90)}, min {fmt(float(x.min()))}, " \
              f"max {fmt(float(x.max()))}, n={x.size}"
        keep = (x >= lo_ax) & (x <= hi_ax)
        xin = x[keep]
        for side, out, y_edge in (("above", x[x > hi_ax], top - 4), ("below", x[x < lo_ax], bottom + 4)):
            if out.size:  # far outliers: counted at the edge instead of stretching the axis
                extreme = float(out.max() if side == "above" else out.min())
                d = -1 if side == "above" else 1
                parts.append(f'<path class="outliers" data-side="{side}" data-count="{out.size}" '
                             f'd="M{_coord(cx - 5)},{_coord(y_edge - d * 6)} L{_coord(cx + 5)},{_coord(y_edge - d * 6)} L{_coord(cx)},{_coord(y_edge)} Z" '
                             f'fill="{colour}"><title>{_esc(f"{out.size} sample(s) {side} the axis, most extreme {fmt(extreme)} {unit}")}</title></path>')
                parts.append(_text(cx + 8, y_edge - d * 1 + (4 if side == "above" else 0), f"{out.size} {side}, to {fmt(extreme)}",
                                   size=10, fill=MUTED))
        inside = grid[(grid >= xin.min()) & (grid <= xin.max())] if xin.size else grid[:0]
        inside = np.unique(np.concatenate([[xin.min()], inside, [xin.max()]])) if xin.size else inside
        drew_violin = bool(xin.size >= 3 and inside.size >= 3 and xin.max() > xin.min())
        if drew_violin:
            dens = _kde(xin, inside)
            w = dens / dens.max() * half
            pts_r = [f"{_coord(cx + wi)},{_coord(y_of(v))}" for v, wi in zip(inside, w)]
            pts_l = [f"{_coord(cx - wi)},{_coord(y_of(v))}" for v, wi in zip(inside[::-1], w[::-1])]
            parts.append(f'<polygon class="violin" points="{" ".join(pts_r + pts_l)}" fill="{colour}" '
                         f'fill-opacity="0.35" stroke="{colour}" stroke-width="1.2"><title>{_esc(tip)}</title></polygon>')
        else:  # too few (or identical) samples for a density: the samples themselves
            for v in xin.tolist():
                parts.append(f'<circle class="sample" cx="{_coord(cx)}" cy="{_coord(y_of(v))}" r="3" fill="{colour}">'
                             f"<title>{_esc(f'{label}: {fmt(v)} {unit}')}</title></circle>")
        bw = max(4.0, min(14.0, half * 0.25))
        b_hi, b_lo = min(p90, hi_ax), max(p10, lo_ax)
        parts.append(f'<rect class="p10-p90" x="{_coord(cx - bw / 2)}" y="{_coord(y_of(b_hi))}" width="{_coord(bw)}" '
                     f'height="{_coord(max(y_of(b_lo) - y_of(b_hi), 1))}" fill="{colour}" rx="2"><title>{_esc(tip)}</title></rect>')
        parts.append(f'<line class="median" x1="{_coord(cx - bw)}" y1="{_coord(y_of(med))}" x2="{_coord(cx + bw)}" '
                     f'y2="{_coord(y_of(med))}" stroke="#fff" stroke-width="2.5"><title>{_esc(tip)}</title></line>')
        w_med = float(np.interp(med, inside, w)) if drew_violin else 3.0
        beside = max(w_med, bw / 2) + 6  # beside the violin at the median's height, not on it
        right_side = cx + beside + text_px(fmt(med), 11) <= min(cx + slot / 2, width - 2)
        parts.append(_text(cx + beside if right_side else cx - beside, y_of(med) + 4, fmt(med), size=11,
                           anchor="start" if right_side else "end", cls="median-label").replace(
            "<text ", '<text paint-order="stroke" stroke="#fff" stroke-width="3" stroke-linejoin="round" ', 1))
        parts.append("</g>")
    return _close(parts)


# --- stacked category bars -----------------------------------------------------------------

def _category_rows(arms: Sequence[tuple[str, Mapping[str, float]]]) -> list[tuple[str, dict[str, float], float]]:
    rows = []
    for label, cats in arms:
        vals = {c: max(_num((cats or {}).get(c)) or 0.0, 0.0) for c in CATEGORIES}
        rows.append((str(label), vals, sum(vals.values())))
    return rows


def category_bars(arms: Sequence[tuple[str, Mapping[str, float]]], *, title: str = "Where the time goes",
                  unit: str = "ms", width: int = 640, height: int | None = None,
                  emulated: Sequence[tuple[str, Mapping[str, float]]] = (), emulator: str | None = None) -> str:
    """One horizontal stacked bar per arm, the five categories in ms per iteration, all bars on
    one scale (a shorter bar is a faster arm). ``arms``: ``[(label, {category: ms}), ...]``;
    categories missing from a dict count 0, unknown keys are ignored. ``emulated``: arms an
    emulator (``emulator``) ran, in the same form: an emulator's time is no CPU's, so they get a
    panel of their own, each category as a share of its arm (every bar full width, no ms)."""
    rows, shares = _category_rows(arms), [r for r in _category_rows(emulated) if r[2] > 0]
    bar_h, gap, line_h = 24, 14, 13
    label_w = min(int(width * 0.4), max([60] + [int(text_px(lab, bold=True)) + 24 for lab, _, _ in rows + shares]))
    what = f"emulated by {emulator}" if emulator else "emulated"
    note, heading = _notes(12, 0, [f"{what[:1].upper()}{what[1:]}: each category's share of the emulator's time, "
                                   "no timing (an emulator's time is no CPU's)"] if shares else [], width - 24,
                           "panel-note")
    heading += 8 if shares else 0
    height = height or 34 + max(len(rows) + len(shares), 1) * (bar_h + gap) + heading + 32
    desc = "; ".join(f"{lab}: " + ", ".join(f"{c} {fmt(v[c])} {unit}" for c in CATEGORIES) + f" (total {fmt(t)})"
                     for lab, v, t in rows) or "no measured arms"
    if shares:
        desc += "; emulated, shares of the emulator's time: " + "; ".join(
            f"{lab}: " + ", ".join(f"{c} {100 * v[c] / t:.0f}%" for c in CATEGORIES) for lab, v, t in shares)
    parts = _open(width, height, title, f"Stacked bars of mean {unit} per iteration by operator category. {desc}.",
                  "categories")
    biggest = max([t for _, _, t in rows] + [0.0])
    if biggest <= 0 and not shares:
        return _empty(parts, width, height, "no category timings")
    x0, x1 = label_w, width - 86
    y = 34.0

    def bar(label: str, vals: dict[str, float], total: float, scale: float, emulated_arm: bool) -> None:
        nonlocal y
        data = 'data-emulated="yes"' if emulated_arm else f'data-emulated="no" data-total="{total!r}"'
        parts.append(f'<g class="bar" data-label="{_esc(label)}" {data}>')
        n = line_count(label, x0 - 16, bold=True)
        first = y + bar_h / 2 + 4 - (n - 1) * line_h / 2
        parts.append(_label(x0 - 8, first, label, x0 - 16, lines=2, line_h=line_h, anchor="end", weight="600"))
        x = x0
        for c in CATEGORIES:
            w = vals[c] * scale
            share = vals[c] / total if total > 0 else 0.0
            if w > 0:
                value = (f'data-share="{share!r}"' if emulated_arm else f'data-ms="{vals[c]!r}"')
                tip = (f"{label} · {c}: {100 * share:.1f}% of the emulator's time" if emulated_arm
                       else f"{label} · {c}: {fmt(vals[c])} {unit} ({100 * share:.1f}%)")
                parts.append(f'<rect class="segment" data-category="{_esc(c)}" {value} x="{_coord(x)}" '
                             f'y="{_coord(y)}" width="{_coord(max(w, 0.5))}" height="{bar_h}" fill="{CATEGORY_COLOURS[c]}">'
                             f"<title>{_esc(tip)}</title></rect>")
                if w > 44:
                    parts.append(_text(x + w / 2, y + bar_h / 2 + 4, f"{100 * share:.0f}%", anchor="middle", size=11,
                                       fill="#fff"))
            x += w
        if not emulated_arm:
            parts.append(_text(x + 6, y + bar_h / 2 + 4, f"{fmt(total)} {unit}", size=11, fill=MUTED))
        parts.append("</g>")
        y += bar_h + gap

    if rows:
        parts.append('<g class="panel" data-axis="ms">')
        for label, vals, total in rows:
            bar(label, vals, total, (x1 - x0) / biggest if biggest > 0 else 0.0, False)
        parts.append("</g>")
    if shares:
        parts.append(f'<g class="panel" data-axis="share" data-emulated="yes"><g transform="translate(0 {_coord(y + 8)})">')
        parts += note
        parts.append("</g>")
        y += heading
        for label, vals, total in shares:
            bar(label, vals, total, (x1 - x0) / total, True)
        parts.append("</g>")
    lx, ly = 12.0, height - 16
    for c in CATEGORIES:
        parts.append(f'<rect class="legend-swatch" x="{_coord(lx)}" y="{_coord(ly - 10)}" width="10" height="10" rx="2" '
                     f'fill="{CATEGORY_COLOURS[c]}"/>')
        parts.append(_text(lx + 14, ly, c, size=11))
        lx += 14 + text_px(c, 11) + 18
    return _close(parts)


# --- verdict forest plot -------------------------------------------------------------------

def forest_plot(rows: Sequence[Mapping | ForestRow], *, min_effect: float | None = None,
                title: str = "Verdicts: ratio and 95% interval", width: int = 720,
                empty: str = "no comparisons") -> str:
    """One row per comparison: ``{"label", "ratio" (baseline/candidate, > 1: candidate faster),
    "ci_low", "ci_high", "verdict", "sentence"?, "note"?, "emulated"?}`` on a log axis with 1 marked
    and the minimum-effect band [1/(1+m), 1+m] shaded. A row without an interval shows its point
    only; one without a ratio says its ``note`` (default "no ratio") and its verdict in words (an
    emulated comparison: "no speed verdict"). Without any ratio no axis is drawn."""
    rows = [ForestRow.from_dict(r) for r in rows]
    if not rows:  # nothing to read a ratio from: only say why
        height = 46 + 30 + 34
        return _empty(_open(width, height, title, f"{empty}.", "verdicts"), width, height, empty)
    label_w = min(int(width * 0.34), max([80] + [int(text_px(r.label, bold=True)) + 24 for r in rows]))
    axis = any((_num(r.ratio) or 0) > 0 for r in rows)
    x0 = label_w
    x1 = width - 320 if axis else x0   # no ratio to place: the words right beside the labels
    lines = max(line_count(r.label, x0 - 16, bold=True) for r in rows)
    row_h, line_h = (30, 13) if lines == 1 else (36, 13)
    band = None
    if min_effect is not None and _num(min_effect) is not None and 0 < min_effect < 1:
        band = (1.0 / (1.0 + min_effect), 1.0 + min_effect)
    vals = [1.0] + (list(band) if band else [])
    for r in rows:
        vals += [v for v in (_num(r.ratio), _num(r.ci_low), _num(r.ci_high)) if v and v > 0]
    top = 40
    bottom = top + len(rows) * row_h
    height = bottom + (40 if axis else 6)
    desc = "; ".join(f"{r.label}: " + (f"ratio {fmt(_num(r.ratio))} [{fmt(_num(r.ci_low))}, "
                                       f"{fmt(_num(r.ci_high))}] " if (_num(r.ratio) or 0) > 0
                                       else f"{r.note or 'no ratio'}, ")
                     + str(r.verdict or "") for r in rows)
    parts = _open(width, height, title, ("Forest plot of ratios baseline/candidate (above 1: the candidate is faster)"
                                         + (f", minimum effect {100 * min_effect:g}% shaded" if band and axis else "")
                                         if axis else "Comparisons without a ratio") + f". {desc}.", "verdicts")
    lo, hi = math.log(min(vals)), math.log(max(vals))
    span = max(hi - lo, math.log(1.1))
    lo, hi = lo - 0.08 * span, hi + 0.08 * span

    def x_of(v: float) -> float:
        return x0 + (math.log(v) - lo) / (hi - lo) * (x1 - x0)

    if axis:
        if band:
            parts.append(f'<rect class="min-effect" x="{_coord(x_of(band[0]))}" y="{top}" width="{_coord(x_of(band[1]) - x_of(band[0]))}" '
                         f'height="{bottom - top}" fill="#eceef2"><title>{_esc(f"minimum effect {100 * min_effect:g}%: differences inside are not claimed")}</title></rect>')
        candidates = [0.1, 0.2, 0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2, 3, 4, 5, 10, 20, 50]
        ticks = [t for t in candidates if lo <= math.log(t) <= hi]
        min_px = 34.0  # drop ticks that would overlap, keeping 1
        kept: list[float] = []
        for t in sorted(ticks, key=lambda t: (t != 1.0, abs(math.log(t)))):
            if all(abs(x_of(t) - x_of(k)) >= min_px for k in kept):
                kept.append(t)
        for t in sorted(kept):
            x = x_of(t)
            parts.append(f'<line x1="{_coord(x)}" y1="{top}" x2="{_coord(x)}" y2="{bottom}" stroke="{INK if t == 1.0 else GRID}"'
                         + (' stroke-dasharray="3 3"' if t == 1.0 else "") + "/>")
            parts.append(_text(x, bottom + 14, f"{t:g}", anchor="middle", size=11, fill=MUTED))
        parts.append(_label((x0 + x1) / 2, bottom + 28, "ratio baseline / candidate (log scale; > 1: candidate faster)",
                            2 * min((x0 + x1) / 2, width - (x0 + x1) / 2) - 8, anchor="middle", size=11, fill=MUTED))
    for i, r in enumerate(rows):
        y = top + row_h * (i + 0.5)
        label, verdict = str(r.label), str(r.verdict or "")
        ratio, lo_v, hi_v = _num(r.ratio), _num(r.ci_low), _num(r.ci_high)
        colour = VERDICT_COLOURS.get(verdict, MUTED)
        tip = r.sentence or f"{label}: {verdict}"
        emulated = ' data-emulated="yes"' if r.emulated else ""
        parts.append(f'<g class="row" data-label="{_esc(label)}" data-verdict="{_esc(verdict)}"{emulated}>'
                     f"<title>{_esc(tip)}</title>")
        n = line_count(label, x0 - 16, bold=True)
        parts.append(_label(x0 - 8, y + 4 - (n - 1) * line_h / 2, label, x0 - 16, lines=2, line_h=line_h,
                            anchor="end", weight="600"))
        if ratio is not None and ratio > 0:
            if lo_v is not None and hi_v is not None and 0 < lo_v <= hi_v:
                parts.append(f'<line class="interval" x1="{_coord(x_of(lo_v))}" y1="{_coord(y)}" x2="{_coord(x_of(hi_v))}" '
                             f'y2="{_coord(y)}" stroke="{colour}" stroke-width="2.5"/>')
                for v in (lo_v, hi_v):
                    parts.append(f'<line x1="{_coord(x_of(v))}" y1="{_coord(y - 6)}" x2="{_coord(x_of(v))}" y2="{_coord(y + 6)}" '
                                 f'stroke="{colour}" stroke-width="2"/>')
                ci = f"[{lo_v:.3f}, {hi_v:.3f}]"
            else:
                ci = "no interval"
            parts.append(f'<rect class="point" x="{_coord(x_of(ratio) - 5)}" y="{_coord(y - 5)}" width="10" height="10" '
                         f'fill="{colour}"/>')
            parts.append(_label(x1 + 10, y + 4, f"{ratio:.3f} {ci}", 134, size=11))
        else:
            parts.append(_label(x1 + 10, y + 4, r.note or "no ratio", 134, fill=MUTED, size=11, cls="note"))
        parts.append(_label(x1 + 148, y + 4, verdict or "—", width - x1 - 154, size=11, fill=colour, weight="600"))
        parts.append("</g>")
    return _close(parts)


# --- time series ---------------------------------------------------------------------------

def _date(at) -> str:
    s = str(at or "")
    return s[:10] if len(s) >= 10 and s[4:5] == "-" else s[:16]


def line_chart(points: Sequence[Mapping | LinePoint], *, changes: Sequence[Mapping | LineChange] = (), title: str = "Latency over time",
               y_label: str = "median ms", spread: str = "", width: int = 720, height: int = 280) -> str:
    """A series, one point per experiment/night in order: ``points`` as in GET /suites/{name}/series
    (``median_ms``, ``low_ms``, ``high_ms``, ``at``, ``experiment_id``); the low..high spread is a
    band with whiskers (``spread`` names it in the description, e.g. "95% interval"). ``changes``:
    ``{"point_index", "direction": "regression"|"improvement", "status", "ratio"}`` drawn as a
    vertical mark at that point (dashed while a candidate, grey once acknowledged). Points with
    no finite median leave a gap."""
    changes = [LineChange.from_dict(c) for c in changes]
    pts = []
    for i, p in enumerate(LinePoint.from_dict(p) for p in points):
        med = _num(p.median_ms)
        low, high = _num(p.low_ms), _num(p.high_ms)
        pts.append((i, med, low if low is not None and med is not None and low <= med else None,
                    high if high is not None and med is not None and high >= med else None, p))
    valid = [q for q in pts if q[1] is not None]
    desc = (f"{len(valid)} point(s)" + (f" from {_date(valid[0][4].at)} to {_date(valid[-1][4].at)}" if valid else "")
            + (f"; spread: {spread}" if spread else "") + f"; {len(changes)} change(s) marked")
    parts = _open(width, height, title, f"Line chart of {y_label}. {desc}.", "series")
    if not valid:
        return _empty(parts, width, height, f"{len(pts)} point(s), none with samples" if pts else "no points yet")
    left, right, top, bottom = 64, 16, 34, height - 44
    # The axis follows the medians (padded by their range, at least 10% of their level): a spread end far
    # out (one slow iteration in ten) is clipped at the edge and marked, never squashing a step in the medians.
    meds = np.asarray([q[1] for q in valid], dtype=np.float64)
    m_lo, m_hi = float(meds.min()), float(meds.max())
    unit = max(m_hi - m_lo, 0.1 * abs(float(np.median(meds))), 1e-9)
    lim_lo, lim_hi = m_lo - unit, m_hi + unit
    ends = [v for q in valid for v in (q[2], q[3]) if v is not None]
    lo = max(min([m_lo] + ends), lim_lo)
    hi = min(max([m_hi] + ends), lim_hi)
    pad = (hi - lo) * 0.08 or max(abs(hi) * 0.05, 1e-6)
    ticks = [t for t in nice_ticks(lo - pad, hi + pad) if t >= 0 or lo < 0]
    lo_ax, hi_ax = min([lo - pad] + ticks), max([hi + pad] + ticks)
    n = len(pts)
    clip = lambda v: None if v is None else min(max(v, lo_ax), hi_ax)  # noqa: E731

    def x_of(i: float) -> float:
        return left + (i + 0.5) / n * (width - left - right)

    def y_of(v: float) -> float:
        return bottom - (v - lo_ax) / (hi_ax - lo_ax) * (bottom - top)

    _y_axis(parts, ticks, y_of, left, width - right, y_label, top, bottom)
    # the spread band, drawn per run of consecutive points with both ends
    runs: list[list] = [[]]
    for q in pts:
        if q[1] is not None and q[2] is not None and q[3] is not None:
            runs[-1].append(q)
        elif runs[-1]:
            runs.append([])
    for run in runs:
        if len(run) >= 2:
            upper = [f"{_coord(x_of(q[0]))},{_coord(y_of(clip(q[3])))}" for q in run]
            lower = [f"{_coord(x_of(q[0]))},{_coord(y_of(clip(q[2])))}" for q in reversed(run)]
            parts.append(f'<polygon class="spread" points="{" ".join(upper + lower)}" fill="{ARM_COLOURS[0]}" '
                         f'fill-opacity="0.15" stroke="none"/>')
    # change marks under the line
    for c in changes:
        idx = c.point_index
        if not isinstance(idx, int) or not 0 <= idx < n:
            continue
        direction, status = str(c.direction or ""), str(c.status or "")
        colour = MUTED if status == "acknowledged" else CHANGE_COLOURS.get(direction, MUTED)
        x = x_of(idx)
        ratio = _num(c.ratio)
        tip = f"{direction} ({status})" + (f", ratio {ratio:.3f}" if ratio is not None else "") + \
              (f", experiment {c.experiment_id} vs {c.baseline_experiment_id}" if c.experiment_id else "")
        parts.append(f'<g class="change" data-direction="{_esc(direction)}" data-status="{_esc(status)}" '
                     f'data-point-index="{idx}"><title>{_esc(tip)}</title>'
                     f'<line x1="{_coord(x)}" y1="{top}" x2="{_coord(x)}" y2="{bottom}" stroke="{colour}" stroke-width="2"'
                     + (' stroke-dasharray="5 4"' if status == "candidate" else "") + "/>"
                     f'<path d="M{_coord(x - 6)},{top} L{_coord(x + 6)},{top} L{_coord(x)},{top + 9} Z" fill="{colour}"/></g>')
    # the line, broken at gaps
    segs: list[list[str]] = [[]]
    for q in pts:
        if q[1] is None:
            if segs[-1]:
                segs.append([])
            continue
        segs[-1].append(f"{_coord(x_of(q[0]))},{_coord(y_of(q[1]))}")
    for seg in segs:
        if len(seg) >= 2:
            parts.append(f'<polyline class="line" points="{" ".join(seg)}" fill="none" stroke="{ARM_COLOURS[0]}" '
                         f'stroke-width="2"/>')
    for i, med, low, high, p in pts:
        if med is None:
            continue
        x = x_of(i)
        tip = (f"{_date(p.at)}: median {fmt(med)}" + (f" ({fmt(low)}..{fmt(high)})" if low is not None and high is not None else "")
               + (f", experiment {p.experiment_id}" if p.experiment_id is not None else ""))
        parts.append(f'<g class="point" data-index="{i}"><title>{_esc(tip)}</title>')
        if low is not None and high is not None:
            parts.append(f'<line class="whisker" x1="{_coord(x)}" y1="{_coord(y_of(clip(low)))}" x2="{_coord(x)}" y2="{_coord(y_of(clip(high)))}" '
                         f'stroke="{ARM_COLOURS[0]}" stroke-width="1.2"/>')
            for side, v, edge in (("above", high, hi_ax), ("below", low, lo_ax)):
                if (v > edge) if side == "above" else (v < edge):  # beyond the axis: an arrowhead at the edge
                    d = -1 if side == "above" else 1
                    ye = y_of(edge)
                    clip_tip = f"{spread or 'spread'} reaches {fmt(v)}, beyond the axis"
                    parts.append(f'<path class="clipped" data-side="{side}" d="M{_coord(x - 4)},{_coord(ye - d * 7)} '
                                 f'L{_coord(x + 4)},{_coord(ye - d * 7)} L{_coord(x)},{_coord(ye)} Z" fill="{ARM_COLOURS[0]}">'
                                 f"<title>{_esc(clip_tip)}</title></path>")
        parts.append(f'<circle cx="{_coord(x)}" cy="{_coord(y_of(med))}" r="3.5" fill="{ARM_COLOURS[0]}"/></g>')
    if spread:  # say what the band and whiskers are, under the x labels (a long title keeps the top)
        ly = height - 6
        parts.append(f'<g class="legend" data-spread="{_esc(spread)}">'
                     f'<rect x="{left}" y="{_coord(ly - 9)}" width="14" height="10" fill="{ARM_COLOURS[0]}" '
                     f'fill-opacity="0.15" stroke="{ARM_COLOURS[0]}" stroke-width="0.8"/>'
                     + _text(left + 20, ly, f"band and whiskers: {spread}", size=11, fill=MUTED) + "</g>")
    # x labels: at most ~8, evenly picked, the last always shown
    step = max(1, math.ceil(n / 8))
    shown = list(range(0, n, step))
    if shown[-1] != n - 1:  # the last point always labelled, its neighbour dropped if they would touch
        shown[-1 if n - 1 - shown[-1] < step and len(shown) > 1 else len(shown):] = [n - 1]
    labels = [_date(pts[i][4].at) for i in shown]
    for cut in ((5, 16), (11, 19)):  # several points a day (manual runs): month-day and time, then seconds
        if len(set(labels)) == len(labels):
            break
        labels = [str(pts[i][4].at or "")[cut[0]:cut[1]].replace("T", " ") for i in shown]
    for i, label in zip(shown, labels):
        parts.append(_text(x_of(i), bottom + 16, label or f"#{i + 1}", anchor="middle", size=11, fill=MUTED))
    return _close(parts)


# --- thread scaling --------------------------------------------------------------------------

def scaling_chart(arms: Sequence[Mapping | ScalingSeries], *, title: str = "Speedup against threads", emulated: str | None = None,
                  left_out: Sequence[str] = (), width: int = 720, height: int = 300) -> str:
    """Speedup over each arm's fewest threads against the thread count, one series per arm:
    ``arms`` as in analysis.scaling's view (``name``, ``base_threads``, ``enough_threads``,
    ``points`` with ``threads`` and ``speedup`` {estimate, ci_low, ci_high}); a caller drawing
    several devices names the device in ``name`` and may add ``device``, ``core_mask`` and
    ``sme2`` (data-* attributes of the series). Thread counts sit at even steps (1, 2, 4, 8 apart
    alike); the dashed line is linear speedup; a ring marks where each arm's extra threads stop
    helping. The legend, under the plot, names every series on a line of its own (the chart grows
    taller with them; past eight series the colours repeat, dashed). ``emulated``: what ran them
    all; nothing speed-like is drawn. ``left_out``: lines saying what was not drawn and why (an
    emulated device beside measured ones), under the legend."""
    drawn = [(a, [p for p in a.points or [] if p.speedup is not None and _num(p.speedup.estimate)])
             for a in (ScalingSeries.from_dict(a) for a in arms)]
    drawn = [(a, pts) for a, pts in drawn if pts]
    threads = sorted({int(p.threads) for _, pts in drawn for p in pts})
    desc = f"{len(drawn)} series over thread counts {', '.join(map(str, threads)) or 'none'}; whiskers: 95% interval"
    if left_out:
        desc += "; not drawn: " + "; ".join(map(str, left_out))
    left, right, top, bottom = 64, 24, 34, height - 44
    legend_top = bottom + 52
    total = (legend_top + 18 * (len(drawn) + 1 + len(left_out)) if drawn
             else height + 18 * len(left_out))
    parts = _open(width, total, title, f"Line chart of speedup against threads. {desc}.", "scaling")

    def notes(y: float) -> None:
        for i, line in enumerate(left_out):
            parts.append(_label(12, y + 18 * i, line, width - 24, size=11, fill=MUTED, cls="left-out"))

    if emulated:
        notes(height)
        return _empty(parts, width, height, f"emulated ({_fit(emulated, 300)}): no speed figures")
    if not drawn:
        notes(height)
        return _empty(parts, width, height, "no succeeded runs to scale yet")
    base = min(int(a.base_threads or threads[0]) for a, _ in drawn)
    ideal = [t / base for t in threads]
    values = [v for _, pts in drawn for p in pts for v in (_num(p.speedup.ci_low), _num(p.speedup.ci_high))
              if v is not None]
    hi = max(values + [max(ideal)]) * 1.08
    lo = min(values + [1.0]) * 0.92
    ticks = [t for t in nice_ticks(lo, hi) if t > 0]
    lo_ax, hi_ax = min([lo] + ticks), max([hi] + ticks)
    slot = (width - left - right) / len(threads)
    step = min(4.0, slot * 0.5 / max(len(drawn) - 1, 1))  # series side by side at one thread count

    def x_of(t: int) -> float:
        return left + (threads.index(t) + 0.5) * slot

    def y_of(v: float) -> float:
        return bottom - (v - lo_ax) / (hi_ax - lo_ax) * (bottom - top)

    _y_axis(parts, ticks, y_of, left, width - right, "speedup (x)", top, bottom, fmt_tick=lambda t: f"{t:g}")
    line = " ".join(f"{_coord(x_of(t))},{_coord(y_of(v))}" for t, v in zip(threads, ideal) if lo_ax <= v <= hi_ax)
    if line.count(",") >= 2:
        parts.append(f'<polyline class="ideal" points="{line}" fill="none" stroke="{MUTED}" stroke-width="1" '
                     f'stroke-dasharray="5 4"><title>linear speedup</title></polyline>')
    for i, (arm, pts) in enumerate(drawn):
        colour = ARM_COLOURS[i % len(ARM_COLOURS)]
        dash = ("", ' stroke-dasharray="7 3"', ' stroke-dasharray="2 3"')[i // len(ARM_COLOURS) % 3]
        name = str(arm.name or f"arm {i + 1}")
        data = "".join(f' data-{key}="{_esc(value)}"' for key, value in
                       (("device", arm.device), ("core-mask", arm.core_mask), ("sme2", arm.sme2)) if value is not None)
        parts.append(f'<g class="arm" data-arm="{_esc(name)}"{data}>')
        pts = sorted(pts, key=lambda p: int(p.threads))
        path = " ".join(f"{_coord(x_of(int(p.threads)))},{_coord(y_of(p.speedup.estimate))}" for p in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for p in pts:
            t, sp = int(p.threads), p.speedup
            x = x_of(t) + (i - (len(drawn) - 1) / 2) * step
            low, high = _num(sp.ci_low), _num(sp.ci_high)
            eff = p.efficiency.estimate if p.efficiency else None
            tip = (f"{name}, {t} threads: {sp.estimate:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low and high else "")
                   + (f", efficiency {100 * eff:.0f}%" if _num(eff) is not None else "")
                   + (f", {fmt(p.median_ms)} ms" if _num(p.median_ms) is not None else ""))
            parts.append(f'<g class="point" data-threads="{t}"><title>{_esc(tip)}</title>')
            if low is not None and high is not None:
                parts.append(f'<line class="whisker" x1="{_coord(x)}" y1="{_coord(y_of(low))}" x2="{_coord(x)}" '
                             f'y2="{_coord(y_of(high))}" stroke="{colour}" stroke-width="1.4"/>')
            parts.append(f'<circle cx="{_coord(x)}" cy="{_coord(y_of(sp.estimate))}" r="3.5" fill="{colour}"/>')
            if t == arm.enough_threads and len(pts) > 1:
                parts.append(f'<circle class="enough" cx="{_coord(x)}" cy="{_coord(y_of(sp.estimate))}" r="7.5" '
                             f'fill="none" stroke="{colour}" stroke-width="1.5"/>')
            parts.append("</g>")
        parts.append("</g>")
        ly = legend_top + 18 * i
        parts.append(f'<g class="legend-entry" data-series="{_esc(name)}">')
        parts.append(f'<line x1="12" y1="{_coord(ly - 4)}" x2="32" y2="{_coord(ly - 4)}" stroke="{colour}" '
                     f'stroke-width="2"{dash}/>')
        parts.append(f'<circle cx="22" cy="{_coord(ly - 4)}" r="3.5" fill="{colour}"/>')
        parts.append(_label(40, ly, name, width - 52, size=11))
        parts.append("</g>")
    ly = legend_top + 18 * len(drawn)
    parts.append(f'<line x1="12" y1="{_coord(ly - 4)}" x2="32" y2="{_coord(ly - 4)}" stroke="{MUTED}" '
                 f'stroke-dasharray="3 2"/>')
    parts.append(_text(40, ly, "linear speedup · ring: more threads stop helping", size=11, fill=MUTED))
    notes(ly + 18)
    for t in threads:
        parts.append(_text(x_of(t), bottom + 16, str(t), anchor="middle", size=11, fill=MUTED))
    parts.append(_text(left + (width - left - right) / 2, bottom + 32, "threads", anchor="middle", size=11, fill=MUTED))
    return _close(parts)
