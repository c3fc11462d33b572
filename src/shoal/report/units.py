"""Human-readable numbers shared by the table, the plots and the terminal output."""

from __future__ import annotations


def human_bytes(value: float | None) -> str:
    """Decimal units with about three significant figures: 512 B, 2.47 MB, 38.3 MB, 1.81 GB; '–' for None."""
    if value is None:
        return "–"
    size = float(value)
    unit = "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 999.5 or unit == "TB":
            break
        size /= 1000
    digits = 0 if unit == "B" or abs(size) >= 99.95 else 1 if abs(size) >= 9.995 else 2
    return f"{size:.{digits}f} {unit}"


def fmt_seconds(value: float) -> str:
    """Seconds with three significant figures below 100 s, whole seconds above."""
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"
