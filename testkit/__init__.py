"""The harness the tests and the benchmarks share: a small test-support package, run from the
repository root like benchmarks/ (pytest's pythonpath has ".", so the tests import it as they do
any module; nothing edits sys.path).

    testkit/daemon_proc.py  DaemonProc: a real daemon process, started, waited on, queried, stopped;
                            raw_push: a bare PUSH socket for hand-made frames to an ingest
    testkit/faults.py       fault-injection scenarios and their harness: Endpoints, launch,
                            rank processes (`python -m testkit.faults rank`), free_port
    testkit/fake_nvml.py    a stand-in pynvml (the pollers' tests and their cost benchmark)

The product (protocol/, telemetry/, trainer/) never imports it, and it is not installed
(pyproject's packages.find includes only protocol*, telemetry*, trainer*); tests/test_layout.py
checks both.
"""
