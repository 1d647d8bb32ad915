"""The supervisor process: public endpoint, sessions table, workers'
lifecycle, authorisation, control commands, the shared-memory sweep
(docs/architecture.md, "Folders")."""
