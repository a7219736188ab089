"""What the client, the daemon and the consumers share: where the sockets are (endpoints), the
config machinery (config) and the security of endpoints beyond loopback (security)."""
