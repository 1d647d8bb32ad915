"""Whole-process checkpoint and restore as a library: park the shim, dump
the GPU state, CRIU, resume; called by proxy-cli and by anything else that
orchestrates checkpoints (docs/architecture.md, "Folders")."""
