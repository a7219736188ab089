"""Benchmarks and fault-injection scenarios: a package, run from the repository root.

    .venv/bin/python -m benchmarks.ingest        # or benchmarks.client_cost, .reliability, ...

The tests import the scenarios (`from benchmarks import reliability`) and the daemon process
handle (`benchmarks.daemon_proc`) like any other module; nothing edits sys.path.
"""
