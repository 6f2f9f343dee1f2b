"""The doctor / repair / status back end: home inspection, corruption, lineage repair, config
findings, session pressure, enable / disable."""
