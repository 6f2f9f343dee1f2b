"""What serves only the Hermes releases before native compaction (0.13-0.19; 0.20+ is
``host_native``): the wrappers and steps that rows of :mod:`..table` for those ranges name.
Nothing outside this package but the table imports it (docs/architecture.md)."""
