"""The ``meshbus`` command: an application built on the library.

The command line (``meshbus demo``, ``run``, ``pub``, ``sub``, ``stats``, ``certs``),
the node configuration file that ``meshbus run`` serves and the demo live here, above
the core, the plugins and the transports; none of those imports anything from here.
Plugins take part in the configuration file through
:func:`~meshbus.hookspecs.meshbus_config_sections`. Nothing here is public API
besides the command itself.
"""
