"""What is patched on each Hermes release: the seam table (table.py), the applier (apply.py) and the wrappers by area.

The only part that imports wrapt and patches Hermes (docs/architecture.md)."""
