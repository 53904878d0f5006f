"""Gantt charts of :class:`scheduler.Timeline` s: one panel per timeline, one row per device.

Used by benchmarks and runs to show "sequential" next to "chosen plan" (predicted or measured).
Draws with matplotlib's Agg canvas directly, so it never touches the global pyplot backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from scheduler import Span, Timeline

COMPONENT_COLORS = {
    "env": "#4c9a2a",
    "rollout": "#2f6fb0",
    "reward": "#e08a1e",
    "trainer": "#c0392b",
    "weight_sync": "#8e44ad",
}
_FALLBACK_COLORS = ("#16a085", "#7f8c8d", "#d35400", "#2c3e50", "#b7950b", "#6c3483")
_CHAR_WIDTH_PX = 5.5  # approx. width of one label character at the label font size
_SWITCH_LABELS = {"onload": "on", "offload": "off"}


def plot_timelines(
    timelines: Mapping[str, Timeline],
    path: str | Path,
    title: str | None = None,
    device_names: Sequence[str] | None = None,
) -> Path:
    """Save a Gantt chart of ``timelines`` (name -> timeline) as a PNG at ``path`` and return the path.

    Panels share the time axis, so equal lengths mean equal seconds. Bars are colored by component;
    onload/offload spans are hatched; text inside a bar is ``t<step> c<chunk>`` (or the epoch / sync /
    on / off) when it fits. Each panel marks its makespan and mean device utilization after the first
    line of its name; further lines of the name go below.
    """
    if not timelines:
        raise ValueError("plot_timelines needs at least one timeline")
    path = Path(path)
    colors = _component_colors(timelines.values())
    rows = [sorted(_devices(t)) for t in timelines.values()]
    horizon_s = max(t.makespan_s for t in timelines.values()) or 1.0
    width_in = 11.0
    heights = [max(1.2, 0.42 * len(r) + 0.5) for r in rows]
    fig = Figure(figsize=(width_in, sum(heights) + 1.3), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    axes_width_px = width_in * 0.82 * fig.dpi  # plot area without the y labels, roughly
    for ax, (name, timeline), devices in zip(axes, timelines.items(), rows):
        _draw_panel(ax, name, timeline, devices, colors, horizon_s, axes_width_px, device_names)
    axes[-1].set_xlabel("time (s)")
    handles = [Patch(facecolor=c, label=n) for n, c in colors.items()]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="///", label="onload / offload"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _draw_panel(ax, name, timeline, devices, colors, horizon_s, axes_width_px, device_names) -> None:
    row_of = {d: i for i, d in enumerate(devices)}
    px_per_s = axes_width_px / (horizon_s * 1.08)
    for span in timeline.spans:
        if span.duration_s <= 0:
            continue
        y = row_of[span.device]
        switch = span.kind in _SWITCH_LABELS
        color = colors[span.component]
        # white separators only between bars wide enough to keep their colour (hundreds of
        # sub-millisecond env/rollout steps would otherwise draw as white)
        edge = 0.6 if switch or span.duration_s * px_per_s >= 3 else 0.0
        ax.barh(
            y, span.duration_s, left=span.start_s, height=0.7,
            facecolor="white" if switch else color, edgecolor=color if switch else "white",
            hatch="///" if switch else None, linewidth=edge,
        )
        text = bar_text(span)
        if text and len(text) * _CHAR_WIDTH_PX + 4 < span.duration_s * px_per_s:
            ax.text(span.start_s + span.duration_s / 2, y, text, ha="center", va="center", fontsize=6.5,
                    color="0.15" if switch else "white", clip_on=True)
    ax.axvline(timeline.makespan_s, color="0.2", linestyle="--", linewidth=1.0)
    ax.annotate(f"{timeline.makespan_s:.3g} s", (timeline.makespan_s, 1.0), xycoords=ax.get_xaxis_transform(),
                xytext=(3, -3), textcoords="offset points", fontsize=8, va="top", color="0.2")
    names = [device_names[d] if device_names else f"dev {d}" for d in devices]
    ax.set_yticks(range(len(devices)), names, fontsize=8)
    ax.set_ylim(len(devices) - 0.5, -0.5)  # device 0 on top
    ax.set_xlim(0, horizon_s * 1.08)
    head, _, more = name.partition("\n")  # a name's further lines go under its makespan line
    ax.set_title(f"{head}: makespan {timeline.makespan_s:.3g} s, mean utilization {timeline.mean_utilization:.0%}"
                 + (f"\n{more}" if more else ""), fontsize=9, loc="left")
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(axis="x", labelsize=8)


def bar_text(span: Span) -> str:
    """The text drawn inside a span's bar (when it fits): ``t<step> c<chunk>`` for env spans,
    ``c<chunk>`` for rollout, ``e<epoch>[ c<chunk>]`` for the trainer, ``sync``, ``on`` / ``off``."""
    if span.kind in _SWITCH_LABELS:
        return _SWITCH_LABELS[span.kind]
    if span.kind == "sync":
        return "sync"
    # "env t3 c1" -> "t3 c1", "rollout c2" -> "c2", "trainer epoch 0 c1" -> "e0 c1", "trainer epoch 1" -> "e1"
    return span.label.removeprefix(span.component).strip().replace("epoch ", "e")


def _devices(timeline: Timeline) -> set[int]:
    return set(timeline.utilization) | {s.device for s in timeline.spans}


def _component_colors(timelines) -> dict[str, str]:
    names = sorted({s.component for t in timelines for s in t.spans})
    known = [n for n in COMPONENT_COLORS if n in names]
    others = [n for n in names if n not in COMPONENT_COLORS]
    colors = {n: COMPONENT_COLORS[n] for n in known}
    colors.update({n: _FALLBACK_COLORS[i % len(_FALLBACK_COLORS)] for i, n in enumerate(others)})
    return colors
