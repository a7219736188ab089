"""The allow-list decides which key speaks for which node (security/identity.py): another local
user who can write it, or who owns a file in it, must not add a key of their own as a node. A
real second unix user (uid 65534) plants a key as node0.key."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from other_user import OTHER_UID, can_act_as_other_user
from telemetry.shared.security.curve import SecurityError
from telemetry.shared.security.identity import AllowList, write_allowed
from telemetry.tools.keygen import make_pair

pytestmark = pytest.mark.skipif(not can_act_as_other_user(), reason="needs root to act as uid 65534")


def _plant_as_other_user(path, data: bytes) -> None:
    subprocess.run(["sh", "-c", 'cat > "$1"', "sh", str(path)], input=data, user=OTHER_UID, group=OTHER_UID,
                   check=True, timeout=60)


@pytest.fixture
def shared_dir():
    """A directory the other user can reach (pytest's own is root's, 0700)."""
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="allow-list-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _keys(base):
    keys = base / "keys"
    keys.mkdir()
    allowed = keys / "allowed"
    allowed.mkdir(mode=0o700)
    honest, _ = make_pair(keys, "node1")
    write_allowed(allowed, honest, 1)
    forged, _ = make_pair(keys, "mallory")      # the other user's key, to be allowed as node 0
    os.chmod(keys, 0o755)                        # (keygen made it 0700) the other user reaches allowed/
    return allowed, forged.read_bytes()


def test_an_allow_list_others_can_write_is_refused(shared_dir):
    allowed, forged = _keys(shared_dir)
    os.chmod(allowed, 0o777)                     # a shared directory: anyone on the host writes it
    _plant_as_other_user(allowed / "node0.key", forged)
    with pytest.raises(SecurityError, match="written by another user"):
        AllowList(allowed)


def test_a_key_file_of_another_user_is_not_allowed(shared_dir):
    allowed, forged = _keys(shared_dir)
    os.chmod(allowed, 0o777)
    _plant_as_other_user(allowed / "node0.key", forged)   # planted while the directory was open
    os.chmod(allowed, 0o700)
    assert (allowed / "node0.key").stat().st_uid == OTHER_UID
    allow = AllowList(allowed)
    assert allow.ranks == {"node1": 1}
    assert "node0" not in allow.names.values()
