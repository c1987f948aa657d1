"""The picture of a nemesis run: an SVG written by hand (no plotting dependency).

Four panels share the time axis: receipts per second (CONFIRMED and STORED), the
slowest ``send()`` per second, messages in the outboxes, and receipted messages not yet
received ("unseen"). Every fault window is shaded across all panels and named on top, so
a reader sees what each fault did to each curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

from msgsafe.nemesis.checker import Series

__all__ = ["svg"]

_WIDTH, _PANEL, _LEFT, _TOP, _GAP = 960, 120, 70, 60, 30
_COLOURS = {
    "broker": "#e4572e",
    "producer": "#8e44ad",
    "network": "#2e86de",
}


def svg(series: Series, *, title: str) -> str:
    """The SVG document (text) of ``series``."""
    panels: list[tuple[str, list[tuple[str, Sequence[float]]]]] = [
        ("receipts / s", [("confirmed", series.confirmed), ("stored", series.stored)]),
        ("slowest send() s", [("latency", series.latency)]),
        ("outbox depth", [("depth", series.depth)]),
        ("unseen", [("unseen", series.unseen)]),
    ]
    height = _TOP + len(panels) * (_PANEL + _GAP) + 20
    span = max(1.0, len(series.confirmed) * series.step)
    plot_w = _WIDTH - _LEFT - 20

    def x(t: float) -> float:
        return _LEFT + plot_w * min(max(t, 0.0), span) / span

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="18" font-size="14">{escape(title)}</text>',
    ]
    bottom = _TOP + len(panels) * (_PANEL + _GAP) - _GAP
    for n, (name, start, end) in enumerate(series.faults):
        colour = _COLOURS.get(name.split("-", 1)[0], "#888888")
        out.append(
            f'<rect class="fault" x="{x(start):.1f}" y="{_TOP}" '
            f'width="{max(1.0, x(end) - x(start)):.1f}" height="{bottom - _TOP}" '
            f'fill="{colour}" fill-opacity="0.15"><title>{escape(name)}: '
            f"{start:.1f}-{end:.1f} s</title></rect>"
        )
        out.append(
            f'<text x="{x(start):.1f}" y="{_TOP - 6 - 11 * (n % 3)}" fill="{colour}">'
            f"{escape(name)}</text>"
        )
    for p, (label, lines) in enumerate(panels):
        top = _TOP + p * (_PANEL + _GAP)
        peak = max([1.0, *(float(v) for _, values in lines for v in values)])
        out.append(
            f'<rect x="{_LEFT}" y="{top}" width="{plot_w}" height="{_PANEL}" '
            'fill="none" stroke="#999"/>'
        )
        out.append(f'<text x="4" y="{top + 12}">{escape(label)}</text>')
        out.append(f'<text x="4" y="{top + 26}" fill="#666">max {_fmt(peak)}</text>')
        for i, (name, values) in enumerate(lines):
            colour = ("#1b9e77", "#d95f02")[i % 2]
            points = " ".join(
                f"{x((k + 0.5) * series.step):.1f},{top + _PANEL - _PANEL * float(v) / peak:.1f}"
                for k, v in enumerate(values)
            )
            out.append(
                f'<polyline class="{escape(name)}" points="{points}" fill="none" '
                f'stroke="{colour}" stroke-width="1.2"/>'
            )
            if len(lines) > 1:
                out.append(
                    f'<text x="{_LEFT + 8 + 90 * i}" y="{top + 12}" fill="{colour}">'
                    f"{escape(name)}</text>"
                )
    axis = bottom + 14
    for k in range(0, int(span) + 1, max(1, int(span) // 10)):
        out.append(f'<text x="{x(float(k)):.1f}" y="{axis}" text-anchor="middle">{k}s</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2f}"
