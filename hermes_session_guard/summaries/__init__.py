"""Summaries: tags, visibility, the wire shape sent to providers, recall and its tool, Hermes's search over snapshots."""
