"""Built-in plugins. Each registers through the ``meshbus`` entry-point group,
exactly as a third-party plugin would."""
