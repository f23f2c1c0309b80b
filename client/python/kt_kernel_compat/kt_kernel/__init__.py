"""kt_kernel — moe-sidecar's stand-in for kt-kernel, for engines written against kt-kernel.

    from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks   # SGLang's import

The experts run in a `moe-sidecar serve MODEL` process on the same host (socket:
$MOE_SIDECAR_SOCKET, else the standard paths) instead of in the engine's process. Installed
only on request (the moe-sidecar-kt-kernel distribution), never by moe_sidecar itself;
__version__ says whose it is. docs/engines.md, "Running SGLang's kt path on moe-sidecar",
maps the engine's flags and lists what is not supported.
"""

import moe_sidecar

from .experts import KTMoEWrapper
from .experts_base import generate_gpu_experts_masks

__version__ = f"{moe_sidecar.__version__}+moe-sidecar"
__provider__ = "moe-sidecar"
__cpu_variant__ = "moe-sidecar"  # kt's field: the kernels are the sidecar's

__all__ = ["KTMoEWrapper", "generate_gpu_experts_masks", "__version__", "__provider__",
           "__cpu_variant__"]
