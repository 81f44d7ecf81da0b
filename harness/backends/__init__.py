"""One adapter module per language. Each registers its implementations (registry.register), in reading order."""
