"""Programs that attach to a running daemon (status, tail, Prometheus) or read what it wrote."""
