"""A line chart as a PNG, drawn here: an RGB canvas, lines and points, axes with short tick lines and numbers in a
3x5 pixel font, written with zlib and struct (PNG's signature, IHDR, one IDAT, IEND). No plotting library: the
depth sweep of `specpair bench` is its one use.

    png = line_chart(["0", "512", "1k"], [((31, 119, 180), [210.0, 205.5, 199.1]), ...],
                     title="decode tok/s by depth", x_label="depth", y_label="tok/s", names=["undrafted", ...])

Categories sit evenly along x (the labels under them); y is linear from 0 to a round number above every value.
A value of None leaves a gap in its line. The title sits above the plot, centred; the y axis's label and the
legend (a swatch of each series' colour, then its name) in the band below it; the x axis's label under the
tick labels. Text is drawn in capitals.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

RGB = tuple[int, int, int]
WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 56, 62  # margins around the plotting area
TITLE_Y, LEGEND_Y = 8, 32  # tops of the title's row and of the legend's (and the y label's) row
SWATCH = 10  # side of a legend swatch
SCALE = 2  # font pixels per glyph dot
BLACK, GREY, WHITE = (0, 0, 0), (200, 200, 200), (255, 255, 255)
GLYPHS = {  # 3 columns x 5 rows, a row per string, left to right
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "001", "001", "001"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    "k": ("100", "101", "110", "101", "101"),
    ".": ("000", "000", "000", "000", "010"),
    "a": ("010", "101", "111", "101", "101"),
    "b": ("110", "101", "110", "101", "110"),
    "c": ("011", "100", "100", "100", "011"),
    "d": ("110", "101", "101", "101", "110"),
    "e": ("111", "100", "110", "100", "111"),
    "f": ("111", "100", "110", "100", "100"),
    "g": ("011", "100", "101", "101", "011"),
    "h": ("101", "101", "111", "101", "101"),
    "i": ("111", "010", "010", "010", "111"),
    "j": ("001", "001", "001", "101", "010"),
    "l": ("100", "100", "100", "100", "111"),
    "m": ("101", "111", "111", "101", "101"),
    "n": ("110", "101", "101", "101", "101"),
    "o": ("010", "101", "101", "101", "010"),
    "p": ("110", "101", "110", "100", "100"),
    "q": ("010", "101", "101", "110", "011"),
    "r": ("110", "101", "110", "101", "101"),
    "s": ("011", "100", "010", "001", "110"),
    "t": ("111", "010", "010", "010", "010"),
    "u": ("101", "101", "101", "101", "111"),
    "v": ("101", "101", "101", "101", "010"),
    "w": ("101", "101", "111", "111", "101"),
    "x": ("101", "101", "010", "101", "101"),
    "y": ("101", "101", "010", "010", "010"),
    "z": ("111", "001", "010", "100", "111"),
    " ": ("000", "000", "000", "000", "000"),
    "/": ("001", "001", "010", "100", "100"),
    "(": ("010", "100", "100", "100", "010"),
    ")": ("010", "001", "001", "001", "010"),
    ":": ("000", "010", "000", "010", "000"),
    "-": ("000", "000", "111", "000", "000"),
    ",": ("000", "000", "000", "010", "100"),
}


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def dot(self, x: int, y: int, color: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            at = 3 * (y * self.width + x)
            self.pixels[at : at + 3] = bytes(color)

    def box(self, x: int, y: int, half: int, color: RGB) -> None:
        for dy in range(-half, half + 1):
            for dx in range(-half, half + 1):
                self.dot(x + dx, y + dy, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: RGB, thick: int = 0) -> None:
        """Bresenham's line, each point a square of side 2·thick + 1."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        while True:
            self.box(x0, y0, thick, color)
            if x0 == x1 and y0 == y1:
                return
            twice = 2 * error
            if twice >= dy:
                error, x0 = error + dy, x0 + sx
            if twice <= dx:
                error, y0 = error + dx, y0 + sy

    def text(self, x: int, y: int, text: str, color: RGB = BLACK) -> None:
        """`text` with its top-left corner at (x, y), letters as capitals; characters without a glyph are left out."""
        for i, char in enumerate(c for c in text.lower() if c in GLYPHS):
            for row, bits in enumerate(GLYPHS[char]):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        for dy in range(SCALE):
                            for dx in range(SCALE):
                                self.dot(x + (4 * i + col) * SCALE + dx, y + row * SCALE + dy, color)

    def png(self) -> bytes:
        rows = b"".join(
            b"\x00" + bytes(self.pixels[3 * y * self.width : 3 * (y + 1) * self.width]) for y in range(self.height)
        )  # filter type 0 on every scanline
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(rows, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def text_width(text: str) -> int:
    return max(0, 4 * sum(c in GLYPHS for c in text.lower()) - 1) * SCALE


def nice_step(top: float, ticks: int = 5) -> float:
    """A step of 1, 2 or 5 times a power of ten that cuts [0, top] into about `ticks` parts."""
    raw = top / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def line_chart(
    labels: Sequence[str],
    series: Sequence[tuple[RGB, Sequence[float | None]]],
    *,
    title: str = "",
    x_label: str = "",
    y_label: str = "",
    names: Sequence[str] = (),
) -> bytes:
    """The chart as PNG bytes; `names` label the series in the legend, in order."""
    canvas = Canvas(WIDTH, HEIGHT)
    values = [v for _, vs in series for v in vs if v is not None]
    top = max(values, default=0.0) or 1.0
    step = nice_step(top)
    top = step * math.ceil(top / step)
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP

    def x_of(i: int) -> int:
        return x0 + round((i + 0.5) * (x1 - x0) / len(labels))

    def y_of(v: float) -> int:
        return y0 - round(v / top * (y0 - y1))

    for k in range(round(top / step) + 1):  # grid, ticks and numbers on the y axis
        y = y_of(k * step)
        canvas.line(x0 + 1, y, x1, y, GREY)
        canvas.line(x0 - 6, y, x0, y, BLACK)
        label = number(k * step)
        canvas.text(x0 - 10 - text_width(label), y - 5 * SCALE // 2, label)
    for i, label in enumerate(labels):  # ticks and labels on the x axis
        canvas.line(x_of(i), y0, x_of(i), y0 + 6, BLACK)
        canvas.text(x_of(i) - text_width(label) // 2, y0 + 12, label)
    canvas.line(x0, y0, x1, y0, BLACK)
    canvas.line(x0, y0, x0, y1, BLACK)
    canvas.text((WIDTH - text_width(title)) // 2, TITLE_Y, title)
    canvas.text(x0 + (x1 - x0 - text_width(x_label)) // 2, y0 + 12 + 5 * SCALE + 12, x_label)
    canvas.text(LEFT - 10 - text_width(y_label), LEGEND_Y, y_label)
    legend(canvas, [(color, name) for (color, _), name in zip(series, names)])
    for color, vs in series:
        points = [(x_of(i), y_of(v)) if v is not None else None for i, v in enumerate(vs)]
        for a, b in zip(points, points[1:]):
            if a and b:
                canvas.line(*a, *b, color, thick=1)
        for p in points:
            if p:
                canvas.box(*p, 3, color)
    return canvas.png()


def legend(canvas: Canvas, entries: Sequence[tuple[RGB, str]]) -> None:
    """A swatch of each colour and its name, in a row ending at the plot's right edge."""
    gap = 2 * SWATCH
    width = sum(SWATCH + 6 + text_width(name) for _, name in entries) + gap * max(0, len(entries) - 1)
    x = WIDTH - RIGHT - width
    for color, name in entries:
        for dy in range(SWATCH):
            canvas.line(x, LEGEND_Y + dy, x + SWATCH - 1, LEGEND_Y + dy, color)
        canvas.text(x + SWATCH + 6, LEGEND_Y, name)
        x += SWATCH + 6 + text_width(name) + gap
