"""The run's media in `telemetry report`: what the daemon kept in <log_dir>/media
(telemetry/daemon/media_keeper.py wrote it) as the page shows it.

Each media key's newest value is shown: an image as the PNG the daemon kept (copied beside
index.html, so the report stands alone), a histogram drawn, a table as an HTML table of its
first rows and columns. What is read is bounded: the index is streamed line by line (only each
key's newest entry is held), at most MAX_KEYS keys and MAX_IMAGES_PER_VALUE images of a value are
shown, a kept file larger than its bound is not read; what is left out is counted on the page.
Nothing in the run's media directory is written.
"""
from __future__ import annotations

import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.shared import files
from telemetry.shared import jsonlines
from telemetry.shared.media import KEPT_INDEX, KEPT_SUBDIR

MAX_KEYS = 48                     # media keys shown; more are counted
MAX_IMAGES_PER_VALUE = 8          # images of one value (a list logged as one key)
MAX_IMAGE_BYTES = 32 << 20        # a kept PNG larger than this is not copied
MAX_TABLE_FILE_BYTES = 16 << 20   # a kept table larger than this is not read
MAX_TABLE_ROWS = 50
MAX_TABLE_COLUMNS = 20
MAX_CELL_CHARS = 200
MAX_CAPTION_CHARS = 300
SUBDIR = "media"                  # the report's own copy, beside index.html


@dataclass
class RunMedia:
    """Each media key's newest value (its index entry) and how many values it had."""

    newest: dict[str, dict] = field(default_factory=dict)
    num_values: dict[str, int] = field(default_factory=dict)
    num_values_not_shown: int = 0   # values of keys past the first MAX_KEYS
    num_bad: int = 0                # index lines that are not entries


class _Stats:
    num_bad = 0


def read_index(log_dir: Path) -> RunMedia:
    """The newest entry of each media key in <log_dir>/media/index.jsonl (none: an empty RunMedia)."""
    media = RunMedia()
    stats = _Stats()
    try:
        f = files.open_regular(Path(log_dir) / KEPT_SUBDIR / KEPT_INDEX)
    except OSError:
        return media
    lines = jsonlines.Lines(stats, jsonlines.MAX_LINE_BYTES)
    with f:
        while chunk := f.read(jsonlines.READ_CHUNK_BYTES):
            for line in lines.feed(chunk):
                _take(media, line)
    media.num_bad += stats.num_bad
    return media


def _take(media: RunMedia, line: bytes) -> None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        media.num_bad += 1
        return
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not isinstance(entry.get("type"), str):
        media.num_bad += 1
        return
    key = entry["key"]
    if key not in media.newest and len(media.newest) >= MAX_KEYS:
        media.num_values_not_shown += 1
        return
    media.newest[key] = entry
    media.num_values[key] = media.num_values.get(key, 0) + 1


def _kept_file(log_dir: Path, name: Any) -> Path | None:
    """A file the keeper wrote (N.png, N.json), never a path a hostile index could name."""
    if not isinstance(name, str) or not name.split(".")[0].isdigit() or name.count(".") != 1 \
            or name.split(".")[1] not in ("png", "json") or len(name) > 20:
        return None
    return Path(log_dir) / KEPT_SUBDIR / name


def _read(path: Path, limit: int) -> bytes | None:
    try:
        with files.open_regular(path) as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return None if len(data) > limit else data


def html_section(media: RunMedia, log_dir: Path, out: Path) -> str:
    """The page's Media section (empty when the run kept none); copies and draws into out/media/."""
    if not media.newest:
        return ""
    e = html.escape
    out_media = out / SUBDIR
    files.output_dir(out_media)
    cards = []
    for i, (key, entry) in enumerate(sorted(media.newest.items())):
        n = media.num_values.get(key, 1)
        head = (f"<h3>{e(key)} <span class='dim'>({e(entry['type'])}, step {e(str(entry.get('step')))}"
                f"{f'; the newest of {n} values' if n > 1 else ''})</span></h3>")
        try:
            body = _card(i, key, entry, log_dir, out_media)
        except Exception as exc:    # one value that cannot be shown: said on its card, the rest go on
            body = f"<p class='dim'>not shown: {e(type(exc).__name__)}: {e(str(exc)[:200])}</p>"
        cards.append(f"<div class='media'>{head}{body}</div>")
    notes = []
    if media.num_values_not_shown:
        notes.append(f"{media.num_values_not_shown} value(s) of media keys past the first {MAX_KEYS} not shown")
    if media.num_bad:
        notes.append(f"{media.num_bad} unreadable media index line(s) skipped")
    note = f"<p class='dim'>{e('; '.join(notes))}</p>" if notes else ""
    return f"<h2>Media ({len(media.newest)})</h2>{note}{''.join(cards)}"


def _card(i: int, key: str, entry: dict, log_dir: Path, out_media: Path) -> str:
    e = html.escape
    kind = entry["type"]
    if kind == "Image":
        images = entry.get("images") if isinstance(entry.get("images"), list) else []
        figs = []
        for j, im in enumerate(images[:MAX_IMAGES_PER_VALUE]):
            src = _kept_file(log_dir, im.get("file") if isinstance(im, dict) else None)
            data = _read(src, MAX_IMAGE_BYTES) if src is not None and src.suffix == ".png" else None
            if data is None:
                figs.append("<p class='dim'>an image the daemon did not keep whole (missing or too large)</p>")
                continue
            name = f"{i}-{j}.png"
            with os.fdopen(files.create_output(out_media / name), "wb") as f:   # never through a symlink
                f.write(data)
            caption = str(im.get("caption", ""))[:MAX_CAPTION_CHARS]
            figs.append(f'<figure><img src="{SUBDIR}/{name}" alt="{e(key)}">'
                        + (f"<figcaption>{e(caption)}</figcaption>" if caption else "") + "</figure>")
        more = len(images) - MAX_IMAGES_PER_VALUE
        return "".join(figs) + (f"<p class='dim'>{more} more image(s) of this value not shown</p>" if more > 0 else "")
    if kind == "Histogram":
        name = f"{i}.png"
        _draw_histogram(key, entry.get("bins"), entry.get("counts"), out_media / name)
        return f'<figure><img src="{SUBDIR}/{name}" alt="{e(key)}"></figure>'
    if kind == "Table":
        src = _kept_file(log_dir, entry.get("file"))
        data = _read(src, MAX_TABLE_FILE_BYTES) if src is not None and src.suffix == ".json" else None
        if data is None:
            return "<p class='dim'>a table the daemon did not keep whole (missing or too large)</p>"
        return _table_html(json.loads(data))
    return f"<p class='dim'>a media type this report does not show: {e(kind)}</p>"


def _draw_histogram(key: str, bins: Any, counts: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    ok = isinstance(bins, list) and isinstance(counts, list) and len(bins) == len(counts) + 1 and counts \
        and all(isinstance(v, (int, float)) and math.isfinite(v) for v in bins + counts)
    if not ok:
        raise ValueError("a histogram without its bins and counts")
    widths = [b - a for a, b in zip(bins, bins[1:])]
    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    ax.bar(bins[:-1], counts, width=widths, align="edge", color="tab:blue", alpha=0.75, edgecolor="white", lw=0.4)
    ax.set_title(key, loc="left", fontsize=10, fontweight="bold")
    ax.set_ylabel("count")
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    with os.fdopen(files.create_output(path), "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def _cell(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    if len(text) > MAX_CELL_CHARS:
        text = text[:MAX_CELL_CHARS] + "…"
    return html.escape(text)


def _table_html(doc: Any) -> str:
    columns = doc.get("columns") if isinstance(doc, dict) else None
    rows = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ValueError("a table file without rows")
    columns = columns if isinstance(columns, list) else []
    ncols = max([len(columns)] + [len(r) for r in rows[:MAX_TABLE_ROWS] if isinstance(r, list)])
    shown = min(ncols, MAX_TABLE_COLUMNS)
    head = "".join(f"<th>{_cell(c)}</th>" for c in columns[:shown])
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in (r if isinstance(r, list) else [r])[:shown])
                   + "</tr>" for r in rows[:MAX_TABLE_ROWS])
    cut = []
    if len(rows) > MAX_TABLE_ROWS:
        cut.append(f"the first {MAX_TABLE_ROWS} of {len(rows)} rows")
    if ncols > shown:
        cut.append(f"the first {shown} of {ncols} columns")
    note = f"<p class='dim'>{html.escape(', '.join(cut))}</p>" if cut else ""
    return f"<table class='ev'>{f'<tr>{head}</tr>' if head else ''}{body}</table>{note}"
