"""The data report's charts, written directly as SVG.

The report draws a few kinds of chart: bars by category (upright, lying, stacked or side by
side), bars over a numeric range, lines with markers and a dashed marker line, on linear,
logarithmic or whole-number axes, with a legend. Drawn through matplotlib they cost 0.8-0.9 s a
report with its import (its tick and text objects, created and measured for every axis), over
a quarter of a 4-line run after the run's imports, and they made the report an optional
extra. Written here they cost milliseconds and need nothing installed.

Text is not measured: a label's width is estimated from its length (``EM_PER_CHAR``), which is
what a chart of counts needs, and a label too long for its panel is cut at the panel's edge.
Characters that XML forbids (control characters, lone surrogates: a hostile URL's host name)
are left out of the SVG.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from collections.abc import Callable, Sequence

import numpy as np

FONT = 9.0  # points; one SVG user unit is one point
TITLE_FONT = 10.8
EM_PER_CHAR = 0.62  # an average DejaVu Sans character is about 0.55 em wide; room for wide ones
PAD = 6.0  # points around and between the parts
TICK = 3.5
FAMILY = "DejaVu Sans,Helvetica,Arial,sans-serif"
# Colours of lines that name no colour of their own, in turn (matplotlib's default cycle).
CYCLE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
         "#7f7f7f", "#bcbd22", "#17becf")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclasses.dataclass(frozen=True)
class Rect:
    """A bar, in data units."""

    x0: float
    x1: float
    y0: float
    y1: float
    color: str


@dataclasses.dataclass(frozen=True)
class Line:
    """A line through points in data units, with a marker at each."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    color: str
    dashed: bool


@dataclasses.dataclass(frozen=True)
class Key:
    """A legend entry: a box for bars, a line (with a marker unless dashed) for lines."""

    label: str
    color: str
    kind: str  # "box", "line" or "dashed"


@dataclasses.dataclass
class Panel:
    """One frame of a figure: what it shows in data units and how its axes read. Categories
    stand at 0, 1, ... along their axis; lying bars list theirs top first."""

    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    title_left: bool = False  # a title wider than the frame, beside an outside legend
    log_y: bool = False
    whole_x: bool = False  # ticks on whole numbers only: half a pack is not a count
    whole_y: bool = False
    legend: str = "upper right"  # where keys are drawn: or lower right, upper left, outside
    legend_font: float = FONT
    x_labels: list[str] | None = None
    y_labels: list[str] | None = None
    rects: list[Rect] = dataclasses.field(default_factory=list)
    lines: list[Line] = dataclasses.field(default_factory=list)
    marks: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (x, colour)
    keys: list[Key] = dataclasses.field(default_factory=list)

    def bars(self, labels: Sequence[str], values: Sequence[float], color: str, *,
             shift: float = 0.0, width: float = 0.8, key: str | None = None) -> None:
        """Upright bars, one per category; ``shift`` and ``width`` set bars side by side."""
        self.x_labels = list(labels)
        self.rects += [Rect(i + shift - width / 2, i + shift + width / 2, 0.0, float(v), color)
                       for i, v in enumerate(values)]
        self._key(key, color, "box")

    def hbars(self, labels: Sequence[str], values: Sequence[float],
              colors: str | Sequence[str], *, starts: Sequence[float] | None = None,
              key: str | None = None) -> None:
        """Lying bars, the first label on top, each from ``starts`` (stacked) or from 0."""
        self.y_labels = list(labels)
        top = len(labels) - 1
        each = [colors] * len(labels) if isinstance(colors, str) else list(colors)
        for i, value in enumerate(values):
            start = float(starts[i]) if starts is not None else 0.0
            self.rects.append(Rect(start, start + float(value), top - i - 0.4, top - i + 0.4,
                                   each[i]))
        if key is not None:
            self._key(key, each[0], "box")

    def columns(self, starts: Sequence[float], heights: Sequence[float],
                widths: float | Sequence[float], color: str) -> None:
        """Bars over a numeric x axis, each from its start to start + width."""
        spans = [widths] * len(starts) if np.ndim(widths) == 0 else widths
        self.rects += [Rect(float(s), float(s + w), 0.0, float(h), color)
                       for s, w, h in zip(starts, spans, heights, strict=True)]

    def line(self, values: Sequence[float], *, dashed: bool, key: str) -> None:
        """A line through one value per category, with markers, in the next cycle colour."""
        color = CYCLE[len(self.lines) % len(CYCLE)]
        self.lines.append(Line(tuple(float(i) for i in range(len(values))),
                               tuple(float(v) for v in values), color, dashed))
        self._key(key, color, "dashed" if dashed else "line")

    def mark(self, x: float, color: str, key: str) -> None:
        """A dashed vertical line across the frame at ``x``."""
        self.marks.append((float(x), color))
        self._key(key, color, "dashed")

    def _key(self, label: str | None, color: str, kind: str) -> None:
        if label is not None:
            self.keys.append(Key(label, color, kind))

    def empty(self) -> bool:
        """Nothing to draw: the frame and title alone (a section without data)."""
        return not (self.rects or self.lines or self.marks)


# --------------------------------------------------------------------------- axes


@dataclasses.dataclass(frozen=True)
class Axis:
    """A data range (of log10 values on a log axis) and its ticks (position, label)."""

    lo: float
    hi: float
    log: bool
    ticks: tuple[tuple[float, str], ...]
    rotated: bool = False  # category labels turned 45 degrees to fit

    def fraction(self, value: float) -> float:
        if self.log:
            value = math.log10(value) if value > 0 else self.lo - 1
        return (value - self.lo) / (self.hi - self.lo)


def _text_width(text: str, size: float = FONT) -> float:
    return len(text) * EM_PER_CHAR * size


def _exact_decimals(step: float) -> int | None:
    """The fewest decimals (up to 4) that write ``step`` and its multiples exactly."""
    return next((d for d in range(5) if abs(round(step, d) - step) <= 1e-9 * abs(step)), None)


def _number(value: float, step: float, largest: float) -> str:
    """A tick label: thousands separated; from 100,000 up in k, M or G; in significant digits
    where the step needs more than four decimals (a span of 1e-7 around 1)."""
    if value == 0:
        return "0"
    unit, suffix = next(((u, s) for u, s in ((1e9, "G"), (1e6, "M"), (1e3, "k"))
                         if largest >= 1e5 and largest >= u), (1.0, ""))
    decimals = _exact_decimals(step / unit)
    if decimals is None:
        digits = math.ceil(math.log10(max(abs(value), step) / step)) + 1
        return f"{value / unit:.{digits}g}{suffix}"
    return f"{value / unit:,.{decimals}f}{suffix}"


def _nice_step(span: float, most: int, whole: bool) -> float:
    """The smallest step of 1, 2, 2.5 or 5 times a power of ten (a whole number if ``whole``)
    that needs at most ``most`` ticks over ``span``."""
    exponent = math.floor(math.log10(span / most))
    while True:
        for factor in (1.0, 2.0, 2.5, 5.0):
            step = factor * 10.0 ** exponent
            if whole and (step < 1 or step != int(step)):
                continue
            if span / step <= most:
                return step
        exponent += 1


def category_axis(labels: Sequence[str], length: float, top_first: bool = False) -> Axis:
    """Categories at 0, 1, ... (listed top first on a lying axis); labels wider than their
    slot of ``length`` points are turned."""
    count = len(labels)
    positions = [count - 1 - i if top_first else i for i in range(count)]
    slot = length / max(count, 1)
    rotated = not top_first and any(_text_width(label) > 0.95 * slot for label in labels)
    return Axis(-0.5, count - 0.5, False, tuple(zip(positions, labels, strict=True)), rotated)


def number_axis(values: Sequence[float], length: float, *, vertical: bool, log: bool = False,
                whole: bool = False, base: bool = False) -> Axis:
    """A linear axis over ``values`` with a 5% margin at each end (none below a bars' base of
    0), or a logarithmic one from a power of ten below the least positive value to one above
    the greatest, with as many ticks as fit ``length`` points."""
    values = [v for v in values if math.isfinite(v)]
    if log:
        positive = [v for v in values if v > 0] or [1.0]
        least, greatest = math.log10(min(positive)), math.log10(max(positive))
        # down to a power of ten, and below the least value, whose bar would be empty there
        lo = min(math.floor(least), least - 0.3)
        hi = max(math.ceil(greatest + 0.02), math.floor(lo) + 1)
        first = math.ceil(lo)
        stride = math.ceil((hi - first + 1) / max(2, int(length / (2.6 * FONT))))
        ticks = tuple((float(e), _number(10.0 ** e, 10.0 ** e, 10.0 ** e))
                      for e in range(first, hi + 1, stride))
        return Axis(lo, float(hi), True, ticks)
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi == lo:
        lo, hi = (lo - 0.5, hi + 0.5) if lo else (0.0, 1.0)
    margin = 0.05 * (hi - lo)
    lo = lo if base and lo == 0 else lo - margin
    hi += margin
    largest = max(abs(lo), abs(hi))
    rough = _nice_step(hi - lo, 5, whole)  # labels of about this many characters
    wide = max(len(_number(v, rough, largest)) for v in (lo, hi)) + 2
    most = max(2, int(length / (2.6 * FONT if vertical else (wide * EM_PER_CHAR + 2) * FONT)))
    step = _nice_step(hi - lo, most, whole)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    spots = [float(f"{k * step:.12g}") for k in range(first, last + 1)]  # no float noise
    largest = max(abs(v) for v in spots) if spots else 0.0
    return Axis(lo, hi, False, tuple((v, _number(v, step, largest)) for v in spots))


def _axes(panel: Panel, width: float, height: float) -> tuple[Axis, Axis]:
    """The panel's (x, y) axes for a frame of ``width`` by ``height`` points."""
    if panel.x_labels is not None:
        x = category_axis(panel.x_labels, width)
    else:
        xs = ([v for r in panel.rects for v in (r.x0, r.x1)] + [m for m, _ in panel.marks]
              + [v for line in panel.lines for v in line.xs])
        x = number_axis(xs, width, vertical=False, whole=panel.whole_x,
                        base=bool(panel.y_labels))
    if panel.y_labels is not None:
        y = category_axis(panel.y_labels, height, top_first=True)
    else:
        ys = [v for r in panel.rects for v in (r.y0, r.y1)] + [v for ln in panel.lines
                                                              for v in ln.ys]
        y = number_axis(ys, height, vertical=True, log=panel.log_y, whole=panel.whole_y,
                        base=bool(panel.rects))
    return x, y


# --------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Frame:
    """Where a panel's frame lies in the figure, in points from the top left."""

    x0: float
    x1: float
    y0: float
    y1: float


def _legend_size(panel: Panel) -> tuple[float, float]:
    size = panel.legend_font
    widest = max(_text_width(key.label, size) for key in panel.keys)
    return widest + 24 + size, len(panel.keys) * 1.5 * size + size


def _below(x: Axis) -> float:
    """Points the x axis's tick labels take below the ticks (turned ones take more)."""
    if not x.rotated:
        return FONT * 1.25
    return max((_text_width(t) for _, t in x.ticks), default=0) * 0.71 + FONT * 0.71


def _margins(panel: Panel, x: Axis, y: Axis) -> tuple[float, float, float, float]:
    """Points each frame needs outside itself: left, right, bottom, top."""
    if panel.empty():
        x, y = Axis(0, 1, False, ()), Axis(0, 1, False, ())
    labels = 1.4 * FONT
    left = PAD + TICK + 3 + max((_text_width(t) for _, t in y.ticks), default=0)
    bottom = PAD + TICK + 3 + _below(x)
    left += labels if panel.ylabel else 0
    bottom += labels if panel.xlabel else 0
    top = PAD + (1.6 * TITLE_FONT if panel.title else 0)
    right = PAD + 6
    if panel.keys and panel.legend == "outside":
        right += _legend_size(panel)[0] + PAD
    return left, right, bottom, top


def layout(panels: Sequence[Panel], width: float, height: float) -> list[tuple[Frame, Axis,
                                                                                Axis]]:
    """Frames side by side with the same margins, each wide enough for its neighbours'
    labels, and their axes; ``width`` and ``height`` in points."""
    cell = width / len(panels)
    outside = any(p.keys and p.legend == "outside" for p in panels)
    # A label too long for the figure (a 200-character host name) is cut, not an error.
    caps = (0.4 * cell, (0.45 if outside else 0.3) * cell, 0.6 * height, 0.35 * height)
    sides = (0.0, 0.0, 0.0, 0.0)
    frames = [Frame(0.125 * cell, 0.875 * cell, 0.15 * height, 0.85 * height)] * len(panels)
    # The ticks depend on the frame and the margins on the ticks: the second pass lays out
    # the frames with the margins that the first pass's axes need, never less room than before.
    for _ in range(2):
        needed = [_margins(p, *_axes(p, frame.x1 - frame.x0, frame.y1 - frame.y0))
                  for p, frame in zip(panels, frames, strict=True)]
        sides = tuple(min(max(old, *side), cap) for old, side, cap
                      in zip(sides, zip(*needed, strict=True), caps, strict=True))
        left, right, bottom, top = sides
        frames = [Frame(i * cell + left, (i + 1) * cell - right, top, height - bottom)
                  for i in range(len(panels))]
    return [(frame, *_axes(p, frame.x1 - frame.x0, frame.y1 - frame.y0))
            for p, frame in zip(panels, frames, strict=True)]


# --------------------------------------------------------------------------- drawing


def _f(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, text: str, *, anchor: str = "middle", size: float = FONT,
          rotate: float = 0.0) -> str:
    turn = f' transform="rotate({_f(rotate)} {_f(x)} {_f(y)})"' if rotate else ""
    return (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" font-size="{_f(size)}"'
            f'{turn}>{html.escape(_NOT_XML.sub("", text))}</text>')


def _segment(x0: float, y0: float, x1: float, y1: float, color: str = "#000",
             width: float = 0.8, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="4 2.5"' if dashed else ""
    return (f'<line x1="{_f(x0)}" y1="{_f(y0)}" x2="{_f(x1)}" y2="{_f(y1)}" stroke="{color}" '
            f'stroke-width="{_f(width)}"{dash}/>')


def _draw(panel: Panel, frame: Frame, x: Axis, y: Axis, cell: Frame, clip: str) -> list[str]:
    """The panel's SVG, every part of it cut at its ``cell`` of the figure."""
    w, h = frame.x1 - frame.x0, frame.y1 - frame.y0

    def px(value: float) -> float:
        return frame.x0 + x.fraction(value) * w

    def py(value: float) -> float:
        return frame.y1 - y.fraction(value) * h

    out = [f'<clipPath id="{clip}"><rect x="{_f(frame.x0)}" y="{_f(frame.y0)}" '
           f'width="{_f(w)}" height="{_f(h)}"/></clipPath>',
           f'<clipPath id="{clip}-cell"><rect x="{_f(cell.x0)}" y="{_f(cell.y0)}" '
           f'width="{_f(cell.x1 - cell.x0)}" height="{_f(cell.y1 - cell.y0)}"/></clipPath>'
           f'<g clip-path="url(#{clip}-cell)"><g clip-path="url(#{clip})">']
    for r in panel.rects:
        if not all(map(math.isfinite, (r.x0, r.x1, r.y0, r.y1))):
            continue
        left, right = sorted((px(r.x0), px(r.x1)))
        upper, lower = sorted((py(r.y1), py(r.y0)))
        out.append(f'<rect x="{_f(left)}" y="{_f(upper)}" width="{_f(right - left)}" '
                   f'height="{_f(lower - upper)}" fill="{r.color}"/>')
    for line in panel.lines:
        points = " ".join(f"{_f(px(a))},{_f(py(b))}" for a, b in zip(line.xs, line.ys,
                                                                      strict=True))
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        out.append(f'<polyline points="{points}" fill="none" stroke="{line.color}" '
                   f'stroke-width="1.5"{dash}/>')
        out += [f'<circle cx="{_f(px(a))}" cy="{_f(py(b))}" r="2.5" fill="{line.color}"/>'
                for a, b in zip(line.xs, line.ys, strict=True)]
    for at, color in panel.marks:
        out.append(_segment(px(at), frame.y0, px(at), frame.y1, color, 1.5, dashed=True))
    out.append("</g>")
    out.append(_segment(frame.x0, frame.y1, frame.x1, frame.y1))  # the frame's left and
    out.append(_segment(frame.x0, frame.y0, frame.x0, frame.y1))  # bottom sides only
    if not panel.empty():
        out += _ticks(x, y, px, py, frame)
    if panel.title:
        anchor, at = ("start", frame.x0) if panel.title_left else ("middle", frame.x0 + w / 2)
        out.append(_text(at, frame.y0 - 0.6 * TITLE_FONT, panel.title, anchor=anchor,
                         size=TITLE_FONT))
    if panel.xlabel:
        at = min(frame.y1 + TICK + 3 + _below(x) + 1.2 * FONT, cell.y1 - 0.35 * FONT)
        out.append(_text(frame.x0 + w / 2, at, panel.xlabel))
    if panel.ylabel:
        widest = max((_text_width(t) for _, t in y.ticks), default=0)
        at = max(frame.x0 - TICK - 3 - widest - 0.5 * FONT, cell.x0 + FONT)
        out.append(_text(at, frame.y0 + h / 2, panel.ylabel, rotate=-90))
    if panel.keys:
        out += _legend(panel, frame)
    out.append("</g>")
    return out


def _ticks(x: Axis, y: Axis, px: Callable[[float], float], py: Callable[[float], float],
           frame: Frame) -> list[str]:
    out = []
    for at, label in x.ticks:
        where = px(at)
        out.append(_segment(where, frame.y1, where, frame.y1 + TICK))
        if not label:
            continue
        if x.rotated:
            top = frame.y1 + TICK + 2 + 0.6 * FONT
            out.append(_text(where + 0.3 * FONT, top, label, anchor="end", rotate=-45))
        else:
            out.append(_text(where, frame.y1 + TICK + 2 + 0.85 * FONT, label))
    for at, label in y.ticks:
        where = py(10.0 ** at if y.log else at)
        out.append(_segment(frame.x0 - TICK, where, frame.x0, where))
        out.append(_text(frame.x0 - TICK - 2, where + 0.35 * FONT, label, anchor="end"))
    return out


def _legend(panel: Panel, frame: Frame) -> list[str]:
    size = panel.legend_font
    width, height = _legend_size(panel)
    left = {"upper left": frame.x0 + 4, "outside": frame.x1 + PAD}.get(
        panel.legend, frame.x1 - width - 4)
    top = frame.y1 - height - 4 if panel.legend == "lower right" else frame.y0 + 4
    out = [f'<rect x="{_f(left)}" y="{_f(top)}" width="{_f(width)}" height="{_f(height)}" '
           'fill="#fff" fill-opacity="0.85" stroke="#ccc" stroke-width="0.8" rx="2"/>']
    for i, key in enumerate(panel.keys):
        middle = top + size * (1.25 + 1.5 * i)
        if key.kind == "box":
            out.append(f'<rect x="{_f(left + 5)}" y="{_f(middle - 0.35 * size)}" width="14" '
                       f'height="{_f(0.7 * size)}" fill="{key.color}"/>')
        else:
            out.append(_segment(left + 5, middle, left + 19, middle, key.color, 1.5,
                                dashed=key.kind == "dashed"))
            if key.kind == "line":
                out.append(f'<circle cx="{_f(left + 12)}" cy="{_f(middle)}" r="2.5" '
                           f'fill="{key.color}"/>')
        out.append(_text(left + 24, middle + 0.35 * size, key.label, anchor="start",
                         size=size))
    return out


def figure(panels: Sequence[Panel], width: float, height: float) -> str:
    """The SVG of ``panels`` side by side in a figure of ``width`` by ``height`` inches."""
    w, h = width * 72, height * 72
    body = []
    cell = w / len(panels)
    for i, (frame, x, y) in enumerate(layout(panels, w, h)):
        body += _draw(panels[i], frame, x, y, Frame(i * cell, (i + 1) * cell, 0, h), f"frame{i}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(w)}pt" height="{_f(h)}pt" '
            f'viewBox="0 0 {_f(w)} {_f(h)}" font-family="{FAMILY}" fill="#222">'
            f'<rect width="100%" height="100%" fill="#fff"/>{"".join(body)}</svg>')
