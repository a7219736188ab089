"""What a launcher asks before passing a signal on to its children (`telemetry run`,
trainer.launch): whether a SIGINT already reached the whole process group, and whether there is
a terminal whose job control the children must stay under."""
from __future__ import annotations

import os


def at_foreground_terminal() -> bool:
    """True when this process is in its terminal's foreground process group: a Ctrl-C there is
    the terminal's SIGINT to the whole group, so children in the group have it already (a second
    one would interrupt their clean-up or exit hooks)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def has_controlling_terminal() -> bool:
    """True when this process has a controlling terminal (in the foreground or not, whatever its
    stdin is): its job control (Ctrl-Z, fg, a background read's SIGTTIN) works on process groups,
    so a child in a group of its own would escape it (stopped alone, never continued)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True
