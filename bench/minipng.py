"""minipng.py — line charts as PNG files with the standard library only
(zlib + struct), for bench/report.py on machines without matplotlib.

    line_chart(path, title, xlabel, ylabel, series, xlog=False, ylog=False)
    series: [(label, [(x, y), ...]), ...]

Axes with ticks (decades on log axes), a legend, a 5x7 bitmap font (upper
case; lower case is drawn as upper case).  Good enough to read a trend, not
a typesetting engine.
"""
import math
import struct
import zlib

# 5x7 glyphs, rows top to bottom, '#' = ink.
_FONT_SRC = {
    '0': ".###.#...##..###.#.###..##...#.###.", '1': "..#...##....#....#....#....#...###.", '2': ".###.#...#....#...#...#...#...#####",
    '3': "#####...#...#.....#.....##...#.###.", '4': "...#...##..#.#.#..#.#####...#....#.", '5': "######....####.....#....##...#.###.",
    '6': "..##..#...#....####.#...##...#.###.", '7': "#####....#...#...#...#....#....#...", '8': ".###.#...##...#.###.#...##...#.###.",
    '9': ".###.#...##...#.####....#...#..##..", 'A': ".###.#...##...#######...##...##...#", 'B': "####.#...##...#####.#...##...#####.",
    'C': ".###.#...##....#....#....#...#.###.", 'D': "###..#..#.#...##...##...##..#.###..", 'E': "######....#....####.#....#....#####",
    'F': "######....#....####.#....#....#....", 'G': ".###.#...##....#.####...##...#.####", 'H': "#...##...##...#######...##...##...#",
    'I': ".###...#....#....#....#....#...###.", 'J': "..###...#....#....#....#.#..#..##..", 'K': "#...##..#.#.#..##...#.#..#..#.#...#",
    'L': "#....#....#....#....#....#....#####", 'M': "#...###.###.#.##.#.##...##...##...#", 'N': "#...##...###..##.#.##..###...##...#",
    'O': ".###.#...##...##...##...##...#.###.", 'P': "####.#...##...#####.#....#....#....", 'Q': ".###.#...##...##...##.#.##..#..##.#",
    'R': "####.#...##...#####.#.#..#..#.#...#", 'S': ".#####....#.....###.....#....#####.", 'T': "#####..#....#....#....#....#....#..",
    'U': "#...##...##...##...##...##...#.###.", 'V': "#...##...##...##...##...#.#.#...#..", 'W': "#...##...##...##.#.##.#.##.#.#.#.#.",
    'X': "#...##...#.#.#...#...#.#.#...##...#", 'Y': "#...##...#.#.#...#....#....#....#..", 'Z': "#####....#...#...#...#...#....#####",
    ' ': "...................................", '.': "..........................##...##..", ',': ".....................##....#...#...",
    '-': "...............#####...............", '+': ".......#....#..#####..#....#.......", '/': "....#....#...#...#...#...#....#....",
    '(': "...#...#...#....#....#.....#.....#.", ')': ".#.....#.....#....#....#...#...#...", ':': "......##...##........##...##.......",
    '%': "##...##..#...#...#...#...#..##...##", '_': "..............................#####", '=': "..........#####.....#####..........",
    '[': ".###..#....#....#....#....#....###.", ']': ".###....#....#....#....#....#..###.", '<': "...#...#...#...#.....#.....#.....#.",
    '>': ".#.....#.....#.....#...#...#...#...", '*': ".......#..#.#.#.###.#.#.#..#.......", "'": "..#....#...........................",
    '#': ".#.#..#.#.#####.#.#.#####.#.#..#.#.", '?': ".###.#...#....#...#...#.........#..",
}
_FONT = {}
for _ch, _bits in _FONT_SRC.items():
    _bits = (_bits + "." * 35)[:35]
    _FONT[_ch] = [[_bits[r * 5 + c] == "#" for c in range(5)] for r in range(7)]

PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (0, 0, 0), (120, 60, 200)]


class Canvas:
    def __init__(self, w, h, bg=(255, 255, 255)):
        self.w, self.h = w, h
        self.px = [bytearray(bg * w) for _ in range(h)]

    def set(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            row = self.px[y]
            row[3 * x:3 * x + 3] = bytes(c)

    def rect(self, x0, y0, x1, y1, c, fill=True):
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            if fill or y in (y0, y1):
                for x in range(max(0, x0), min(self.w, x1 + 1)):
                    self.set(x, y, c)
            else:
                self.set(x0, y, c)
                self.set(x1, y, c)

    def line(self, x0, y0, x1, y1, c, width=1):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        r = width // 2
        while True:
            for ox in range(-r, width - r):
                for oy in range(-r, width - r):
                    self.set(x0 + ox, y0 + oy, c)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, c=(0, 0, 0), scale=1):
        for ch in s:
            g = _FONT.get(ch) or _FONT.get(ch.upper()) or _FONT["?"]
            for r in range(7):
                for col in range(5):
                    if g[r][col]:
                        for a in range(scale):
                            for b in range(scale):
                                self.set(x + col * scale + a, y + r * scale + b, c)
            x += 6 * scale

    def vtext(self, x, y, s, c=(0, 0, 0)):
        """Text rotated 90 degrees (reading bottom to top), starting at (x, y) going up."""
        for ch in s:
            g = _FONT.get(ch) or _FONT.get(ch.upper()) or _FONT["?"]
            for r in range(7):
                for col in range(5):
                    if g[r][col]:
                        self.set(x + r, y - col, c)
            y -= 6

    def png(self):
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)

        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s, scale=1):
    return 6 * scale * len(s)


def _ticks(lo, hi, log):
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [10.0 ** k for k in range(a, b + 1)]
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / 5))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= 6:
            step *= m
            break
    start = math.floor(lo / step) * step
    out, v = [], start
    while v <= hi + step * 0.5:
        out.append(v)
        v += step
    return out


def _label(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e6 and abs(math.log10(abs(v)) - round(math.log10(abs(v)))) < 1e-9:
        return f"1E{int(round(math.log10(abs(v))))}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def line_chart(path, title, xlabel, ylabel, series, xlog=False, ylog=False, width=960, height=600):
    pts = [(x, y) for _, s in series for x, y in s if y is not None and x is not None
           and (not xlog or x > 0) and (not ylog or y > 0)]
    c = Canvas(width, height)
    c.text(60, 12, title[:140], scale=2 if text_width(title, 2) < width - 80 else 1)
    if not pts:
        c.text(60, height // 2, "NO DATA")
        with open(path, "wb") as f:
            f.write(c.png())
        return path
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    xlo, xhi, ylo, yhi = min(xs), max(xs), min(ys), max(ys)
    if xlo == xhi:
        xlo, xhi = (xlo / 2, xhi * 2) if xlog else (xlo - 1, xhi + 1)
    if ylo == yhi:
        ylo, yhi = (ylo / 2, yhi * 2) if ylog else (ylo - 1, yhi + 1)
    if ylog:
        ylo, yhi = 10 ** math.floor(math.log10(ylo)), 10 ** math.ceil(math.log10(yhi))
    else:
        ylo = min(0.0, ylo)
        yhi = yhi * 1.08
    if xlog:  # a little room beyond the data, ticks at the data's x values (below)
        xlo, xhi = xlo / 1.15, xhi * 1.15
    else:
        pad = 0.03 * (xhi - xlo)
        xlo, xhi = xlo - pad, xhi + pad
    legend_w = max(text_width(lbl) for lbl, _ in series) + 40
    left, top, right, bottom = 90, 50, width - legend_w - 20, height - 60

    def tx(x):
        if xlog:
            return left + (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo)) * (right - left)
        return left + (x - xlo) / (xhi - xlo) * (right - left)

    def ty(y):
        if ylog:
            return bottom - (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) * (bottom - top)
        return bottom - (y - ylo) / (yhi - ylo) * (bottom - top)

    grid, axis = (225, 225, 225), (0, 0, 0)
    xt = sorted(set(xs)) if len(set(xs)) <= 12 else [v for v in _ticks(xlo, xhi, xlog) if xlo <= v <= xhi]
    for v in xt:
        X = int(tx(v))
        c.line(X, top, X, bottom, grid)
        lbl = _label(v)
        c.text(X - text_width(lbl) // 2, bottom + 8, lbl)
    for v in [v for v in _ticks(ylo, yhi, ylog) if ylo <= v <= yhi]:
        Y = int(ty(v))
        c.line(left, Y, right, Y, grid)
        lbl = _label(v)
        c.text(left - 8 - text_width(lbl), Y - 3, lbl)
    c.line(left, top, left, bottom, axis)
    c.line(left, bottom, right, bottom, axis)
    c.text((left + right) // 2 - text_width(xlabel) // 2, height - 28, xlabel)
    c.vtext(20, (top + bottom) // 2 + text_width(ylabel) // 2, ylabel)
    for i, (lbl, s) in enumerate(series):
        col = PALETTE[i % len(PALETTE)]
        good = sorted((x, y) for x, y in s if y is not None and (not xlog or x > 0) and (not ylog or y > 0))
        for (x0, y0), (x1, y1) in zip(good, good[1:]):
            c.line(tx(x0), ty(y0), tx(x1), ty(y1), col, width=2)
        for x, y in good:
            c.rect(int(tx(x)) - 3, int(ty(y)) - 3, int(tx(x)) + 3, int(ty(y)) + 3, col)
        ly = top + 6 + 16 * i
        c.line(right + 20, ly + 3, right + 40, ly + 3, col, width=3)
        c.text(right + 46, ly, lbl)
    with open(path, "wb") as f:
        f.write(c.png())
    return path
