"""Sparklines as inline SVG, drawn on the server: no script, no canvas, no library."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 120, 28


def sparkline(values: Sequence[float], *, label: str, unit: str = "") -> Markup:
    """A line over ``values`` (oldest first), scaled to the largest; its last value and
    the largest in the title a pointer shows."""
    if not values:
        values = [0.0]
    top = max(values) or 1.0
    step = WIDTH / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{HEIGHT - 2 - (v / top) * (HEIGHT - 4):.1f}" for i, v in enumerate(values)
    )
    title = f"{label}: last {values[-1]:.4g}{unit}, peak {max(values):.4g}{unit}"
    return Markup(
        f'<svg class="spark" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/>'
        "</svg>"
    )
