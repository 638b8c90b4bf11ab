"""Transports (memory, TCP, TLS, compression) for links between nodes and remote
sessions. Empty in this release: links arrive with the transports work (SPEC 10)."""
