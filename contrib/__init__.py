"""Optional integrations with heavy dependencies, each behind a pip extra
(the Spark connector arrives with the ``spark`` extra, SPEC 11)."""
