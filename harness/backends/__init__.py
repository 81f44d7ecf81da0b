"""One adapter module per language. Each exports IMPLEMENTATIONS, in reading order."""
