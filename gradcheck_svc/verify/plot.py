"""Line plots as SVG (written by hand, no dependency) or PNG (through matplotlib, if installed),
optionally with a panel of horizontal bars below.

Used for the memory timeline (`--memory-plot`, with the activation bytes per node as bars) and
the benchmarks' log-log plots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from gradcheck_core.outputs.xml import escape as xml_escape

from ..errors import OptionError

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 860, 480
LEFT, RIGHT, TOP, BOTTOM = 90, 190, 40, 60


def escape(text: str) -> str:
    """Text for SVG: the XML escape every XML writer uses (cut, controls escaped, markup escaped)."""
    return xml_escape(text, 200)


@dataclass
class Series:
    label: str
    x: list
    y: list
    marks: list = field(default_factory=list)  # x positions drawn as dotted verticals (e.g. backward starts)
    dashed: bool = False


@dataclass
class Bar:
    label: str
    value: float


MAX_BARS = 20  # the largest, then one line saying how many more
BAR_ROW = 18


def _bars_shown(bars: list[Bar]) -> tuple[list[Bar], int]:
    shown = sorted(bars, key=lambda b: -b.value)[:MAX_BARS]
    return shown, len(bars) - len(shown)


def _axis(lo: float, hi: float, log: bool) -> tuple[float, float, list[float]]:
    """(low end, high end, ticks): log axes span the data with a margin, ticked at 1, 2, 5 x 10^k;
    linear axes end on round ticks."""
    if log:
        lo, hi = lo / 1.15, hi * 1.15
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
        return lo, hi, ticks
    if hi <= lo:
        return lo - 1, hi + 1, [lo]
    raw = (hi - lo) / 6
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if raw <= m * step)
    ticks = [k * step for k in range(math.floor(lo / step), math.ceil(hi / step) + 1)]
    return ticks[0], ticks[-1], ticks


def _fmt(v: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{unit}"
    return f"{v:g}"


def line_plot(path, series: list[Series], *, title: str, xlabel: str, ylabel: str,
              logx: bool = False, logy: bool = False, bars: list[Bar] = (), bars_title: str = "") -> None:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        _png(path, series, title, xlabel, ylabel, logx, logy, list(bars), bars_title)
    elif suffix == ".svg":
        path.write_text(svg(series, title=title, xlabel=xlabel, ylabel=ylabel, logx=logx, logy=logy,
                            bars=list(bars), bars_title=bars_title))
    else:
        raise OptionError(f"'{path}': the plot file must end in .svg or .png", field="memory-plot")


def svg(series: list[Series], *, title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False,
        bars: list[Bar] = (), bars_title: str = "") -> str:
    pts = [(x, y) for s in series for x, y in zip(s.x, s.y) if (not logx or x > 0) and (not logy or y > 0)]
    if not pts:
        pts = [(1, 1)]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, xt = _axis(min(xs), max(xs), logx)
    y0, y1, yt = _axis(0 if not logy else min(ys), max(ys), logy)
    f = (lambda v: math.log10(v)) if logx else (lambda v: v)
    g = (lambda v: math.log10(v)) if logy else (lambda v: v)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    X = lambda v: LEFT + pw * (f(v) - f(x0)) / ((f(x1) - f(x0)) or 1)  # noqa: E731
    Y = lambda v: TOP + ph * (1 - (g(v) - g(y0)) / ((g(y1) - g(y0)) or 1))  # noqa: E731
    shown, more = _bars_shown(list(bars))
    total_h = H + (40 + BAR_ROW * (len(shown) + (1 if more else 0)) if shown else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{total_h}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for t in xt:
        out.append(f'<line x1="{X(t):.1f}" y1="{TOP}" x2="{X(t):.1f}" y2="{TOP + ph}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{X(t):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{_fmt(t)}</text>')
    for t in yt:
        out.append(f'<line x1="{LEFT}" y1="{Y(t):.1f}" x2="{LEFT + pw}" y2="{Y(t):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 18}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(20 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    for k, s in enumerate(series):
        color = COLORS[k % len(COLORS)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        line = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in zip(s.x, s.y)
                        if (not logx or x > 0) and (not logy or y > 0))
        out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>')
        for m in s.marks:
            out.append(f'<line x1="{X(m):.1f}" y1="{TOP}" x2="{X(m):.1f}" y2="{TOP + ph}" stroke="{color}" '
                       'stroke-dasharray="2 3"/>')
        ly = TOP + 16 + 20 * k
        out.append(f'<line x1="{LEFT + pw + 12}" y1="{ly - 4}" x2="{LEFT + pw + 36}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{LEFT + pw + 42}" y="{ly}">{escape(s.label)}</text>')
    if shown:
        top = max(b.value for b in shown) or 1
        y = H + 10
        out.append(f'<text x="{W / 2}" y="{y}" text-anchor="middle" font-size="14">{escape(bars_title)}</text>')
        for k, b in enumerate(shown):
            by = y + 14 + BAR_ROW * k
            width = (W - 2 * LEFT - 120) * b.value / top
            out.append(f'<g class="bar"><text x="{2 * LEFT - 6}" y="{by + 11}" text-anchor="end">'
                       f'{escape(b.label)}</text><rect x="{2 * LEFT}" y="{by}" width="{width:.1f}" height="13" '
                       f'fill="{COLORS[0]}"/><text x="{2 * LEFT + width + 6:.1f}" y="{by + 11}">{b.value:g} B'
                       '</text></g>')
        if more:
            out.append(f'<text x="{2 * LEFT}" y="{y + 25 + BAR_ROW * len(shown)}">... {more} more</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _png(path, series, title, xlabel, ylabel, logx, logy, bars=(), bars_title="") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptionError(f"'{path}': PNG plots need matplotlib (pip install matplotlib); "
                          "or write an .svg", field="memory-plot") from None
    shown, more = _bars_shown(list(bars))
    if shown:
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(W / 100, (H + 40 + BAR_ROW * len(shown)) / 100), dpi=100,
                                     height_ratios=[H, 40 + BAR_ROW * len(shown)])
        bx.barh([b.label for b in shown][::-1], [b.value for b in shown][::-1], color=COLORS[0])
        bx.set(title=bars_title + (f" (... {more} more)" if more else ""), xlabel="bytes")
    else:
        fig, ax = plt.subplots(figsize=(W / 100, H / 100), dpi=100)
    for k, s in enumerate(series):
        color = COLORS[k % len(COLORS)]
        ax.plot(s.x, s.y, label=s.label, color=color, linestyle="--" if s.dashed else "-")
        for m in s.marks:
            ax.axvline(m, color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(loc="upper left", fontsize=8)  # inside: a long legend beside the axes squeezes them
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
