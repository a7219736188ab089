"""Host headers for the HTTP servers' DNS-rebinding tests (PORT: the server's port).

A page on a name its owner points at 127.0.0.1 (127.0.0.1.nip.io, or any name re-pointed after
the page loaded) reaches a loopback port with that name in Host; only loopback addresses and
`localhost` may be served."""
from __future__ import annotations

# Loopback, in the literal forms a browser or curl may send.
GOOD_HOSTS = ["127.0.0.1:PORT", "127.0.0.1", "localhost:PORT", "LocalHost:PORT", "127.0.0.2:PORT", "127.1:PORT",
              "127.255.255.254:PORT", "0x7f.0.0.1:PORT", "0177.0.0.1:PORT", "2130706433:PORT", "[::1]:PORT", "[::1]",
              "[0:0:0:0:0:0:0:1]:PORT", "[::ffff:127.0.0.1]:PORT"]
# Names (however they start), other addresses, and what is no Host at all.
EVIL_HOSTS = ["127.0.0.1.nip.io:PORT", "127.0.0.1.nip.io", "127.attacker.example:PORT", "127.0.0.1.attacker.example",
              "localhost.attacker.example:PORT", "a.localhost:PORT", "localhost.:PORT", "attacker.example:PORT",
              "0.0.0.0:PORT", "10.0.0.1:PORT", "128.0.0.1:PORT", "1.127.0.0.1:PORT", "127.0.0.256:PORT",
              "127.0.0.1:PORT.attacker.example", "127.0.0.1.:PORT", "127.0.0.1:PORTx", "[::1].attacker.example:PORT",
              "[::1", "[::2]:PORT", "[127.0.0.1]:PORT", "::1", "0x7g.0.0.1:PORT", "127.+1:PORT", "127.0_0.1:PORT", ""]
