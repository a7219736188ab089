"""Security for endpoints beyond loopback: CURVE keys (keygen), the daemon's CURVE server with
an allow-list of client keys (curve), and redaction of secrets in records (redact).

Local ranks talk to their daemon over ipc sockets in a 0700 per-user directory or over TCP on
127.0.0.1; those need no keys. Any endpoint that listens beyond loopback must be encrypted and
authenticated: the daemon refuses to start otherwise (see curve.DaemonSecurity).
"""
