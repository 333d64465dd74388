"""How an op runs on this adapter: per kernel family its variant table, WGSL generation and
launch, GPU and CPU side by side. Kernels take buffer views (anything with ``device``,
``buffer``, ``offset``, ``strides``, ``shape`` and ``dtype``: a Tensor is one), never import ops,
and ask the device's adapter profile (runtime/profile.py) and TUNING which way to run."""
