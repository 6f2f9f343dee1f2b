"""Hand-off to a fresh session: packets, their writer, redaction."""
