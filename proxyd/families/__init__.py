"""One module per CUDA API family: its hand-written handlers and, where it
owns objects a checkpoint must capture, its checkpoint object kinds.
Imports proxyd.core and proxyd.backends, never the worker, supervisor or
checkpoint engine above it (docs/architecture.md, "Folders")."""
