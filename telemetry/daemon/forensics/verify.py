"""Which processes the daemon may signal or read: this run's local ranks, verified from /proc.

A hello is a claim from the network, never an instruction. Loopback TCP is open to every local
user, and a node daemon on --remote-ingest speaks on the same socket as the local ranks: a hello
naming a pid, a signal and a file could be anyone's. So the daemon takes no pid, signal or path
from the wire to act on. For each hello that claims a rank on this host it checks itself, in
/proc, that the claim is true (`Verifier.verify`):

    pid          a process (not a thread id) that exists, whose real and effective uid are the
                 daemon's own
    start_time   field 22 of /proc/<pid>/stat equals the hello's (the client sends its own): the
                 pid was not reused; a hello without it (an older client) is not verified
    stacks file  among the process's own open descriptors (/proc/<pid>/fd), the file of the fixed
                 name stacks-rank<rank>-pid<pid>.txt (telemetry/shared/stacks_file.py): a regular
                 file owned by the daemon's uid, opened O_RDONLY|O_NOFOLLOW|O_NONBLOCK and the
                 same dev/inode the process holds; its first line, written by the process itself,
                 must name this rank and pid. Only that process (or another of our uid) can have
                 made it, so a hello can name a process only as the rank it says it is
    this daemon  on TCP ingest the process holds a connection to the daemon's ingest address and
                 port (its socket inodes against /proc/net/tcp and tcp6); on ipc one whose peer
                 is this daemon's ingest socket (sock_diag, the kernel's own record of the pair;
                 without sock_diag: the stacks file lies in the ingest socket's private runtime
                 directory); a connection to the remote ingest never counts
    the signal   from that first line, never the wire's; sent only if it is in SAFE_SIGNALS
                 (SIGUSR1, SIGUSR2, SIGRTMIN..SIGRTMAX) and /proc/<pid>/status SigCgt says the
                 process catches it, checked again just before it is sent (through a pidfd, so
                 the signal reaches the process that was checked): its default action, the end of
                 the process, never follows

A hello that says it comes from a node daemon (forwarded_by, node_rank) or from another host is
never a local rank; one that claims this host is believed only as above, so a forwarded hello
can at most name one of this run's own ranks as itself, which that rank's hello already did.
Everything the daemon does to a process (the stacks signal, reading its stacks file, py-spy,
its psutil state, the host poller's per-rank figures, the rank_exited check) is for verified
local ranks only; /proc/<pid>/environ, or any path from the wire, is never read.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import stat
import struct
import time
from dataclasses import dataclass

from telemetry.shared import stacks_file
from telemetry.shared.numbers import is_int

# Linux's largest pid_max (2^22): a claimed pid beyond (or <= 0) names no process.
MAX_PID = 1 << 22
# The most descriptors of a process looked at for its stacks file and sockets (a training
# process holds a few hundred; bounded so a process with a million costs a bounded time).
MAX_FDS_SCANNED = 16384
# Verification results kept per (rank, pid, start time), and for how long: a flood of hellos
# that name the same process costs one look in /proc per interval.
CACHE_TTL_S = 5.0
CACHE_MAX = 4096
_TCP_ESTABLISHED = "01"
# The most of /proc/<pid>/maps read (a training process with CUDA maps a few thousand regions,
# about 100 bytes a line).
MAX_MAPS_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class LocalRank:
    """A process verified as one of this run's ranks on this host."""
    rank: int
    pid: int
    start_time: int
    stacks_path: str              # where the process's stacks file was (read back by dev/inode)
    stacks_dev_ino: tuple[int, int]
    stacks_signal: int | None     # None: no signal to send (stacks_unavailable says why)
    stacks_unavailable: str = ""


def claims_this_host(info: dict, host: str) -> bool:
    """The hello says it is a rank of this host (not a node daemon's, not another host's)."""
    if "forwarded_by" in info or "node_rank" in info:
        return False
    return info.get("host") in (None, host) and is_int(info.get("pid"))


def read_status(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def catches(status: dict[str, str], sig: int) -> bool:
    """/proc/<pid>/status SigCgt: the process has a handler for `sig` (bit sig - 1)."""
    try:
        return bool(int(status.get("SigCgt", "0"), 16) >> (sig - 1) & 1)
    except ValueError:
        return False


def same_process(pid: int, start_time: int) -> bool:
    """The pid still names the process that was verified (not gone, not reused)."""
    return stacks_file.proc_start_time(pid) == start_time


def open_stacks(rank: LocalRank) -> int:
    """A read-only descriptor of the verified rank's stacks file: opened without following a
    symlink or blocking, and the same dev/inode as verified; raises OSError otherwise."""
    fd = os.open(rank.stacks_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != rank.stacks_dev_ino \
                or st.st_uid != os.geteuid():
            raise OSError(f"{rank.stacks_path} is no longer the file rank {rank.rank} holds")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Verifier:
    """Checks hellos' claims against /proc (see the module's docstring). Runs on the forensics
    stage's thread, never on the daemon's loop: a look costs about a millisecond."""

    def __init__(self, ingest: str, host: str) -> None:
        self.uid = os.geteuid()
        self.host = host
        self.ingest = ingest
        self._cache: dict[tuple[int, int, int], tuple[float, LocalRank | str]] = {}
        self.num_verified = 0
        self.num_refused = 0

    def verify(self, rank: int, info: dict) -> LocalRank | str:
        """The verified rank, or why the hello's claim was not believed."""
        pid, start = info.get("pid"), info.get("start_time")
        if type(pid) is not int or not 0 < pid <= MAX_PID:
            return "no pid of this host"
        if type(start) is not int or start < 0:
            return "no start_time in the hello (an older client): not verified"
        key = (rank, pid, start)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_TTL_S:
            return hit[1]
        try:
            result = self._verify(rank, pid, start)
        except (OSError, ValueError, struct.error) as exc:   # /proc changed under us (it exited)
            result = f"{type(exc).__name__}: {exc}"
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = (now, result)
        if isinstance(result, LocalRank):
            self.num_verified += 1
        else:
            self.num_refused += 1
        return result

    def _verify(self, rank: int, pid: int, start: int) -> LocalRank | str:
        status = read_status(pid)
        if status is None:
            return f"pid {pid}: no such process"
        if status.get("Tgid") != str(pid):
            return f"pid {pid} is a thread, not a process"
        uids = status.get("Uid", "").split()
        if len(uids) < 2 or uids[0] != str(self.uid) or uids[1] != str(self.uid):
            return f"pid {pid} runs as uid {uids[:2]}, not the daemon's {self.uid}"
        if stacks_file.proc_start_time(pid) != start:
            return f"pid {pid} did not start at {start} (the pid was reused, or the claim is false)"
        name = stacks_file.file_name(rank, pid)
        found, sockets = None, set()
        fd_dir = f"/proc/{pid}/fd"
        for n, fd in enumerate(os.listdir(fd_dir)):
            if n >= MAX_FDS_SCANNED:
                break
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(int(target[8:-1]))
            elif found is None and os.path.basename(target) == name and target.startswith("/"):
                found = (fd, target)
        if found is None:
            return f"pid {pid} holds no {name} open (not a telemetry client of rank {rank})"
        held = os.stat(f"{fd_dir}/{found[0]}")          # what the process holds, whatever its path
        fd = os.open(found[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
                return f"pid {pid}: {found[1]} is not the file it holds"
            if st.st_uid != self.uid:
                return f"pid {pid}: {found[1]} belongs to uid {st.st_uid}"
            first = os.pread(fd, stacks_file.HEADER_MAX_BYTES, 0)
        finally:
            os.close(fd)
        header = stacks_file.parse_header(first)
        if header is None or header[:2] != (rank, pid):
            return f"pid {pid}: {found[1]} does not say rank {rank}, pid {pid}"
        if not self._connected(pid, sockets, found[1]):
            return f"pid {pid} holds no connection to this daemon's ingest {self.ingest}"
        sig, why = header[2] or None, ""
        if sig is None:
            why = "the client registered no stacks signal"
        elif sig not in stacks_file.SAFE_SIGNALS:
            sig, why = None, f"signal {header[2]} is not one the daemon sends"
        elif not catches(status, sig):
            sig, why = None, f"the process does not catch signal {header[2]}"
        return LocalRank(rank, pid, start, found[1], (st.st_dev, st.st_ino), sig, why)

    # -- is it a client of this daemon ---------------------------------------------------------
    def _connected(self, pid: int, inodes: set[int], stacks_path: str) -> bool:
        if self.ingest.startswith("tcp://"):
            return _tcp_connected(self.ingest, inodes)
        if self.ingest.startswith("ipc://"):
            path = self.ingest[len("ipc://"):]
            try:
                if _unix_connected(path, inodes):
                    return True
            except OSError:
                # No sock_diag here (a kernel without unix_diag, a sandbox): the client's default
                # stacks directory is the ingest socket's, the run's private runtime directory,
                # where only our uid can have made a file.
                if os.path.dirname(stacks_path) == os.path.dirname(os.path.abspath(path)):
                    return True
            # A client writing a record ring sends its hello before its socket has connected
            # (libzmq connects in the background): the page and ring it maps, made in this
            # ingest's own 0700 directory, say whose client it is.
            return _maps_a_page(pid, os.path.abspath(path) + ".clients", self.uid)
        return False


def _maps_a_page(pid: int, directory: str, uid: int) -> bool:
    """The process maps a regular file of `uid` in `directory` (an ipc ingest's pages and rings,
    telemetry/shared/client_page.py), the directory being `uid`'s alone: it opened a page of
    that daemon's clients, which only `uid` can have made there. Read from /proc/<pid>/maps, the
    file matched by its device and inode, not only by its name."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
        return False
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read(MAX_MAPS_BYTES)
    except OSError:
        return False
    prefix = os.fsencode(directory.rstrip("/") + "/")
    if prefix not in data:
        return False
    for line in data.split(b"\n"):
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith(prefix):
            continue
        name = fields[5][len(prefix):]
        if b"/" in name or name.endswith(b" (deleted)"):
            continue
        try:
            major, minor = (int(x, 16) for x in fields[3].split(b":"))
            ino = int(fields[4])
            held = os.lstat(fields[5])
        except (OSError, ValueError):
            continue
        if (stat.S_ISREG(held.st_mode) and held.st_uid == uid and held.st_ino == ino
                and (os.major(held.st_dev), os.minor(held.st_dev)) == (major, minor)):
            return True
    return False


def _tcp_connected(endpoint: str, inodes: set[int]) -> bool:
    """One of `inodes` is an established TCP connection to the endpoint's address and port."""
    host, _, port_text = endpoint[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        want = None if host in ("*", "0.0.0.0", "::") else _unmapped(ipaddress.ip_address(host))
    except ValueError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != _TCP_ESTABLISHED or int(fields[9]) not in inodes:
                        continue
                    addr, _, rport = fields[2].partition(":")
                    if int(rport, 16) == port and (want is None or _proc_addr(addr) == want):
                        return True
        except (OSError, ValueError):
            continue
    return False


def _proc_addr(hexaddr: str):
    """An address of /proc/net/tcp{,6}: 32-bit words in the host's byte order."""
    raw = bytes.fromhex(hexaddr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if _little_endian() else raw
    return _unmapped(ipaddress.ip_address(raw))


def _unmapped(ip):
    return getattr(ip, "ipv4_mapped", None) or ip


def _little_endian() -> bool:
    return struct.pack("=I", 1)[0] == 1


# sock_diag (linux/sock_diag.h, linux/unix_diag.h): the kernel lists each unix socket with its
# bound name and its peer's inode, the pairing that /proc/net/unix does not show.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_UDIAG_SHOW_NAME, _UDIAG_SHOW_PEER = 0x1, 0x4
_UNIX_DIAG_NAME, _UNIX_DIAG_PEER = 0, 2
_MAX_DIAG_BYTES = 64 << 20


def _unix_connected(path: str, inodes: set[int]) -> bool:
    """One of `inodes` is a unix socket whose peer is bound to `path` (a connection this daemon
    accepted on its ipc ingest: accepted sockets carry the listener's name). Raises OSError
    where the kernel does not answer sock_diag."""
    table = _unix_sockets()
    want = os.fsencode(path)
    for ino in inodes:
        entry = table.get(ino)
        peer = table.get(entry[1]) if entry and entry[1] else None
        if peer is not None and peer[0] == want:
            return True
    return False


def _unix_sockets() -> dict[int, tuple[bytes, int]]:
    """inode -> (bound name, peer inode) of every unix socket in this network namespace."""
    req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_NAME | _UDIAG_SHOW_PEER,
                      0xFFFFFFFF, 0xFFFFFFFF)
    out: dict[int, tuple[bytes, int]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as s:
        s.settimeout(2.0)
        s.sendto(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
                 + req, (0, 0))
        total = 0
        while True:
            data = s.recv(1 << 16)
            total += len(data)
            if not data or total > _MAX_DIAG_BYTES:
                return out
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR or length < 16:
                    raise OSError("sock_diag refused the request")
                end = off + length
                ino = struct.unpack_from("=I", data, off + 16 + 4)[0]       # unix_diag_msg.udiag_ino
                name, peer = b"", 0
                a = off + 16 + 16
                while a + 4 <= end:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    body = data[a + 4:a + alen]
                    if atype == _UNIX_DIAG_NAME:
                        name = body.rstrip(b"\0")
                    elif atype == _UNIX_DIAG_PEER and len(body) >= 4:
                        peer = struct.unpack_from("=I", body)[0]
                    a += (alen + 3) & ~3
                out[ino] = (name, peer)
                off += (length + 3) & ~3
