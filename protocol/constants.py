"""Protocol constants, version 1: the numbers both ends must agree on, and nothing else.

Kept apart from the schema (records.py) so the training-side client can encode records without
importing the decoder's machinery (msgspec and the schema classes).
"""

PROTOCOL_VERSION = 1

KIND_HELLO = 1
KIND_METRICS = 2
KIND_EVENT = 3
KIND_BYE = 4
KIND_NAMES = {KIND_HELLO: "hello", KIND_METRICS: "metrics", KIND_EVENT: "event", KIND_BYE: "bye"}

# Bounds a decoded record must respect. A frame larger than MAX_FRAME_BYTES never reaches the
# decoder: the daemon sets it as the PULL socket's MAXMSGSIZE, and libzmq drops the peer.
MAX_FRAME_BYTES = 1 << 20          # 1 MiB: a hello with a big config fits, a runaway does not
MAX_NAME_CHARS = 256               # metric and event names
MAX_VALUES = 4096                  # metrics per record
MAX_RANK = (1 << 20) - 1           # a global rank beyond this is not a rank of any real run
MAX_PARTS = 1024                   # a metrics record's `parts`: records one rank sends for one step
MAX_STEP = (1 << 63) - 1           # a step, as every header int, is in 0..2**63 - 1

# A metrics value the client adds by itself, at most once a second: the seconds it has spent in
# its log() and event() calls on the caller's thread so far (the goodput ledger's telemetry
# bucket). The W&B sink keeps it out of a user's run's history.
CLIENT_TIME_KEY = "telemetry/client_s"
