"""Summaries: tags, visibility, the wire shape sent to providers, recall and its tool, search over snapshots."""
