"""Loss curves: a PNG through matplotlib when it is installed (extra `plot`), otherwise a small
plot drawn with characters in the terminal."""
from __future__ import annotations

import math


def save_png(losses, path, title: str = "training loss") -> bool:
    """Write the curve to ``path``; False when matplotlib is not importable."""
    try:
        import matplotlib  # optional (extra `plot`); slow to import: only to write a PNG
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pyplot after use("Agg"): it then needs no display
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(losses) + 1), losses, lw=1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def terminal_plot(values, width: int = 60, height: int = 10) -> str:
    """A block plot of ``values`` (downsampled to ``width`` columns by averaging), with the y range
    on the left. Non-finite values are drawn as gaps."""
    vals = [float(v) for v in values]
    if not vals:
        return "(no steps)"
    cols = min(width, len(vals))
    buckets = []
    for c in range(cols):
        lo, hi = c * len(vals) // cols, max((c + 1) * len(vals) // cols, c * len(vals) // cols + 1)
        chunk = [v for v in vals[lo:hi] if math.isfinite(v)]
        buckets.append(sum(chunk) / len(chunk) if chunk else None)
    finite = [b for b in buckets if b is not None]
    if not finite:
        return "(loss is not finite)"
    top, bot = max(finite), min(finite)
    span = (top - bot) or 1.0
    levels = [None if b is None else round((b - bot) / span * (height - 1)) for b in buckets]
    lines = []
    for row in range(height - 1, -1, -1):
        label = f"{bot + span * row / (height - 1):>9.4g} " if row in (0, height - 1) \
            else " " * 10
        line = "".join("█" if lv is not None and lv >= row else " " for lv in levels)
        lines.append(label + "│" + line)
    lines.append(" " * 10 + "└" + "─" * cols)
    lines.append(" " * 11 + f"step 1{' ' * max(1, cols - 6 - len(str(len(vals))))}{len(vals)}")
    return "\n".join(lines)
