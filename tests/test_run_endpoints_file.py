"""endpoints.json, the run directory's pointer to its live daemon (run_endpoints.read): a damaged
or hand-made file is no endpoint, never an exception in `telemetry tail --run-dir`."""
from __future__ import annotations

import os

from telemetry.shared import run_endpoints


def _plant(tmp_path, text: str):
    path = tmp_path / run_endpoints.FILE_NAME
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def test_nested_past_json_recursion_limit_is_no_endpoint(tmp_path):
    # Within the file's size bound, but deeper than json's recursion limit: a RecursionError,
    # which `telemetry tail --run-dir` printed as a traceback.
    depth = run_endpoints.MAX_BYTES - 100
    _plant(tmp_path, "[" * depth)
    assert run_endpoints.read(tmp_path) is None
    _plant(tmp_path, '{"pid": 1, "ingest": ' + "[" * depth + "}")
    assert run_endpoints.read(tmp_path) is None


def test_a_good_file_is_read(tmp_path):
    run_endpoints.write(tmp_path, {"ingest": "ipc:///x/ingest.sock", "pub": "ipc:///x/pub.sock",
                                   "control": "ipc:///x/control.sock"})
    got = run_endpoints.read(tmp_path)
    assert got is not None and got["control"] == "ipc:///x/control.sock"
