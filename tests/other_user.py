"""'Another local user' for the trust tests: uid/gid 65534 (nobody). Acting as it needs root, as
in CI; the tests that do skip or leave that part out otherwise."""
from __future__ import annotations

import os
import subprocess

OTHER_UID = 65534
SYSTEM_PYTHON = "/usr/bin/python3"    # ours lives under /root or a venv the other user may not read


def can_act_as_other_user() -> bool:
    return os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON)


def http_status_as_other_user(url: str) -> str:
    """GET `url` as the other user, without any credential; the HTTP status it got, as text
    ("200", "401", "403"), or what it printed instead."""
    code = ("import urllib.request, urllib.error\n"
            f"try: urllib.request.urlopen({url!r}, timeout=30)\n"
            "except urllib.error.HTTPError as e: print(e.code)\n"
            "else: print(200)\n")
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], user=OTHER_UID, group=OTHER_UID, cwd="/",
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or out.stderr.strip()


def with_reads_refused(argv: list[str], probe: str) -> list[str] | None:
    """`argv` run so that a file's mode refuses its reads, as it does `probe` (a file of mode
    000): as it is when we are not root; for root, under capsh with the two capabilities that
    pass over file modes dropped. None when neither can be (root without capsh, or a capsh not
    allowed to drop them)."""
    import shutil

    prefix: list[str] = []
    if os.geteuid() == 0:
        capsh = shutil.which("capsh")
        if capsh is None:
            return None
        prefix = [capsh, "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", 'exec "$0" "$@"']
    if subprocess.run([*prefix, "test", "-r", probe], capture_output=True, timeout=60).returncode == 0:
        return None
    return [*prefix, *argv]


def run_as_other_user(script: str) -> None:
    """Run a shell `script` as the other user (in /, so that it needs no access to our
    directories); raises with what it said when it fails."""
    subprocess.run(["/bin/sh", "-ec", script], user=OTHER_UID, group=OTHER_UID, cwd="/", check=True,
                   capture_output=True, text=True, timeout=60)
