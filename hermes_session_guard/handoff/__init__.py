"""Hand-off to a fresh session, an extension on the guard's hooks (:mod:`.extension`):
packets, their writer, redaction."""
