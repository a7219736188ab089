"""Where the W&B drop-in's media files wait between a training process and the daemon.

`telemetry.wandb` passes `wandb.Image`, `wandb.Histogram` and `wandb.Table` to the daemon as a
file (written off the training thread) and a `wandb/media` event naming it; the daemon's W&B
sink builds the real W&B object from the file, logs it and deletes the file. Both ends are on
one host (a node daemon's head does not see these files: there the sink counts them missing).

The directory is private to the user, <the user's private directory>/media (0700: userdir.py,
e.g. /tmp/telemetry-<uid>/media), or $TELEMETRY_MEDIA_DIR on both ends. The sink reads only
plain file names inside it, so a record cannot make the daemon read (and upload) any other file.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from telemetry.shared.endpoints import private_dirs

ENV_MEDIA_DIR = "TELEMETRY_MEDIA_DIR"
EVENT = "wandb/media"
# A writer that could not write a file leaves this beside the name instead, with the error, so
# the sink stops waiting for it at once.
FAILED_SUFFIX = ".failed"


def media_dir(create: bool = False) -> Path:
    """The media directory, checked on both ends as the sockets' directory is (private to this
    user, no symlinks; UnsafePathError otherwise); made when `create`."""
    explicit = os.environ.get(ENV_MEDIA_DIR)
    if explicit:
        return private_dirs(Path(os.path.abspath(explicit)), create=create, named=True)
    from telemetry.shared.userdir import user_dir

    base = user_dir(create=create)
    if not create and not os.path.lexists(base):
        return base / "media"          # nothing there yet: nothing of anyone else's either
    return private_dirs(base, base / "media", create=create)


# What the daemon keeps of a run's media for the dashboard, in its log directory
# (telemetry/daemon/media_keeper.py writes it, telemetry/consumers/dashboard/media.py reads it).
KEPT_SUBDIR = "media"
KEPT_INDEX = "index.jsonl"

# The names the drop-in's writer gives its files (telemetry/integrations/wandb_media.py):
# <pid>-<8 hex>-<n><.ext>; nothing else is ever read or deleted (a name from the network that is
# too long, or holds a NUL, would make the readers' calls raise).
NAME = re.compile(r"[0-9]{1,10}-[0-9a-f]{8}-[0-9]{1,12}(\.[A-Za-z0-9]{1,16})?")


def safe_ext(ext: str) -> str:
    """A file's extension as a media name may carry it (".png"); ".img" for one that may not."""
    return ext if re.fullmatch(r"\.[A-Za-z0-9]{1,16}", ext) else ".img"


def media_file(name: object) -> Path | None:
    """The file a media event names, or None for a name the drop-in's writer does not give."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        return None
    return media_dir() / name
