"""What a TLS listener does with its certificate files while it runs: read them again
(a certificate renewed in place) and use them for the handshakes from then on. The node's
own :class:`~meshbus.transports.Server` and a plugin's listeners (MQTT's) share it."""

from __future__ import annotations

import ssl
from typing import Any

from meshbus.errors import StateError

__all__ = ["RenewableCertificates"]


class RenewableCertificates:
    """A listener whose certificate files can be read again while it runs (a mixin).

    The class using it keeps its settings in ``settings`` (with a ``tls``:
    :class:`~meshbus.transports.TlsSettings` or ``None``) and the context its
    handshakes use in ``_context`` (``None`` for a plain listener).
    """

    settings: Any
    _context: ssl.SSLContext | None

    def read_certificates(self) -> ssl.SSLContext | None:
        """Read the listener's TLS files again (a rotated certificate, say), changing
        nothing: a context for :meth:`use_certificates`, or ``None`` for a plain
        listener. Reading files, it belongs in a worker thread.

        :raises ConfigurationError: the files are missing or do not hold a certificate
            and its key.
        """
        tls = self.settings.tls
        return None if tls is None else tls.server_context()

    def use_certificates(self, context: ssl.SSLContext) -> None:
        """Handshakes from now on use ``context`` (from :meth:`read_certificates`);
        connections already up keep theirs.

        :raises StateError: the listener is a plain one.
        """
        if self._context is None:
            raise StateError("a plain listener has no certificates to replace")
        self._context = context
