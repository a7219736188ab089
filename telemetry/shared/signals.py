"""What a launcher asks before passing a signal on to its children (`telemetry run`,
trainer.launch): whether a SIGINT already reached the whole process group, and whether there is
a terminal whose job control the children must stay under. And a Ctrl-C'd script that still
dies by SIGINT after telemetry's exit hooks ran (`keep_sigint_exit`)."""
from __future__ import annotations

import os
import sys


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


def keep_sigint_exit() -> None:
    """An exit hook, registered before any of telemetry's (atexit runs them last in, first out):
    after an uncaught KeyboardInterrupt the interpreter still dies by SIGINT (the shell's 130),
    as the script would without telemetry.

    CPython kills itself with SIGINT at the end only while a flag set by the uncaught
    KeyboardInterrupt holds, and every exec() or eval() of a string clears it: a dataclass or a
    namedtuple made by a module first imported in an exit hook (the drain, a W&B run's finish)
    turned the script's exit into 1. An exec() of a string that raises KeyboardInterrupt sets
    the flag again; nothing else here can."""
    if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt) and not sys.flags.interactive:
        try:
            exec("raise KeyboardInterrupt")     # the flag is set by this very call
        except KeyboardInterrupt:
            pass
