"""How an op runs on this adapter: per kernel family its variant table, WGSL generation and
launch, GPU and CPU side by side. Kernels read buffer views (anything with ``device``,
``buffer``, ``offset``, ``strides``, ``shape`` and ``dtype``: a Tensor is one) and allocate
their outputs as plain Tensors; they record no autograd, never import ops, and ask the device's
adapter profile (runtime/profile.py) and TUNING (runtime/tuning.py) which way to run."""
