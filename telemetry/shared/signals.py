"""Whether a SIGINT already reached the whole process group: what a launcher asks before passing
one on to its children (`telemetry run`, trainer.launch)."""
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
