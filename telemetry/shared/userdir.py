"""The user's private directory on this host: the home of each run's default socket directory
(endpoints.runtime_dir) and of the W&B drop-in's media files (media.py).

A fixed name in a world-writable directory (/tmp/telemetry-<uid>) can be taken first by any
other local user (`mkdir -m700` after a reboot or a /tmp clean); then nothing of ours can go
there. So the directory is the first of these that no other user can decide:

    $XDG_RUNTIME_DIR/telemetry        when $XDG_RUNTIME_DIR is a directory of ours, 0700
                                      (systemd's per-user /run/user/<uid>)
    <cache>/telemetry/<host>          when it exists already (a fallback made earlier, below)
    $TMPDIR/telemetry-<uid>           when it is ours, or missing (we make it); $TMPDIR unset: /tmp
    <cache>/telemetry/<host>          when that name is taken by someone else (made now)

<cache> is $XDG_CACHE_HOME, else $HOME/.cache; <host> the host name (a home shared over NFS
serves many hosts: each keeps its own sockets). Once the fallback exists it is chosen before
/tmp, so a squatter who gives the name up again cannot split a user's processes between two
directories. Every process of a run (ranks, an autostarted daemon, `telemetry status`, the
consumers) makes the same choice from the same environment; `telemetry run` also hands its
processes the directory it chose ($TELEMETRY_RUNTIME_DIR).
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from telemetry.shared.endpoints import UnsafePathError, private_dirs

ENV_XDG_RUNTIME = "XDG_RUNTIME_DIR"
# A unix socket's path holds at most 107 bytes: a long host name is shortened to keep the
# fallback's sockets (<cache>/telemetry/<host>/<run>/control.sock) within it.
MAX_HOST_CHARS = 24


def user_dir(create: bool = False) -> Path:
    """The user's private directory (see the module's docstring); made 0700, with the parents
    it needs, when `create`. UnsafePathError, one line, when none can be had: the name in the
    temporary directory is another user's and there is no home to fall back to."""
    chain, kind = _choose()
    if not create:
        return chain[-1]
    try:
        return _make(chain, kind)
    except UnsafePathError:
        if kind != "tmp" or _ours(chain[0]) is not False:
            raise
    # Another user made the name between our look and our mkdir: the fallback now.
    chain, kind = _choose()
    return _make(chain, kind)


def _make(chain: tuple[Path, ...], kind: str) -> Path:
    if kind == "home":
        _make_cache_parent(chain[0])
    return private_dirs(*chain)


def _choose() -> tuple[tuple[Path, ...], str]:
    """(the directories to make, outermost first, the last one being the user's directory;
    which choice it is: "xdg", "home" or "tmp")."""
    xdg = os.environ.get(ENV_XDG_RUNTIME, "")
    if os.path.isabs(xdg) and _ours(Path(xdg), private=True):
        return (Path(xdg) / "telemetry",), "xdg"
    fallback = _fallback()
    if fallback is not None and _ours(fallback[-1]):
        return fallback, "home"
    tmp_name = _tmp_root() / f"telemetry-{os.getuid()}"
    if _ours(tmp_name) is not False:
        return (tmp_name,), "tmp"
    if fallback is None:
        raise UnsafePathError(
            f"{tmp_name} is not a directory of ours (another user took the name) and there is no home "
            f"directory to use instead "
            f"($HOME unset or not absolute); set $TELEMETRY_RUNTIME_DIR to a private directory")
    return fallback, "home"


def _tmp_root() -> Path:
    tmp = os.environ.get("TMPDIR", "")
    return Path(tmp) if os.path.isabs(tmp) else Path("/tmp")


def _fallback() -> tuple[Path, Path] | None:
    """(<cache>/telemetry, <cache>/telemetry/<host>), or None without a usable home."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home) or home == "/":
            return None
        cache = os.path.join(home, ".cache")
    host = os.uname().nodename or "localhost"
    if len(host) > MAX_HOST_CHARS or "/" in host or host in (".", ".."):
        digest = hashlib.blake2b(host.encode(), digest_size=4).hexdigest()
        host = host.replace("/", "_")[:MAX_HOST_CHARS - 9] + "-" + digest
    base = Path(os.path.abspath(cache)) / "telemetry"
    return base, base / host


def _ours(path: Path, private: bool = False) -> bool | None:
    """True: a real directory (no symlink) owned by us (and, when `private`, 0700 or
    tighter); None: nothing there; False: anything else (another user's, a file, a link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    return not (private and stat.S_IMODE(st.st_mode) & 0o077)


def _make_cache_parent(base: Path) -> None:
    """<cache> itself (~/.cache) when it is missing, 0700; an existing one is left as it is
    (private_dirs checks that no other user can write it)."""
    try:
        os.makedirs(base.parent, 0o700, exist_ok=True)
    except OSError as exc:
        raise UnsafePathError(f"cannot make {base.parent}: {exc.strerror or exc}; set $TELEMETRY_RUNTIME_DIR "
                              f"to a private directory") from None
