"""What is patched on each Hermes release: the seam table (table.py, rows of row.py), the
applier (apply.py) and the wrappers by area: compression_entry.py and compression.py (the
contract for one compression), turns.py (one turn per session), gateway.py and buffering.py
(messages that arrive during a compression), summaries.py (tags, visibility, provider copy,
recall tool), export.py (Hermes's export with the snapshots); supported.py says which
release range is supported; legacy/ holds what only the rows of Hermes 0.13-0.19 name (the
table alone imports it).

The only part that imports wrapt and patches Hermes (docs/architecture.md)."""
