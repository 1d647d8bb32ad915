"""gpuproxy.cli: the proxy-cli command."""
