"""Server-made SVG plots for the consoles, and their cache.

Two kinds of drawing, both safe to put in a page:

- matplotlib through its object API only (``Figure`` + ``FigureCanvasSVG``; never pyplot,
  which keeps global figure state that threads of a server would share). The SVG goes
  into the page as a ``data:`` image (the CSP allows ``img-src data:``); matplotlib's
  inline ``style`` attributes then stay inside the image document, where the page's
  ``style-src 'self'`` does not apply, and no script in an image ever runs.
- the SOCA preference graph, built by hand as inline SVG from numbers only, with
  presentation attributes (no ``style``), so app.css can restyle it.

Plots are cached in the Django cache (Redis) under a key that names the data version
(e.g. the client's latest PosteriorUpdate id), so a new session end makes a new key and
an old image is never shown for new data. A cache outage only costs a re-render.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from django.core.cache import cache
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure

log = logging.getLogger(__name__)

# Text stays text (smaller files; matplotlib XML-escapes it) and ids are stable, so the
# same data gives byte-identical SVG. Set once per process: rcParams are global.
matplotlib.rcParams["svg.fonttype"] = "none"
matplotlib.rcParams["svg.hashsalt"] = "psyevo"
matplotlib.rcParams["font.size"] = 8

PLOT_VERSION = 1  # bump when a drawing changes, so cached images of the old look expire
CACHE_SECONDS = 7 * 24 * 3600
TIE_COLOR = "#b9bec8"
SKILL_COLORS = ("#2458a6", "#e08a1e", "#1e8a5a", "#b23a48", "#7a4fa3", "#2a9bb0")


@dataclass(frozen=True)
class Plot:
    """An SVG image for a page: ``src`` is a data: URI, ``alt`` its text alternative."""

    src: str
    alt: str


def cached_svg(parts: Sequence[object], build: Callable[[], str]) -> str:
    """The SVG for ``parts`` (kind + data version + parameters), from the cache or built."""
    raw = "|".join(str(p) for p in (PLOT_VERSION, *parts))
    key = "plot:" + hashlib.sha256(raw.encode()).hexdigest()
    try:
        found = cache.get(key)
    except Exception as exc:  # Redis down: draw it anyway
        log.warning("plot cache read failed: %s", exc)
        found = None
    if isinstance(found, str):
        return found
    svg = build()
    try:
        cache.set(key, svg, CACHE_SECONDS)
    except Exception as exc:
        log.warning("plot cache write failed: %s", exc)
    return svg


def as_plot(svg: str, alt: str) -> Plot:
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return Plot(f"data:image/svg+xml;base64,{data}", alt)


def _svg(fig: Figure) -> str:
    FigureCanvasSVG(fig)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    return buffer.getvalue()


def _stage_rows(ax: Any, slots: Sequence[str]) -> None:
    """Label rows as progress/affect, with a line and a stage name between stages."""
    ax.set_yticks(range(len(slots)))
    ax.set_yticklabels(["/".join(s.split("/")[1:]) for s in slots], fontsize=6)
    stages = [s.split("/")[0] for s in slots]
    start = 0
    for i in range(1, len(stages) + 1):
        if i == len(stages) or stages[i] != stages[start]:
            if i < len(stages):
                ax.axhline(i - 0.5, color="black", linewidth=1.2)
            ax.text(
                -0.42,
                (start + i - 1) / 2,
                stages[start],
                rotation=90,
                va="center",
                ha="right",
                fontsize=8,
                fontweight="bold",
                transform=ax.get_yaxis_transform(),
            )
            start = i


# -- posterior inspector ----------------------------------------------------------------
def heatmap(
    values: np.ndarray,
    slots: Sequence[str],
    skills: Sequence[str],
    top: Sequence[int | None],
    title: str,
) -> str:
    """Rows: slots grouped by stage; columns: skills; colour: Q + posterior mean.
    The top-ranked skill of each row is boxed; a tied row has its tied maxima hatched."""
    fig = Figure(figsize=(5.4, 0.16 * len(slots) + 1.4))
    ax = fig.add_axes((0.3, 0.04, 0.55, 1 - 1.0 / (0.16 * len(slots) + 1.4)))
    image = ax.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(len(skills)))
    ax.set_xticklabels(skills, fontsize=7)
    ax.xaxis.tick_top()
    _stage_rows(ax, slots)
    for row, best in enumerate(top):
        if best is not None:
            ax.add_patch(_box(best, row, "white"))
        else:
            row_max = values[row].max()
            for col in np.flatnonzero(np.abs(values[row] - row_max) <= 1e-12):
                ax.add_patch(_box(int(col), row, TIE_COLOR, hatch="///"))
    ax.set_title(title, fontsize=9, pad=18)
    bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
    bar.set_label("Q + posterior mean", fontsize=7)
    return _svg(fig)


def _box(col: int, row: int, color: str, hatch: str | None = None) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor=color, linewidth=1.4, hatch=hatch
    )


def rank_diff(diff: np.ndarray, slots: Sequence[str], skills: Sequence[str], title: str) -> str:
    """Fig. 6 right: initial rank minus final rank; blue = higher priority, red = lower."""
    limit = max(1.0, float(len(skills) - 1))
    fig = Figure(figsize=(5.4, 0.16 * len(slots) + 1.4))
    ax = fig.add_axes((0.3, 0.04, 0.55, 1 - 1.0 / (0.16 * len(slots) + 1.4)))
    image = ax.imshow(
        diff, aspect="auto", cmap="RdBu", vmin=-limit, vmax=limit, interpolation="nearest"
    )
    ax.set_xticks(range(len(skills)))
    ax.set_xticklabels(skills, fontsize=7)
    ax.xaxis.tick_top()
    _stage_rows(ax, slots)
    ax.set_title(title, fontsize=9, pad=18)
    bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
    bar.set_label("rank before - rank after", fontsize=7)
    return _svg(fig)


def cell_history(
    means: Sequence[float], sds: Sequence[float], labels: Sequence[str], title: str
) -> str:
    """Mean +- sd of one posterior cell, from the prior through every update."""
    fig = Figure(figsize=(6.0, 2.6))
    ax = fig.add_subplot()
    x = np.arange(len(means))
    m, s = np.asarray(means, dtype=float), np.asarray(sds, dtype=float)
    ax.fill_between(x, m - s, m + s, color="#2458a6", alpha=0.18, label="mean ± sd")
    ax.plot(x, m, marker="o", color="#2458a6", label="posterior mean")
    ax.axhline(0.0, color="#888888", linewidth=0.8, linestyle="--")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("residual b(s, a)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _svg(fig)


def disagreement(
    tops: np.ndarray,
    clients: Sequence[str],
    fractions: Sequence[float],
    modality: str,
    skills: Sequence[str] = (),
) -> str:
    """Fig. 3: (a) top-ranked skill per client and slot (gray: tie); (b) pairwise
    disagreement over client pairs, with the median (diamond) and interquartile range."""
    rows = max(1, len(clients))
    height = 0.22 * rows + 2.1
    fig = Figure(figsize=(8.0, height))
    # Room at the bottom for the skill legend, at the top for the titles.
    grid = fig.add_gridspec(
        1, 2, width_ratios=(5, 1), wspace=0.25, bottom=0.85 / height, top=1 - 0.4 / height
    )
    ax = fig.add_subplot(grid[0, 0])
    colors = ListedColormap([TIE_COLOR, *SKILL_COLORS])
    codes = np.where(tops < 0, 0, tops + 1) if tops.size else np.zeros((1, 54))
    ax.imshow(
        codes,
        aspect="auto",
        cmap=colors,
        norm=BoundaryNorm(np.arange(-0.5, len(SKILL_COLORS) + 1.5), colors.N),
        interpolation="nearest",
    )
    ax.set_yticks(range(len(clients)))
    ax.set_yticklabels(clients, fontsize=6)
    for boundary in (17.5, 35.5):
        ax.axvline(boundary, color="black", linewidth=1)
    ax.set_xticks([8.5, 26.5, 44.5])
    ax.set_xticklabels(["formulation", "core", "consolidation"], fontsize=7)
    ax.set_title(f"(a) top-ranked skill per slot, {modality.upper()} (gray: tie)", fontsize=8)
    if skills:
        from matplotlib.patches import Patch

        colors_ = [
            Patch(color=SKILL_COLORS[i % len(SKILL_COLORS)], label=s) for i, s in enumerate(skills)
        ]
        handles = [*colors_, Patch(color=TIE_COLOR, label="tie")]
        fig.legend(
            handles=handles, ncol=len(handles), fontsize=7, loc="lower center", frameon=False
        )
    side = fig.add_subplot(grid[0, 1])
    values = np.asarray(fractions, dtype=float) * 100
    if values.size:
        jitter = (np.arange(values.size) % 7 - 3) * 0.03
        side.scatter(jitter, values, s=8, color="#5b6475", alpha=0.6)
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        side.hlines([q1, q3], -0.2, 0.2, color="black", linewidth=1)
        side.vlines(0, q1, q3, color="black", linewidth=1)
        side.scatter([0], [median], marker="D", s=36, color="#b23a48", zorder=3)
    side.set_xlim(-0.5, 0.5)
    side.set_xticks([])
    side.set_ylim(-2, 102)
    side.set_ylabel("disagreement (%)")
    side.set_title("(b) client pairs", fontsize=8)
    return _svg(fig)


# -- outcomes and training -----------------------------------------------------------------
def outcome_trend(
    labels: Sequence[str],
    rewards: Sequence[float | None],
    ratings: Sequence[float | None],
    falling: bool,
) -> str:
    """Session reward (0-1) and the SRS overall rating (0-10) per ended session."""
    fig = Figure(figsize=(6.0, 2.6))
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    reward = np.array([np.nan if r is None else r for r in rewards], dtype=float)
    rating = np.array([np.nan if r is None else r / 10.0 for r in ratings], dtype=float)
    ax.plot(
        x, reward, marker="o", color="#b23a48" if falling else "#2458a6", label="session reward"
    )
    ax.plot(x, rating, marker="s", linestyle="--", color="#1e8a5a", label="overall rating / 10")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("score")
    ax.legend(fontsize=7, loc="best")
    if falling:
        ax.set_title(
            "Falling: reward decreased over the last 3 sessions", fontsize=9, color="#a61b1b"
        )
    fig.tight_layout()
    return _svg(fig)


def loss_curve(steps: Sequence[float], losses: Sequence[float | None], title: str) -> str:
    fig = Figure(figsize=(5.0, 2.4))
    ax = fig.add_subplot()
    y = np.array([np.nan if v is None else v for v in losses], dtype=float)
    ax.plot(list(steps), y, marker="o", color="#2458a6")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("LiPO loss")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _svg(fig)


# -- SOCA graph (hand-built inline SVG) -------------------------------------------------
NODE_R = 17
COL_W = 110
ROW_H = 54
PAD = 30


def soca_graph(
    n: int,
    edges: Sequence[dict[str, Any]],
    depths: Sequence[int],
    delivered: int,
    caption: str,
    uid: int = 0,
) -> SafeString:
    """The acyclic preference graph of one turn (Eq. 7): candidates in columns by depth
    (deepest, i.e. most preferred, on the left), an arrow winner -> loser per edge with
    width by weight, the delivered candidate filled. Every value drawn is a number or one
    of our own labels; ``caption`` is escaped."""
    n = max(1, int(n))
    depth = [int(depths[i]) if i < len(depths) else 0 for i in range(n)]
    # One column per depth that occurs, deepest (most preferred) first.
    order = {d: col for col, d in enumerate(sorted(set(depth), reverse=True))}
    top = len(order) - 1
    columns: dict[int, list[int]] = {}
    for i in range(n):
        columns.setdefault(order[depth[i]], []).append(i)
    where = {}
    for col, members in columns.items():
        for row, i in enumerate(members):
            where[i] = (PAD + NODE_R + col * COL_W, PAD + NODE_R + row * ROW_H)
    width = 2 * (PAD + NODE_R) + top * COL_W
    height = 2 * (PAD + NODE_R) + (max(len(m) for m in columns.values()) - 1) * ROW_H + 14
    parts: list[str] = [
        format_html(
            '<svg xmlns="http://www.w3.org/2000/svg" class="soca-graph" role="img" '
            'width="{}" height="{}" viewBox="0 0 {} {}" aria-label="{}">'
            "<title>{}</title>"
            '<defs><marker id="arrow-{}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
            'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#5b6475"/></marker></defs>',
            width,
            height,
            width,
            height,
            caption,
            caption,
            int(uid),
        )
    ]
    for edge in edges:
        try:
            w, l_, weight = int(edge["winner"]), int(edge["loser"]), float(edge.get("weight", 0))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a malformed stored edge is left out, never drawn from raw data
        if not (0 <= w < n and 0 <= l_ < n) or w == l_ or not math.isfinite(weight):
            continue
        parts.append(_edge(where[w], where[l_], weight, int(uid)))
    for i in range(n):
        x, y = where[i]
        chosen = i == delivered
        parts.append(
            format_html(
                '<g class="node{}"><title>{}</title>'
                '<circle cx="{}" cy="{}" r="{}" fill="{}" stroke="{}" stroke-width="{}"/>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="{}">{}</text>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="10" fill="#5b6475">d={}</text></g>',
                " delivered" if chosen else "",
                f"Candidate {i + 1}, depth {depth[i]}" + (", delivered" if chosen else ""),
                x,
                y,
                NODE_R,
                "#2458a6" if chosen else "#ffffff",
                "#1d2330" if chosen else "#5b6475",
                3 if chosen else 1.5,
                x,
                y + 4,
                "#ffffff" if chosen else "#1d2330",
                f"C{i + 1}",
                x,
                y + NODE_R + 12,
                depth[i],
            )
        )
    parts.append("</svg>")
    # Safe: every interpolation above went through format_html (escaped) and is a number
    # or a fixed label; the markup itself is ours.
    return mark_safe("".join(str(p) for p in parts))


def _edge(a: tuple[int, int], b: tuple[int, int], weight: float, uid: int) -> str:
    (x1, y1), (x2, y2) = a, b
    dx, dy = x2 - x1, y2 - y1
    dist = math.hypot(dx, dy) or 1.0
    ux, uy = dx / dist, dy / dist
    sx, sy = x1 + ux * NODE_R, y1 + uy * NODE_R
    ex, ey = x2 - ux * (NODE_R + 2), y2 - uy * (NODE_R + 2)
    # Bend every edge a little (more for long ones) so skip-level edges clear the nodes.
    bend = 0.18 * dist
    cx, cy = (sx + ex) / 2 - uy * bend, (sy + ey) / 2 + ux * bend
    stroke = 1.0 + 4.0 * min(1.0, max(0.0, weight))
    # format_html escapes its arguments into strings, so numbers are formatted first.
    n = [
        f"{v:.1f}"
        for v in (sx, sy, cx, cy, ex, ey, (sx + 2 * cx + ex) / 4, (sy + 2 * cy + ey) / 4 - 3)
    ]
    return str(
        format_html(
            '<g class="edge"><title>{}</title><path d="M{},{} Q{},{} {},{}" '
            'fill="none" stroke="#5b6475" stroke-width="{}" marker-end="url(#arrow-{})"/>'
            '<text x="{}" y="{}" font-size="9" fill="#1d2330" text-anchor="middle">{}</text></g>',
            f"weight {weight:.3f}",
            *n[:6],
            f"{stroke:.2f}",
            uid,
            n[6],
            n[7],
            f"{weight:.2f}",
        )
    )
