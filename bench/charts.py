"""Renders bench/RESULTS.md's recorded results as figures (SVG, in bench/charts/).

    python3 bench/charts.py          # writes bench/charts/*.svg
    python3 bench/charts.py --check  # exit 1 if a committed figure differs
                                     # from what the recorded results give

Each figure names the results it is drawn from (CHARTS below); to draw a
newer run, point its entry at the new directory and run this again. The
Python standard library only, so that it runs wherever the results are.
Every point carries a <title> with its value (a tooltip in a browser).
"""

import glob
import json
import math
import os
import sys
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
OUT = os.path.join(HERE, "charts")

COLORS = {"precompile-serve": "#1f77b4", "precompile-serve, batching": "#1f77b4",
          "gRPC echo (the floor)": "#7f7f7f", "Python peer": "#d62728",
          "in process (no RPC)": "#2ca02c", "precompile-serve, no batching": "#ff7f0e"}


def median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def load_rounds(pattern):
    """precompile_load's JSON outputs matching `pattern` (rounds of one
    phase list): {concurrency: (median req/s, median p99 ms)}."""
    by_c = {}
    paths = sorted(glob.glob(os.path.join(RESULTS, pattern)))
    if not paths:
        raise SystemExit(f"charts: no results match {pattern}")
    for path in paths:
        with open(path) as f:
            for phase in json.load(f)["phases"]:
                by_c.setdefault(phase["concurrency"], []).append(phase)
    return {c: (median([p["throughput_rps"] for p in ps]),
                median([p["latency_ms"]["p99"] for p in ps])) for c, ps in sorted(by_c.items())}


# --- drawing ---------------------------------------------------------------

PANEL_W, PANEL_H = 380, 250
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 44, 48


def fmt(v):
    if v >= 1000:
        return f"{v:,.0f}".replace(",", " ")
    if v >= 10:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2g}" if v == int(v) else f"{v:.1f}"
    return f"{v:.2g}"


def value_text(v):
    """A point's value: whole above 1000, else three significant digits."""
    return fmt(v) if v >= 1000 else f"{v:.3g}"


def log_ticks(lo, hi):
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks


class Svg:
    def __init__(self, width, height, title):
        self.width, self.height = width, height
        self.parts = [f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" '
                      f'font-size="15" font-weight="bold">{escape(title)}</text>']

    def add(self, text):
        self.parts.append(text)

    def text(self):
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                'font-family="sans-serif" font-size="11">\n'
                f'<rect width="{self.width}" height="{self.height}" fill="white"/>\n'
                + "\n".join(self.parts) + "\n</svg>\n")


def line_panel(svg, x0, title, x_label, y_label, series, unit):
    """One panel: `series` is [(name, {x: y})], x on a log-2 axis of the
    x values present, y on a log-10 axis."""
    xs = sorted({x for _, points in series for x in points})
    ys = [y for _, points in series for y in points.values()]
    y_lo, y_hi = min(ys) / 1.5, max(ys) * 1.5
    w, h = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    top = 30

    def px(x):
        if len(xs) == 1:
            return x0 + LEFT + w / 2
        return x0 + LEFT + w * (math.log2(x) - math.log2(xs[0])) / (math.log2(xs[-1]) - math.log2(xs[0]))

    def py(y):
        return top + TOP + h * (1 - (math.log10(y) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)))

    svg.add(f'<text x="{x0 + LEFT + w / 2:.1f}" y="{top + 28}" text-anchor="middle" '
            f'font-size="13">{escape(title)}</text>')
    svg.add(f'<rect x="{x0 + LEFT}" y="{top + TOP}" width="{w}" height="{h}" fill="none" '
            'stroke="#444"/>')
    for t in log_ticks(y_lo, y_hi):
        svg.add(f'<line x1="{x0 + LEFT}" x2="{x0 + LEFT + w}" y1="{py(t):.1f}" y2="{py(t):.1f}" '
                'stroke="#ddd"/>')
        svg.add(f'<text x="{x0 + LEFT - 4}" y="{py(t) + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for x in xs:
        svg.add(f'<text x="{px(x):.1f}" y="{top + TOP + h + 15}" text-anchor="middle">{x}</text>')
    svg.add(f'<text x="{x0 + LEFT + w / 2:.1f}" y="{top + TOP + h + 32}" '
            f'text-anchor="middle">{escape(x_label)}</text>')
    svg.add(f'<text transform="translate({x0 + 14},{top + TOP + h / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_label)}</text>')
    for name, points in series:
        color = COLORS[name]
        dash = ' stroke-dasharray="5,3"' if name in ("gRPC echo (the floor)",
                                                     "precompile-serve, no batching") else ""
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(points.items()))
        svg.add(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in sorted(points.items()):
            svg.add(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}">'
                    f'<title>{escape(name)}, {x} clients: {value_text(y)} {unit}</title></circle>')


def legend(svg, y, names):
    x = 70
    for name in names:
        svg.add(f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{COLORS[name]}" '
                'stroke-width="3"/>')
        svg.add(f'<text x="{x + 22}" y="{y + 4}">{escape(name)}</text>')
        x += 34 + 6.2 * len(name)


def two_panels(title, note, series_rps, series_p99):
    svg = Svg(2 * PANEL_W, PANEL_H + 60, title)
    line_panel(svg, 0, "throughput", "concurrent clients", "requests / s (log)", series_rps, "req/s")
    line_panel(svg, PANEL_W, "p99 latency", "concurrent clients", "ms (log)", series_p99, "ms")
    legend(svg, PANEL_H + 40, [name for name, _ in series_rps])
    svg.add(f'<text x="{PANEL_W}" y="{PANEL_H + 56}" text-anchor="middle" fill="#555">'
            f'{escape(note)}</text>')
    return svg.text()


# --- the figures -----------------------------------------------------------

def end_to_end(source, model):
    with open(os.path.join(RESULTS, source)) as f:
        runs = json.load(f)[model]
    by_c = {int(c): run for c, run in runs.items()}
    peers = [("precompile-serve", "ours"), ("gRPC echo (the floor)", "echo"),
             ("Python peer", "python")]
    rps = [(name, {c: r[key]["rps"] for c, r in by_c.items()}) for name, key in peers]
    rps.append(("in process (no RPC)", {c: r["in_process"]["cps"] for c, r in by_c.items()}))
    p99 = [(name, {c: r[key]["p99_ms"] for c, r in by_c.items()}) for name, key in peers]
    what = "examples' mlp, FP32 [8,4]" if model == "small" else "the medium MLP"
    return two_panels(f"End to end: {what} over gRPC, one server core (bench/e2e.sh)",
                      f"results/{source}", rps, p99)


def batching(directory, model):
    off = load_rounds(os.path.join(directory, f"{model}_r*.json"))
    on = load_rounds(os.path.join(directory, f"{model}_batched_r*.json"))
    rps = [("precompile-serve, no batching", {c: v[0] for c, v in off.items()}),
           ("precompile-serve, batching", {c: v[0] for c, v in on.items()})]
    p99 = [("precompile-serve, no batching", {c: v[1] for c, v in off.items()}),
           ("precompile-serve, batching", {c: v[1] for c, v in on.items()})]
    return two_panels(f"Dynamic batching off and on: the gallery's {model}, one server core "
                      "(bench/batching.sh)", f"results/{directory}/", rps, p99)


def eager_costs(directory):
    kinds = [("variant hit", "cost_variant"), ("TorchScript eager miss", "cost_torchscript"),
             ("Python eager miss", "cost_python")]
    bars = []
    for name, stem in kinds:
        with open(os.path.join(RESULTS, directory, f"{stem}.json")) as f:
            phase = json.load(f)["phases"][0]
        bars.append((name, phase["latency_ms"]["p50"], phase["latency_ms"]["p99"]))
    top, left, bar_h, gap = 44, 190, 22, 26
    width, height = 2 * PANEL_W, top + len(bars) * (2 * bar_h + gap) + 20
    svg = Svg(width, height, "One request at a time: a hit and two kinds of eager miss "
                             "(bench/python_eager_mix.sh)")
    scale = (width - left - 120) / max(p99 for _, _, p99 in bars)
    for i, (name, p50, p99) in enumerate(bars):
        y = top + i * (2 * bar_h + gap)
        svg.add(f'<text x="{left - 8}" y="{y + bar_h + 4}" text-anchor="end" '
                f'font-size="12">{escape(name)}</text>')
        for j, (label, value, color) in enumerate((("p50", p50, "#1f77b4"),
                                                   ("p99", p99, "#aec7e8"))):
            yy = y + j * bar_h
            svg.add(f'<rect x="{left}" y="{yy}" width="{value * scale:.1f}" height="{bar_h - 4}" '
                    f'fill="{color}"><title>{escape(name)}, {label}: {value:.3f} ms</title></rect>')
            svg.add(f'<text x="{left + value * scale + 6:.1f}" y="{yy + bar_h - 8}">'
                    f'{label} {value:.3f} ms</text>')
    svg.add(f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle" fill="#555">'
            f'examples\' loop (n=0: the variant; n=1: its TorchScript program) and loop_python, '
            f'one client; results/{directory}/</text>')
    return svg.text()


CHARTS = {
    "end_to_end_small.svg": lambda: end_to_end("2026-11-30/e2e_real_models.json", "small"),
    "end_to_end_medium.svg": lambda: end_to_end("2026-11-30/e2e_real_models.json", "medium"),
    "batching_bert.svg": lambda: batching("2026-12-02/batching/threads1_delay0", "bert"),
    "batching_resnet18.svg": lambda: batching("2026-12-02/batching/resnet18_threads1_delay0",
                                              "resnet18"),
    "eager_costs.svg": lambda: eager_costs("2026-12-01/python_eager_mix"),
}


def main(argv):
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        raise SystemExit(__doc__)
    stale = []
    os.makedirs(OUT, exist_ok=True)
    for name, draw in CHARTS.items():
        path = os.path.join(OUT, name)
        text = draw()
        if check:
            try:
                with open(path) as f:
                    same = f.read() == text
            except FileNotFoundError:
                same = False
            if not same:
                stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"charts: wrote bench/charts/{name}")
    if stale:
        print("charts: these figures differ from the recorded results; run "
              "python3 bench/charts.py: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
