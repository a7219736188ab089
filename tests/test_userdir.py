"""Where a run's default sockets and media go (telemetry/shared/userdir.py): a directory no other
local user can take first. The order: $XDG_RUNTIME_DIR/telemetry, a home fallback made earlier,
$TMPDIR/telemetry-<uid> when it is ours or free, the home fallback when another user took that
name; none at all is one line, never a traceback."""
from __future__ import annotations

import os
import stat
import types
from pathlib import Path

import pytest
from other_user import OTHER_UID

from telemetry.shared import endpoints, media, userdir
from telemetry.shared.endpoints import UnsafePathError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's directory is made as root")
HOST = os.uname().nodename


@pytest.fixture
def where(tmp_path, monkeypatch):
    """A temporary directory like /tmp (root's, sticky, anyone may write) and a home, both the
    test's own: nothing here touches the real /tmp/telemetry-<uid> other tests use."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    for name in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME", endpoints.ENV_RUNTIME_DIR, endpoints.ENV_RUN_NAME,
                 media.ENV_MEDIA_DIR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("HOME", str(home))
    return types.SimpleNamespace(tmp=tmp, home=home, name=tmp / f"telemetry-{os.getuid()}",
                                 fallback=home / ".cache" / "telemetry" / HOST)


def _private(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def _squat(path: Path) -> None:
    """What `mkdir -m700 /tmp/telemetry-<your uid>` by another user leaves."""
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)


def test_a_free_name_in_the_temporary_directory_is_made_ours(where):
    assert endpoints.runtime_dir() == where.name / "default"           # found before it exists
    assert endpoints.runtime_dir(create=True) == where.name / "default"
    assert _private(where.name) and _private(where.name / "default")
    assert endpoints.runtime_dir() == where.name / "default"           # and found again
    assert not (where.home / ".cache").exists()


def test_the_sessions_runtime_dir_comes_first_when_it_is_private_and_ours(where, tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert endpoints.runtime_dir(create=True) == xdg / "telemetry" / "default"
    assert _private(xdg / "telemetry")
    assert media.media_dir(create=True) == xdg / "telemetry" / "media"
    xdg.chmod(0o755)                     # not the session's private directory: not used
    assert endpoints.runtime_dir() == where.name / "default"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")
    assert endpoints.runtime_dir() == where.name / "default"


@needs_root
def test_a_name_another_user_took_sends_the_run_home(where):
    _squat(where.name)
    assert endpoints.runtime_dir() == where.fallback / "default"
    assert endpoints.runtime_dir(create=True) == where.fallback / "default"
    assert _private(where.fallback / "default") and _private(where.fallback) and _private(where.fallback.parent)
    assert endpoints.resolve("ingest") == f"ipc://{where.fallback}/default/ingest.sock"
    assert media.media_dir(create=True) == where.fallback / "media"
    assert list(where.name.iterdir()) == [] and where.name.stat().st_uid == OTHER_UID     # theirs, untouched
    # The squatter gives the name up: the run's later processes still find the same directory.
    where.name.rmdir()
    assert endpoints.runtime_dir() == where.fallback / "default"
    assert not where.name.exists()


@needs_root
@pytest.mark.parametrize("kind", ["file", "symlink to ours"])
def test_anything_but_a_directory_of_ours_at_the_name_is_not_used(where, kind, tmp_path):
    if kind == "file":
        where.name.write_text("")
        os.chown(where.name, OTHER_UID, OTHER_UID)
    else:
        (tmp_path / "ours").mkdir(mode=0o700)
        where.name.symlink_to(tmp_path / "ours")
    assert endpoints.runtime_dir(create=True) == where.fallback / "default"


@needs_root
def test_a_name_taken_between_the_look_and_the_mkdir_sends_the_run_home(where, monkeypatch):
    real = userdir._ours

    def late_squatter(path, private=False):
        found = real(path, private)
        if path == where.name and found is None:
            _squat(where.name)           # right after we looked
        return found

    monkeypatch.setattr(userdir, "_ours", late_squatter)
    assert endpoints.runtime_dir(create=True) == where.fallback / "default"


@needs_root
@pytest.mark.parametrize("home", ["unset", "under a file"])
def test_a_taken_name_and_no_home_is_one_line(where, monkeypatch, home):
    _squat(where.name)
    if home == "unset":
        monkeypatch.delenv("HOME")
    else:
        (where.home / "file").write_text("")
        monkeypatch.setenv("HOME", str(where.home / "file" / "home"))
    with pytest.raises(UnsafePathError) as err:
        endpoints.runtime_dir(create=True)
    assert "\n" not in str(err.value) and "TELEMETRY_RUNTIME_DIR" in str(err.value), err.value


def test_an_existing_cache_dir_is_left_as_it_is(where, monkeypatch):
    (where.home / ".cache").mkdir(mode=0o755)
    (where.home / ".cache").chmod(0o755)
    (where.fallback).mkdir(parents=True, mode=0o700)     # a fallback made earlier: chosen first
    assert endpoints.runtime_dir(create=True) == where.fallback / "default"
    assert stat.S_IMODE((where.home / ".cache").stat().st_mode) == 0o755
    assert not where.name.exists()


def test_a_long_host_name_keeps_the_sockets_within_the_unix_limit(where, monkeypatch):
    long_name = "node-" + "x" * 59 + ".cluster.example.org"
    monkeypatch.setattr(userdir.os, "uname", lambda: types.SimpleNamespace(nodename=long_name))
    base, host_dir = userdir._fallback()
    assert len(host_dir.name) <= userdir.MAX_HOST_CHARS and host_dir.name.startswith("node-")
    assert userdir._fallback()[1] == host_dir                                # the same every time


def test_a_shared_sticky_directory_is_never_made_private(tmp_path):
    """A runtime, media or staging directory named by the user that is a shared one (sticky and
    writable by all, like /tmp, which is root's own when we run as root) is refused, never
    chmod-ed 0700: that locked every other user out of /tmp."""
    import os
    import stat

    import pytest

    from telemetry.shared.endpoints import UnsafePathError, private_dirs

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafePathError, match="shared directory"):
        private_dirs(shared)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    inside = private_dirs(shared / "mine")                 # a directory of its own inside one is fine
    assert stat.S_IMODE(os.stat(inside).st_mode) == 0o700


def test_telemetry_run_under_a_shared_directory_leaves_it_shared(tmp_path, monkeypatch):
    """`telemetry run` with $TELEMETRY_RUNTIME_DIR inside a shared sticky directory (/tmp/x) makes
    x private and leaves the shared one as it was (it was made 0700 when we ran as root, which
    locked every other user out of /tmp); a missing parent is made, ours and 0700."""
    from telemetry.tools.run import _runtime_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv(endpoints.ENV_RUNTIME_DIR, str(shared / "run-x"))
    runtime, made = _runtime_dir("x")
    assert made and runtime == shared / "run-x" and _private(runtime)
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    monkeypatch.setenv(endpoints.ENV_RUNTIME_DIR, str(tmp_path / "new" / "run-y"))
    runtime, made = _runtime_dir("y")
    assert made == (runtime, runtime.parent) and _private(runtime) and _private(runtime.parent)


def test_a_directory_others_use_is_never_made_private(tmp_path, monkeypatch):
    """A runtime, media or key directory named by the user that already exists: made 0700 when
    it is empty (a directory just made for it), refused, never chmod-ed, when it is open to others
    and holds something (/run or a project's directory named by mistake: as root every directory
    is ours, and making it private locked everyone else out of it). `telemetry run` the same."""
    from telemetry.tools.run import _runtime_dir

    shared = tmp_path / "project"
    shared.mkdir()
    os.chmod(shared, 0o755)
    (shared / "data.txt").write_text("theirs")
    with pytest.raises(endpoints.UnsafePathError, match="open to other users"):
        endpoints.private_dirs(shared, named=True)
    monkeypatch.setenv(endpoints.ENV_RUNTIME_DIR, str(shared))
    with pytest.raises(endpoints.UnsafePathError, match="open to other users"):
        _runtime_dir("x")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o755
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    os.chmod(fresh, 0o755)
    assert endpoints.private_dirs(fresh, named=True) == fresh and _private(fresh)
    (fresh / "control.sock").write_text("")              # ours now, 0700, with things in it: still fine
    assert endpoints.private_dirs(fresh, named=True) == fresh
    media_dir = tmp_path / "media"                       # $TELEMETRY_MEDIA_DIR the same
    media_dir.mkdir()
    os.chmod(media_dir, 0o755)
    (media_dir / "theirs.png").write_text("")
    monkeypatch.setenv(media.ENV_MEDIA_DIR, str(media_dir))
    with pytest.raises(endpoints.UnsafePathError, match="open to other users"):
        media.media_dir(create=True)
    assert stat.S_IMODE(os.stat(media_dir).st_mode) == 0o755
