"""gpuproxy.autogen: the specs (specs/*.yaml) -> the shim's C stubs, the
daemon's dispatch table and cffi declarations. See docs/spec-format.md."""
