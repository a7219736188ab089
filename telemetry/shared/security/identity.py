"""Which node a CURVE key speaks for: the allow-list's bindings, and the head's check of each frame.

A head admits node daemons (or group heads) whose public key is in its allow-list directory
(`security.allowed_clients_dir`). Being admitted is not being any node: each allowed key is bound
to the one node it belongs to, and the head takes from a key's connection only records that speak
as that node. The binding is written by `telemetry keygen --allow` into the allowed copy of the
public key (a zmq certificate file), as metadata:

    metadata
        node_rank = "3"
    curve
        public-key = "..."

`node_rank` is the record rank the key's records carry: a node daemon's `forward.node_rank`, or a
group head's group number on the job head. An allowed key without the line (an allow-list made
before keygen wrote it) is bound to the number its file name ends in (node3.key -> 3), which is
what keygen was always given (`--name node3`) and was said in the same directory, by the same
hand, as the key itself; the head says so once in a warning. A key whose name ends in no number,
or one allowed twice for two nodes, speaks for no node: it may still subscribe or ask for status
where CURVE admits it, but a remote ingest takes none of its records.

The head's side (`NodeGuard`): the remote ingest listener has its own ZAP domain (NODE_DOMAIN), for
which the ZAP handler returns, as the connection's User-Id, "n/" + the key's name. libzmq attaches
that to every message of the connection; the guard reads it per frame (a receive without copy:
benchmarks/identity_cost.py) and refuses a frame whose header rank is not the key's node, whose
`src` was first seen from another node, or (a hello or an event: rare frames) whose node_rank or
group_rank says another node. A node's metrics records begin with the same bytes (kind, version,
src, rank): once one passed, the next that starts alike passes on that one compare. A refused frame reaches nothing (no accounting, no aggregate, no
event); it is counted per key (`security.identity_refused`, `telemetry/identity_refused`). Frames
without a User-Id (local ipc ranks, plain loopback) and those of other domains pass unchecked.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import msgspec
import zmq

from protocol.codec import peek_header
from protocol.constants import KIND_EVENT, KIND_HELLO, KIND_METRICS, PROTOCOL_VERSION

log = logging.getLogger("telemetry.shared.security")

NODE_DOMAIN = "telemetry-nodes"      # the ZAP domain of the remote ingest listener
NODE_USER_PREFIX = "n/"              # User-Id of a node link: this + the allowed key's name
BINDING_KEY = "node_rank"            # the metadata line keygen writes into an allowed key
# Sources (a forwarder's `src`) whose node is remembered: a node has one per forwarder start.
MAX_BOUND_SOURCES = 1 << 16

_TRAILING_NUMBER = re.compile(r"(\d+)$")
_BINDING_LINE = re.compile(rb'^\s+' + BINDING_KEY.encode() + rb'\s*=\s*"?(\d+)"?\s*$', re.MULTILINE)
_LOCAL = object()                    # a User-Id that is no node link's


def rank_in_name(name: str) -> int | None:
    """The number a key's name ends in (node12 -> 12, group3 -> 3), or None."""
    m = _TRAILING_NUMBER.search(name)
    return int(m.group(1)) if m else None


def write_allowed(allow_dir: Path, public_file: Path, node_rank: int | None) -> Path:
    """Copy a public key file into the allow-list with its binding (`node_rank` metadata line);
    None: a key for no node (a remote consumer's)."""
    text = public_file.read_text()
    if node_rank is not None:
        line = f"    {BINDING_KEY} = \"{node_rank}\"\n"
        text = (text.replace("metadata\n", "metadata\n" + line, 1) if "metadata\n" in text
                else "metadata\n" + line + text)
    out = allow_dir / public_file.name
    out.write_text(text)
    return out


def _check_allow_dir(allow_dir: Path) -> None:
    """The allow-list decides which key speaks for which node: a directory another local user
    could write (or swap, through an ancestor) would let them allow a key of their own as any
    node. SecurityError, one line, unless it and its ancestors are this user's or root's and
    writable by no one else."""
    import os
    import stat

    from telemetry.shared.endpoints import UnsafePathError, check_parents
    from telemetry.shared.security.curve import SecurityError

    try:
        check_parents(allow_dir)
        st = os.lstat(allow_dir)
    except (UnsafePathError, OSError) as exc:
        raise SecurityError(f"security.allowed_clients_dir: {exc}") from None
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (os.getuid(), 0):
            raise SecurityError(f"security.allowed_clients_dir {allow_dir} is a symlink owned by another user")
        _check_allow_dir(Path(os.path.realpath(allow_dir)))
        return
    if st.st_uid not in (os.getuid(), 0) or stat.S_IMODE(st.st_mode) & 0o022:
        raise SecurityError(
            f"security.allowed_clients_dir {allow_dir} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) can be "
            f"written by another user, who could allow a key of their own as any node: make it yours and "
            f"`chmod go-w` it (telemetry keygen --allow makes it 0700)")


def _ours(path: Path) -> bool:
    """A regular file (no symlink) of this user's or root's."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid in (os.getuid(), 0)


class AllowList:
    """The allow-list directory read once: z85 key -> name, name -> node rank (None: no node)."""

    def __init__(self, location: str | Path) -> None:
        import zmq.auth

        self.names: dict[bytes, str] = {}
        self.ranks: dict[str, int | None] = {}
        from_names, unbound, twice = [], [], []
        names_of_key: dict[bytes, list[str]] = {}
        _check_allow_dir(Path(location))
        others = []
        for path in sorted(Path(location).glob("*.key")):
            if not _ours(path):
                others.append(path.name)
                continue
            try:
                public, _ = zmq.auth.load_certificate(str(path))
                raw = path.read_bytes()
            except (OSError, ValueError) as exc:
                log.warning("allow-list: cannot read %s (%s): not allowed", path, exc)
                continue
            if not public:
                continue
            name = path.stem
            m = _BINDING_LINE.search(raw)
            if m:
                rank = int(m.group(1))
            else:
                rank = rank_in_name(name)
                (from_names if rank is not None else unbound).append(name)
            self.names[public] = name
            self.ranks[name] = rank
            names_of_key.setdefault(public, []).append(name)
        for names in names_of_key.values():
            if len({self.ranks[n] for n in names}) > 1:   # one key allowed as two nodes: it is none of them
                for name in names:
                    self.ranks[name] = None
                twice += names
        if from_names:
            log.warning("allow-list %s: %d keys carry no node binding (%s): each speaks for the node its "
                        "file name ends in (node3.key: node 3); remake them with `telemetry keygen --allow` "
                        "to write it", location, len(from_names), ", ".join(from_names[:5])
                        + (", ..." if len(from_names) > 5 else ""))
        if unbound:
            log.warning("allow-list %s: %s name no node (no number at the end of the name): a remote "
                        "ingest takes none of their records", location, ", ".join(unbound[:5]))
        if twice:
            log.warning("allow-list %s: a key allowed for two nodes (%s) speaks for none", location,
                        ", ".join(twice[:5]))
        if others:
            log.warning("allow-list %s: %s not allowed: not a regular file of this user's (or root's); another "
                        "user could have put it there", location, ", ".join(others[:5]))

    def node_user_ids(self) -> dict[str, int | None]:
        """User-Id on the node listener -> the node rank its records must carry (the prefix alone:
        a key the handler could not name, bound to no node)."""
        return {NODE_USER_PREFIX: None, **{NODE_USER_PREFIX + name: rank for name, rank in self.ranks.items()}}


class _Claims(msgspec.Struct, array_like=True):
    """A hello's or event's header and its free-form map, values left encoded."""
    kind: int
    version: int
    src: int
    rank: int
    seq: int
    dropped: int
    t_ns: int
    rest: msgspec.Raw           # a hello's info; an event's name (its data follows)
    data: dict[str, msgspec.Raw] = {}


_claims = msgspec.msgpack.Decoder(_Claims)
_raw_map = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_HEADER_PREFIX = msgspec.msgpack.Encoder()


def _claimed_nodes(frame: bytes, kind: int) -> list:
    """The node ranks a hello or event says it speaks for: its group_rank if it has one, else its
    node_rank (a group head relays its nodes' events with their node_rank and its group_rank),
    and a hello's info `rank`."""
    c = _claims.decode(frame)
    fields = _raw_map.decode(c.rest) if kind == KIND_HELLO else c.data
    out = []
    key = "group_rank" if "group_rank" in fields else "node_rank"
    for k in (key, "rank") if kind == KIND_HELLO else (key,):
        if k in fields:
            out.append(msgspec.msgpack.decode(fields[k]))
    return out


class NodeGuard:
    """The remote ingest's per-frame check (see the module docstring): `recv` is the intake's
    read of one frame; it raises zmq.Again when libzmq holds none, like sock.recv(NOBLOCK)."""

    def __init__(self, sock: zmq.Socket, user_ranks: dict[str, int | None]) -> None:
        self._recv = sock.recv
        self._ranks = user_ranks
        self._src_node: dict[int, int] = {}
        self._last_ok: dict[str, bytes] = {}   # User-Id -> the header bytes of its last admitted metrics
        self.num_refused = 0
        self.refused_by_key: dict[str, int] = {}

    def recv(self) -> bytes:
        recv, rank_of, last_ok = self._recv, self._ranks.get, self._last_ok.get
        while True:
            f = recv(zmq.NOBLOCK, copy=False)
            try:
                user = f.get("User-Id")
            except zmq.ZMQError:          # no ZAP user: a local connection (ipc, plain loopback)
                return f.bytes
            rank = rank_of(user, _LOCAL)
            frame = f.bytes
            if rank is _LOCAL:
                return frame
            # A node's metrics records all begin alike (kind, version, src, rank): one compare
            # with the last one admitted from this key stands for the header checks.
            known = last_ok(user)
            if known is not None and frame.startswith(known, 1):
                return frame
            why = self._wrong_claim(frame, rank)
            if why is None:
                self._note_ok(user, frame, rank)
                return frame
            self._refuse(user[len(NODE_USER_PREFIX):], rank, why)

    def _note_ok(self, user: str, frame: bytes, rank: int) -> None:
        """Keep an admitted metrics frame's header bytes after its array header, as msgpack encodes
        them (the clients' and forwarders' encoder, msgspec, writes the shortest form)."""
        h = peek_header(frame)
        if h is not None and h[0] == KIND_METRICS and 0x90 <= frame[0] <= 0x9f:
            self._last_ok[user] = _HEADER_PREFIX.encode((KIND_METRICS, PROTOCOL_VERSION, h[1], rank))[1:]

    def _wrong_claim(self, frame: bytes, rank: int | None) -> str | None:
        """Why a frame from the key bound to node `rank` speaks as another; None if it does not."""
        if rank is None:
            return "its key is bound to no node"
        h = peek_header(frame)
        if h is None:
            return None                   # no header: malformed, counted by the receiver
        kind, src, claimed = h[0], h[1], h[2]
        if claimed != rank:
            return f"a record as node {claimed}"
        owner = self._src_node.get(src)
        if owner is None:
            # Beyond the bound a source is not remembered (its header rank is still checked): a
            # key minting sources must not cost other nodes their next forwarder's.
            if len(self._src_node) < MAX_BOUND_SOURCES:
                self._src_node[src] = rank
        elif owner != rank:
            return f"a record under node {owner}'s source"
        if kind == KIND_HELLO or kind == KIND_EVENT:
            try:
                nodes = _claimed_nodes(frame, kind)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return "a hello or event that cannot be read for its node"
            for n in nodes:
                if n != rank:
                    return f"a {'hello' if kind == KIND_HELLO else 'event'} naming node {n!r}"
        return None

    def _refuse(self, key_name: str, rank: int | None, why: str) -> None:
        self.num_refused += 1
        n = self.refused_by_key.get(key_name, 0) + 1
        self.refused_by_key[key_name] = n
        if n == 1 or n % 10_000 == 0:     # never per item: once per key, then every 10,000
            log.warning("refused %s from the key %s (bound to node %s): %d refused from it so far "
                        "(security.identity_refused)", why, key_name, rank, n)

    def stats(self) -> dict:
        return {"identity_refused": self.num_refused, "identity_refused_by_key": dict(self.refused_by_key)}
