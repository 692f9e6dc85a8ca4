"""autokernel: autotuned CPU kernels from a tuning database, for numpy and PyTorch.

The runtime dispatches each call (GEMM, a linear layer with its bias and activation fused,
scaled dot-product attention) to the best variant tuned on this machine, as recorded in a
SQLite tuning database, or to a kernel default valid for every shape::

    import numpy as np
    import autokernel

    rt = autokernel.Runtime("tuning.db")          # a missing file: defaults, rt.load_error says why
    a = np.random.rand(8, 64).astype(np.float32)
    b = np.random.rand(64, 64).astype(np.float32)
    c = rt.gemm(a, b)                             # float32 (8, 64), the GIL released meanwhile
    rt.lookup("gemm:8x64x64")["level"]            # 'exact', 'same_arch', 'nearest_shape' or 'default'

    autokernel.tune(["gemm:8x64x64"], db="tuning.db", budget=16)   # what `autokernel tune` does
    rt.reload()                                   # serve the new records

``autokernel.torch`` (needs PyTorch) serves ``nn.Linear`` layers and attention of a model
through the runtime: ``autokernel.torch.optimize(model, db="tuning.db")``.
"""

from ._native import AutokernelError, EncoderLayer, PackedWeight, Runtime, __version__, fingerprint, tune

__all__ = ["AutokernelError", "EncoderLayer", "PackedWeight", "Runtime", "__version__", "fingerprint", "tune"]


def __getattr__(name):
    # `autokernel.torch` imports PyTorch: only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'autokernel' has no attribute '{name}'")
