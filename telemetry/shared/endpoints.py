"""Where the sockets are: defaults shared by the client, the daemon and the consumers.

Precedence: an explicit argument, then the environment ($TELEMETRY_ENDPOINT, $TELEMETRY_PUB,
$TELEMETRY_CONTROL), then ipc sockets in a private per-run directory:
    $TELEMETRY_RUNTIME_DIR, else <the user's private directory>/<run>   (mode 0700)
(userdir.py: $XDG_RUNTIME_DIR/telemetry, else $TMPDIR or /tmp/telemetry-<uid> unless another
user took that name, then ~/.cache/telemetry/<host>), where <run> is $TELEMETRY_RUN_NAME or
"default". A TCP endpoint given as a bare port or "tcp://*:P" binds to 127.0.0.1: listening
beyond loopback is an explicit choice (tcp://0.0.0.0:P).

A rank's ingest socket with $TELEMETRY_AUTOSTART=1, or an integration's unless =0 (its job starts
its own daemon), and none of those set is its job's: <the user's private directory>/job-<key> (job_runtime_dir), so that two
jobs of one user never send to one daemon; unless a daemon started by hand serves "default".
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

ENV_INGEST = "TELEMETRY_ENDPOINT"
ENV_PUB = "TELEMETRY_PUB"
ENV_CONTROL = "TELEMETRY_CONTROL"
ENV_RUNTIME_DIR = "TELEMETRY_RUNTIME_DIR"
# In a `telemetry run` launch's runtime directory: the run its daemon serves, claimed by the
# first process of the script that names one (telemetry.wandb._launch_takes).
LAUNCH_CLAIM_FILE = "wandb_run.id"
ENV_RUN_NAME = "TELEMETRY_RUN_NAME"
ENV_DISABLED = "TELEMETRY_DISABLED"
ENV_AUTOSTART = "TELEMETRY_AUTOSTART"
# What $TELEMETRY_DISABLED may say for "not disabled" (any other value disables).
_NOT_DISABLED = ("", "0", "false", "no", "off")


def telemetry_disabled() -> bool:
    """$TELEMETRY_DISABLED, read one way by the client and by autostart: set to anything but
    empty, 0, false, no or off (any case), telemetry is off (a client that sends nothing)."""
    return os.environ.get(ENV_DISABLED, "").strip().lower() not in _NOT_DISABLED


def autostart_setting() -> bool | None:
    """$TELEMETRY_AUTOSTART, read one way by autostart and by resolve: True ("1", "true", "yes",
    "on"), False ("0", "false", "no", "off"), None (unset or anything else: the caller's default)."""
    value = os.environ.get(ENV_AUTOSTART, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    return None


_SOCKET_FILES = {"ingest": "ingest.sock", "pub": "pub.sock", "control": "control.sock"}
_ENV = {"ingest": ENV_INGEST, "pub": ENV_PUB, "control": ENV_CONTROL}


class EndpointError(ValueError):
    pass


class UnsafePathError(EndpointError):
    """An ipc endpoint's directory (or socket) that another local user owns or could change."""


def runtime_dir(create: bool = False) -> Path:
    """The private directory holding the default ipc sockets; made 0700 when `create`.

    Made and checked without following symlinks: every directory on its path must be owned by
    this user or root and writable by nobody else (a sticky one like /tmp excepted), and the
    directories we make must be ours and 0700; anything else raises EndpointError. Another local
    user could otherwise swap the directory, read the records (and the hello's config) or plant
    a socket of their own for a trainer to send to.
    """
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        path = Path(os.path.abspath(explicit))
    else:
        from telemetry.shared.userdir import user_dir

        run = os.environ.get(ENV_RUN_NAME) or "default"
        if "/" in run or run in (".", ".."):
            raise UnsafePathError(f"${ENV_RUN_NAME} {run!r}: a run name cannot contain '/'")
        path = user_dir(create=create) / run
    if create:
        private_dirs(path, named=bool(explicit))
    return path


def private_dirs(*dirs: Path, create: bool = True, named: bool = False) -> Path:
    """Make `dirs` (each inside the one before) private directories of this user: their
    ancestors checked (check_parents), each made 0700 if missing, each checked without following
    symlinks (make_private). With create=False a missing one is left missing (nothing of anyone
    else's can be in it). Returns the innermost. UnsafePathError for anything another user could
    change: the runtime directory, the W&B drop-in's media directory and keygen's key directory
    all come through here. `named`: the user named them ($TELEMETRY_RUNTIME_DIR,
    $TELEMETRY_MEDIA_DIR), so one that exists may be someone's shared directory (make_private)."""
    check_parents(dirs[0])
    for p in dirs:
        if create:
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise UnsafePathError(f"cannot make {p}: {exc.strerror}") from None
        elif not os.path.lexists(p):
            break
        make_private(p, named)
    return dirs[-1]


def check_parents(path: Path) -> None:
    """Refuse a directory whose ancestors another user could change: each must be a real
    directory (not a symlink another user owns), owned by this user or root, and writable by
    nobody else unless it is sticky (/tmp: others cannot rename or delete our entries there)."""
    uid = os.getuid()
    for parent in reversed(Path(os.path.abspath(path)).parents):
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            raise UnsafePathError(f"{parent} does not exist (needed for {path})") from None
        except OSError as exc:       # EACCES: under another user's directory
            raise UnsafePathError(f"cannot look at {parent} ({exc.strerror}); refusing to use {path}") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (uid, 0):
                raise UnsafePathError(f"{parent} is a symlink owned by another user; refusing to use {path}")
            check_parents(Path(os.path.realpath(parent)) / "x")
            continue
        if st.st_uid not in (uid, 0):
            raise UnsafePathError(f"{parent} is owned by another user (uid {st.st_uid}), who could swap "
                                f"{path}; refusing to use it")
        if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(f"{parent} is writable by other users, who could swap {path}; "
                                f"refusing to use it")


def make_private(path: Path, named: bool = False) -> None:
    """`path` must be a directory of ours, not a symlink; it is made 0700 through a descriptor
    opened without following links, so a link swapped in meanwhile is never chmod-ed. One the
    user `named` that others may enter and that already holds something is refused, never
    chmod-ed: it is someone's shared directory (/run, a project's directory, named by mistake),
    and making it private would lock them out of what is in it (as root, every directory is
    "ours"); an empty one was made for us and is made private."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        what = "is a symlink or not a directory" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        raise UnsafePathError(f"{path} {what}; refusing to use it") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise UnsafePathError(f"{path} is not owned by this user (uid {st.st_uid}); refusing to use it")
        if st.st_mode & stat.S_ISVTX:
            # A shared directory (sticky, like /tmp, root's as much as ours when we run as root):
            # never made private, which would lock every other user out of it.
            raise UnsafePathError(f"{path} is a shared directory (sticky); give a directory of its own")
        mode = stat.S_IMODE(st.st_mode)
        if named and mode & 0o077 and os.listdir(fd):
            raise UnsafePathError(f"{path} is open to other users (mode {mode:o}) and not empty: refusing to make "
                                  f"it private; give a directory of its own (or `chmod 700` it)")
        if mode != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def check_ipc(ep: str) -> None:
    """An ipc endpoint's directory must be private (see runtime_dir), and a socket file already
    there must be ours: a socket in a directory others can write to could be theirs."""
    if not ep.startswith("ipc://"):
        return
    sock_path = Path(os.path.abspath(ep[len("ipc://"):]))
    directory = sock_path.parent
    check_parents(directory)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return        # nothing there yet: the daemon makes it (a client's connect waits for it)
    except OSError as exc:
        raise UnsafePathError(f"cannot look at {directory} ({exc.strerror}); refusing {ep}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{directory} is a symlink or not a directory; refusing {ep}")
    if st.st_uid != os.getuid():
        raise UnsafePathError(f"{directory} is not owned by this user (uid {st.st_uid}); refusing {ep}")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UnsafePathError(f"{directory} is writable by other users; refusing {ep} (use a private "
                            f"directory, e.g. the default ${ENV_RUNTIME_DIR})")
    try:
        st = os.lstat(sock_path)
    except FileNotFoundError:
        return
    if st.st_uid != os.getuid():
        raise UnsafePathError(f"{sock_path} belongs to another user (uid {st.st_uid}); refusing {ep}")


# ipc paths this process serves, with the lock that keeps a second daemon off them.
_claimed: dict[str, int] = {}


def claim_ipc(ep: str) -> None:
    """Before binding an ipc endpoint: take `<path>.lock` (flock, held for the process's life)
    so that a second daemon on the same sockets refuses to start instead of silently taking them
    over (binding unlinks the first one's socket file and orphans it). The same path given for
    two sockets of one daemon is refused too."""
    if not ep.startswith("ipc://"):
        return
    import fcntl

    path = os.path.abspath(ep[len("ipc://"):])
    if path in _claimed:
        raise EndpointError(f"{ep} is given for two sockets; each needs its own path")
    check_ipc(ep)
    lock = path + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise EndpointError(f"cannot open {lock}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise EndpointError(f"another telemetry daemon (pid {holder}) is serving {ep}; refusing to take "
                            f"over its sockets (stop it, or give this one other endpoints)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _claimed[path] = fd


def release_ipc(eps) -> None:
    """Drop the claims on these endpoints (a daemon's shutdown; the process's exit does it too)."""
    for ep in eps:
        path = os.path.abspath(ep[len("ipc://"):]) if ep.startswith("ipc://") else None
        fd = _claimed.pop(path, None)
        if fd is None:
            continue
        try:
            os.unlink(path + ".lock")
        except OSError:
            pass
        os.close(fd)


def resolve(which: str, explicit: str | None = None, create_dir: bool = False, job: bool = True) -> str:
    """The endpoint for 'ingest', 'pub' or 'control'. An ipc endpoint is checked (check_ipc)
    for every side: the daemon binding it, a rank sending to it, a consumer attaching. A rank's
    default ingest socket is its job's when it starts its own daemon (job_runtime_dir); `job`
    False: the node's default (a daemon started by hand binds there)."""
    ep = explicit or os.environ.get(_ENV[which])
    if not ep:
        directory = job_runtime_dir(create=create_dir) if job and which == "ingest" else None
        ep = "ipc://" + str((directory or runtime_dir(create=create_dir)) / _SOCKET_FILES[which])
    else:
        ep = normalize(ep)
    check_ipc(ep)
    return ep


JOB_DIR_PREFIX = "job-"


def job_runtime_dir(create: bool = False, default_on: bool = False) -> Path | None:
    """The runtime directory of this process's job (`job-<key>` in the user's private directory,
    shared/job.py; made 0700 when `create`), where a client that starts its own daemon sends and
    starts it: a bare client with $TELEMETRY_AUTOSTART=1, an integration's (HF, Lightning,
    Accelerate: autostart is on unless =0, `default_on`). The ranks of one launch meet there, and
    two jobs of one user never do. None, for the node's default directory, when autostart is not
    on, when $TELEMETRY_ENDPOINT, $TELEMETRY_RUNTIME_DIR or $TELEMETRY_RUN_NAME names where the
    processes meet, and when a daemon serves the default directory (one started by hand takes
    every job's records, as before)."""
    setting = autostart_setting()
    if setting is False or (setting is None and not default_on):
        return None
    if os.environ.get(ENV_INGEST) or os.environ.get(ENV_RUNTIME_DIR) or os.environ.get(ENV_RUN_NAME):
        return None
    from telemetry.shared.job import job_key
    from telemetry.shared.userdir import user_dir

    base = user_dir(create=create)
    if daemon_serves(base / "default"):
        return None
    path = base / f"{JOB_DIR_PREFIX}{job_key()}"
    if len(str(path / _SOCKET_FILES["control"])) > 107:       # the unix-socket limit (normalize)
        import hashlib

        path = base / f"{JOB_DIR_PREFIX}{hashlib.sha256(path.name.encode()).hexdigest()[:12]}"
    return private_dirs(path) if create else path


def where(which: str, explicit: str | None = None, flag: str = "") -> str:
    """Where resolve(which, explicit) looked and how to point it elsewhere, in words: the hint a
    consumer prints when nothing answers there. `flag`: the command's option for the endpoint."""
    if explicit:
        return f"(from {flag or 'the command line'})"
    if os.environ.get(_ENV[which]):
        return f"(from ${_ENV[which]})"
    point = f"{flag} EP or ${_ENV[which]}" if flag else f"${_ENV[which]}"
    if os.environ.get(ENV_RUNTIME_DIR):
        return (f"(in ${ENV_RUNTIME_DIR}; a run started by `telemetry run` prints its own directory: point "
                f"there with ${ENV_RUNTIME_DIR}=DIR, or give {point})")
    run = os.environ.get(ENV_RUN_NAME) or "default"
    others = _runs_with_sockets(which, exclude=run)
    found = ("; sockets there for: " + ", ".join(
        f"{ENV_RUNTIME_DIR}={d}" for d in others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
             ) if others else ""
    return (f"(the default for run {run!r}, ${ENV_RUN_NAME}, in this user's private directory; "
            f"${ENV_RUNTIME_DIR} unset: a run started by `telemetry run` has its own directory, which it "
            f"prints: point there with ${ENV_RUNTIME_DIR}=DIR, or give {point}{found})")


def _runs_with_sockets(which: str, exclude: str) -> list[str]:
    """The run directories in the user's private directory that hold a `which` socket and a live
    daemon (its daemon.lock held: a directory whose daemon was SIGKILLed answers no one), newest
    first (without making anything)."""
    from telemetry.shared.userdir import user_dir

    try:
        base = user_dir()
        found = [(p.stat().st_mtime, str(p.parent)) for p in base.glob(f"*/{_SOCKET_FILES[which]}")
                 if p.parent.name != exclude and daemon_serves(p.parent)]
    except (OSError, EndpointError):
        return []
    return [d for _, d in sorted(found, reverse=True)]


def normalize(ep: str) -> str:
    """Accept 'PORT', 'tcp://*:PORT', 'ipc://path', 'tcp://host:port'; loopback by default."""
    ep = ep.strip()
    if ep.isdigit():
        ep = f"tcp://127.0.0.1:{ep}"
    if ep.startswith("tcp://*:"):
        ep = "tcp://127.0.0.1:" + ep[len("tcp://*:"):]
    if not ep.startswith(("tcp://", "ipc://", "inproc://")):
        raise EndpointError(f"endpoint {ep!r}: expected tcp://HOST:PORT, ipc://PATH or a port number")
    if ep.startswith("ipc://"):
        if ep.startswith("ipc://@"):
            raise EndpointError(f"{ep}: abstract unix sockets have no permissions (any local user can "
                                f"connect); use ipc:///a/path in a private directory")
        if len(ep) - len("ipc://") > 107:
            raise EndpointError(f"ipc path too long for a unix socket (max 107 bytes): {ep}")
    if ep.startswith("tcp://"):
        port = ep.rsplit(":", 1)[-1]
        if port != "*" and not (port.isdigit() and 0 <= int(port) <= 65535):
            raise EndpointError(f"endpoint {ep!r}: the port must be a number from 0 to 65535")
        host = ep[len("tcp://"):].rsplit(":", 1)[0]
        if not host:
            raise EndpointError(f"endpoint {ep!r}: no host (tcp://HOST:PORT)")
        if host.replace(".", "").isdigit():   # an IPv4 literal, not a name libzmq would look up
            import ipaddress

            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise EndpointError(f"endpoint {ep!r}: {host} is not an IPv4 address") from None
    return ep


def endpoint_arg(text: str) -> str:
    """An argparse `type=` for an endpoint flag: normalized, or argparse's one-line error and
    exit 2 before anything is set up (an empty --ingest "" is not "the default")."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("an endpoint is needed: tcp://HOST:PORT, ipc://PATH or a port number")
    if text.strip().startswith("inproc://"):
        # In-process only: no rank, daemon or consumer in another process could ever reach it.
        raise argparse.ArgumentTypeError(f"endpoint {text!r}: inproc:// reaches nothing outside this process; "
                                         f"expected tcp://HOST:PORT, ipc://PATH or a port number")
    try:
        return normalize(text)
    except EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tcp_host(ep: str) -> str:
    """The host of a tcp:// endpoint, without its port and an IPv6 literal's brackets ("" for
    any other endpoint)."""
    if not ep.startswith("tcp://"):
        return ""
    host = ep[len("tcp://"):].rsplit(":", 1)[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def is_loopback(ep: str) -> bool:
    """Whether an endpoint stays on this machine: ipc, or tcp to a loopback host (is_loopback_host)."""
    if not ep.startswith("tcp://"):
        return True
    return is_loopback_host(tcp_host(ep))


def is_loopback_host(host: str) -> bool:
    """Whether `host` (no port, no brackets) is a loopback address or `localhost`: an IPv4
    literal in 127.0.0.0/8 in any form a browser or inet_aton reads (127.0.0.1, 127.1,
    0x7f.0.0.1, 2130706433), ::1 in any IPv6 form, ::ffff:127.x.y.z. A name that merely
    starts like one (127.0.0.1.nip.io, 127.attacker.example) is a DNS name anyone can point
    at this machine, which is how DNS rebinding reaches a loopback port: never loopback."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    v4 = _ipv4_literal(host)
    if v4 is not None:
        return v4 >> 24 == 127
    try:
        ip = ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return ip.is_loopback or (ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def _ipv4_literal(host: str) -> int | None:
    """The address an IPv4 literal spells, as inet_aton and a browser read one (1 to 4 parts,
    each decimal, 0x-hex or 0-octal, the last filling the remaining bytes), else None. No
    trailing dot: "127.0.0.1." is a DNS name to a resolver."""
    import string

    parts = host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        if part[:2].lower() == "0x":
            digits, base = part[2:] or "0", 16
        elif len(part) > 1 and part.startswith("0"):
            digits, base = part[1:], 8
        else:
            digits, base = part, 10
        if not digits or not set(digits) <= set(string.hexdigits if base == 16 else string.digits[:base]):
            return None     # also what int() would take and a browser would not: signs, spaces, "_"
        numbers.append(int(digits, base))
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    return sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last


# A daemon whose ingest socket is in a runtime directory holds this file locked (flock) for its
# life: whoever would start one for the node (telemetry/client/autostart.py) sees it runs, and
# the lock goes with the process, however it ends (no stale pid file).
DAEMON_LOCK_FILE = "daemon.lock"


def _lock_fd(path: Path, create: bool) -> int | None:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        return None
    return fd


def _flock(path: Path, create: bool, exclusive: bool) -> tuple[int | None, bool]:
    """(descriptor holding the lock, or None; whether another process holds it)."""
    import fcntl

    fd = _lock_fd(path, create)
    if fd is None:
        return None, False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None, True
    return fd, False


def hold_daemon_lock(directory: Path) -> int | None:
    """Lock `directory`/daemon.lock for this process's life; its descriptor (keep it open), or
    None when another process holds it (a daemon already serves this directory) or it cannot
    be made."""
    return _flock(directory / DAEMON_LOCK_FILE, create=True, exclusive=True)[0]


def daemon_serves(directory: Path) -> bool:
    """Whether a live daemon holds `directory`/daemon.lock."""
    fd, held = _flock(directory / DAEMON_LOCK_FILE, create=False, exclusive=False)
    if fd is not None:
        os.close(fd)
    return held
