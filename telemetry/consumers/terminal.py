"""Strings from the wire, made safe to print on a terminal.

A metric name, an event's name or data, a host name: anything a rank (or anyone who can reach
the ingest) sent is data, and a terminal obeys escape sequences in data: ESC ] 0; ... BEL sets
the window title, ESC [2J clears the screen, ESC ] 52; ... BEL writes the clipboard. Every
consumer that prints such a string passes it through `printable` (or a whole record through
`printable_record`) first: C0 and C1 controls, ESC, DEL, Unicode line separators, bidi
overrides (text that reads differently than it is) and lone surrogates (which cannot be
encoded to print) become visible escapes such as \\x1b or \\u202e. Everything else, UTF-8
names included, is left as it is. Rich markup ("[bold]") is a separate matter: the live view
hands wire strings to rich as `Text`, never as markup.
"""
from __future__ import annotations

import re
import sys
import time
from typing import Any

from protocol.output import OutputRecord

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(s: Any) -> str:
    """str(s) with every control character escaped visibly (ESC as \\x1b); one line always."""
    s = s if isinstance(s, str) else str(s)
    return _UNSAFE.sub(_escape, s)


def printable_record(v: Any) -> Any:
    """A decoded JSON value with every string in it, keys included, made printable."""
    if isinstance(v, str):
        return _UNSAFE.sub(_escape, v) if _UNSAFE.search(v) else v
    if isinstance(v, OutputRecord):
        v = v.to_dict()
    if isinstance(v, dict):
        return {printable_record(k): printable_record(x) for k, x in v.items()}
    if isinstance(v, list):
        return [printable_record(x) for x in v]
    return v


# A progress line is redrawn at most this often (as often as tail's live view).
PROGRESS_REDRAW_S = 0.25


class Progress:
    """One line on stderr, rewritten in place while a command works (`telemetry report` reading a
    long run), for a person at a terminal; nothing at all when stderr is not one (a pipe, a log
    file, CI): what scripts read never changes. show() redraws at most every PROGRESS_REDRAW_S
    (the first at once); clear() erases the line before the command prints its result."""

    def __init__(self, prog: str, stream: Any = None) -> None:
        self.prog = prog
        self.stream = sys.stderr if stream is None else stream
        try:
            self.on = self.stream is not None and self.stream.isatty()
        except (AttributeError, ValueError, OSError):   # closed, or no file at all
            self.on = False
        self._drawn_mono: float | None = None    # when the line was last drawn; None: none shown

    def show(self, text: str, now: bool = False) -> None:
        """Draw `text` as the progress line (now: whatever the time since the last one)."""
        if not self.on:
            return
        t = time.monotonic()
        if not now and self._drawn_mono is not None and t - self._drawn_mono < PROGRESS_REDRAW_S:
            return
        self._drawn_mono = t
        self._write(f"\r\x1b[K{self.prog}: {printable(text)}")

    def clear(self) -> None:
        if self.on and self._drawn_mono is not None:
            self._drawn_mono = None
            self._write("\r\x1b[K")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:     # the terminal went away: the work goes on, without its progress
            self.on = False
