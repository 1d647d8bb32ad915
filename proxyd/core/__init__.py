"""proxyd's bottom layer: session and object tables, the arena, the wire
protocol, shared memory and the fast channel, CURVE and keys, process
facts, rate-limited logging, the fatbin parser. Imports nothing else of
gpuproxy but proxyd._generated (docs/architecture.md, "Folders")."""
