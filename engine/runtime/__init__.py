"""The runtime: the only code that touches onnxruntime (and, on CUDA, cupy).

The `Backend` protocol the engine drives (backend.py), the CPU and CUDA backends, the KV slot pool
(its buffers and attention mask), the bounded cache of shape variants and the device table of
constraint masks. Nothing here decides what runs: the executor (engine/executor/) does."""
