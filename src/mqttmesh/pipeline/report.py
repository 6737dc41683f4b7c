"""The report of a batch job: PNG charts (matplotlib, Agg backend) and one HTML page.

I/O (files) on plain Python data: the jobs collect the few rows a chart needs; nothing
here touches Spark.
"""

from __future__ import annotations

import datetime as dt
import html
import os

__all__ = ["line_chart", "bar_chart", "grouped_bars", "html_page"]

_MAX_SERIES = 8


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def load_plotting() -> None:
    """Imports what the charts draw with (a job may do it while Spark works)."""
    try:
        _plt()
    except Exception:  # (the charts will say why when they are drawn)
        pass


# each series its own dash pattern and marker, and the first drawn the widest: where lines
# coincide (two nodes with the same traffic) each still shows, as a border or a dash
_DASHES = ["-", "--", "-.", ":"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def line_chart(
    path: str,
    title: str,
    series: dict[str, tuple[list, list]],
    ylabel: str,
    partial: set | frozenset = frozenset(),
) -> str:
    """One line per series name: (x: datetimes or numbers, y: numbers); at most 8 series,
    each visible where they overlap (widths, dashes, markers). Points whose x is in
    ``partial`` (windows the data covers only in part: the first and the last, unless the
    range was given on window bounds) are open markers, not joined to the line: a partial
    window's count is not a fall in traffic."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4))
    shown = list(series.items())[:_MAX_SERIES]
    n = len(shown)
    any_partial = False
    for i, (name, (xs, ys)) in enumerate(shown):
        width = 1.2 + 0.9 * (n - 1 - i)  # (0.45 points each side of the next: a visible border)
        whole = [(x, y) for x, y in zip(xs, ys, strict=True) if x not in partial]
        part = [(x, y) for x, y in zip(xs, ys, strict=True) if x in partial]
        (line,) = ax.plot(
            [x for x, _ in whole],
            [y for _, y in whole],
            linestyle=_DASHES[i % len(_DASHES)],
            linewidth=width,
            marker=_MARKERS[i % len(_MARKERS)] if len(whole) < 60 else None,
            markersize=3 + width,
            label=str(name),
            zorder=2 + i,
        )
        if part:
            any_partial = True
            ax.plot(
                [x for x, _ in part],
                [y for _, y in part],
                linestyle="none",
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=4 + width,
                markerfacecolor="none",
                color=line.get_color(),
                zorder=2 + i,
            )
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if shown:
        ax.legend(
            fontsize="small",
            loc="best",
            title="open markers: partial windows" if any_partial else None,
            title_fontsize="small",
        )
    ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def bar_chart(path: str, title: str, labels: list[str], values: list[float], xlabel: str) -> str:
    """Horizontal bars, first label on top."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.35 * len(labels) + 1)))
    ax.barh(range(len(labels)), values)
    ax.set_yticks(range(len(labels)), [str(x) for x in labels], fontsize="small")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def grouped_bars(path: str, title: str, labels: list[str], groups: dict[str, list[float]], ylabel: str) -> str:
    """Bars per label, one colour per group (e.g. expected / delivered / lost per subscriber)."""
    plt = _plt()
    n = max(1, len(groups))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels) + 2), 4))
    for i, (name, values) in enumerate(groups.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks(
        [x + (n - 1) * width / 2 for x in range(len(labels))],
        [str(x) for x in labels],
        rotation=30,
        ha="right",
        fontsize="small",
    )
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h1{margin-bottom:0}.sub{color:#666;margin-top:.3em}table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:90%}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}.note{color:#a40}"""


def _table_html(columns, rows, left=()) -> str:
    out = ["<table><tr>"]
    out += [
        f'<th class="l">{html.escape(str(c))}</th>' if c in left else f"<th>{html.escape(str(c))}</th>" for c in columns
    ]
    out.append("</tr>")
    for row in rows:
        out.append(
            "<tr>"
            + "".join(
                f'<td class="{"l" if c in left or isinstance(v, str) else ""}">{html.escape(str(v))}</td>'
                for c, v in zip(columns, row, strict=False)
            )
            + "</tr>"
        )
    out.append("</table>")
    return "".join(out)


def html_page(
    path: str,
    title: str,
    subtitle: str,
    summary: list[tuple[str, object]],
    charts: list[tuple[str, str]],
    tables: list,
    notes: list[str],
) -> str:
    """One page: summary, notes (skipped files, non-JSON counts...), charts, then each table's
    first rows with links to its CSV and Parquet."""
    base = os.path.dirname(path)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p class='sub'>{html.escape(subtitle)} &middot; generated "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC</p>",
    ]
    if summary:
        parts.append(_table_html(["", "value"], [(k, v) for k, v in summary], left=("",)))
    for note in notes:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    for caption, png in charts:
        rel = os.path.relpath(png, base)
        parts.append(f"<h3>{html.escape(caption)}</h3><img src='{html.escape(rel)}' alt='{html.escape(caption)}'>")
    for t in tables:
        csv_rel = os.path.relpath(t.csv, base)
        pq_rel = os.path.relpath(t.parquet, base)
        more = f" (first {len(t.preview)} of {t.rows} rows)" if t.rows > len(t.preview) else f" ({t.rows} rows)"
        parts.append(
            f"<h2>{html.escape(t.title)}</h2><p class='sub'><code>{html.escape(t.name)}</code>{more}: "
            f"<a href='{html.escape(csv_rel)}'>CSV</a>, <a href='{html.escape(pq_rel)}'>Parquet</a></p>"
        )
        parts.append(_table_html(t.columns, t.preview))
    parts.append("</body></html>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(parts))
    return path
