"""Benchmarks: the cost of every path, against the alternatives; a package, run from the
repository root.

    .venv/bin/python -m benchmarks.ingest        # or benchmarks.client_cost, .reliability, ...

The harness they share with the tests (the daemon process handle, the fault-injection scenarios
and their rank processes) is testkit/; the tests never import benchmarks (tests/test_layout.py
checks it, but for the GPU benchmark's own measurement tools that test_gpu_bench_smoke.py checks).
"""
