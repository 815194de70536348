"""Triton kernels, each beside a plain-PyTorch reference and a launcher that falls back to it.

Every kernel module exposes `reference(...)` (PyTorch, the ground truth), `triton_kernel(...)`
(`@triton.jit`, tested on CPU with TRITON_INTERPRET=1) and `launch(...)`, which uses the Triton
path on CUDA and the reference elsewhere. The training stage adds the first kernels.
"""
