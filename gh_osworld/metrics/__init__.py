"""OSWorld metrics, one module per kind of document or application (registry.metric)."""
