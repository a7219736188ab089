"""Make CURVE key pairs for endpoints beyond loopback (multi-node forwarding, remote consumers).

    telemetry keygen --dir keys --name head                 # the head daemon's server pair
    telemetry keygen --dir keys --name node1 --allow keys/allowed   # a client pair, allow-listed

Each pair is NAME.key (public, safe to copy to other nodes) and NAME.key_secret (public +
secret, mode 0600). Both live in DIR, created 0700. --allow also copies the public key into an
allow-list directory: the daemon's `security.allowed_clients_dir`; a client whose public key is
not there is refused (and counted). The allowed copy binds the key to the node it belongs to,
the number NAME ends in (node3: node 3; group2: group head 2), or --node-rank for one NAME: a
head takes from that key only records that speak as that node (security/identity.py). A NAME
that ends in no number is allowed as a key for no node (a remote consumer's).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from telemetry.shared.config import nonempty_arg, out_dir_arg, writable_dir_problem
from telemetry.shared.endpoints import private_dirs
from telemetry.shared.security.identity import rank_in_name, write_allowed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", required=True, type=out_dir_arg, metavar="DIR", help="where the key files go (created 0700)")
    p.add_argument("--name", action="append", required=True, type=nonempty_arg, metavar="NAME",
                   help="key pair name; repeat for several pairs (head, node1, node2, ...)")
    p.add_argument("--allow", type=out_dir_arg, metavar="DIR", help="also copy the public keys into this allow-list dir")
    p.add_argument("--node-rank", type=int, metavar="N",
                   help="with --allow and one --name: the node (or group) this key speaks for "
                        "(default: the number NAME ends in)")
    p.add_argument("--force", action="store_true", help="overwrite an existing pair of the same name")


def private_dir(path: str | os.PathLike) -> Path:
    """Create `path` with mode 0700 (its missing parents too), or tighten an existing one we own;
    refuse one another user owns or could change (endpoints.private_dirs)."""
    p = Path(os.path.abspath(path))
    p.parent.mkdir(parents=True, exist_ok=True)
    return private_dirs(p)


def make_pair(key_dir: str | os.PathLike, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key and NAME.key_secret into `key_dir` (0700); return (public, secret) paths."""
    import zmq.auth

    if not name or "/" in name or name.startswith(".") or not name.isprintable() or any(c.isspace() for c in name):
        # A newline or a space in a key's file name breaks every listing and script that reads them.
        raise ValueError(f"key name {name!r}: expected a plain file name (no '/', no leading '.', no spaces "
                         f"or control characters)")
    d = private_dir(key_dir)
    public, secret = d / f"{name}.key", d / f"{name}.key_secret"
    if (public.exists() or secret.exists()) and not force:
        raise FileExistsError(f"{public} exists (use --force to overwrite)")
    old = os.umask(0o077)  # the secret file is never readable by others, not even briefly
    try:
        pub_s, sec_s = zmq.auth.create_certificates(str(d), name)
    finally:
        os.umask(old)
    os.chmod(sec_s, 0o600)
    os.chmod(pub_s, 0o644)
    return Path(pub_s), Path(sec_s)


def run(args: argparse.Namespace) -> int:
    for flag, path in (("--dir", args.dir), ("--allow", args.allow)):
        why = writable_dir_problem(path) if path else None   # a path under a file, /proc/x
        if why:
            print(f"telemetry keygen: {flag} {why}", file=sys.stderr)
            return 2
    if args.node_rank is not None and (not args.allow or len(args.name) != 1 or args.node_rank < 0):
        print("telemetry keygen: --node-rank goes with --allow and one --name, and is >= 0", file=sys.stderr)
        return 2
    try:
        allow_dir = private_dir(args.allow) if args.allow else None
    except (ValueError, OSError) as exc:     # UnsafePathError is a ValueError
        print(f"telemetry keygen: --allow {args.allow}: {exc}", file=sys.stderr)
        return 2   # bad input: exit 2, as for every command
    for name in args.name:
        try:
            public, secret = make_pair(args.dir, name, force=args.force)
        except FileExistsError as exc:   # a pair kept from before: not a bad flag
            print(f"telemetry keygen: {exc}", file=sys.stderr)
            return 1
        except (ValueError, OSError) as exc:
            print(f"telemetry keygen: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: public {public}  secret {secret}")
        if allow_dir is not None:
            node = args.node_rank if args.node_rank is not None else rank_in_name(name)
            write_allowed(allow_dir, public, node)
            print(f"{name}: allowed in {allow_dir}, "
                  + (f"speaking for node {node}" if node is not None else "for no node (its records are refused)"))
    return 0
