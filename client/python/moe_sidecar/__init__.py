"""moe_sidecar — Python and torch binding of libmoe_client, the engine side of moe-sidecar.

    import moe_sidecar
    c = moe_sidecar.Client("/run/moe-sidecar/sidecar.sock")
    out = c.forward(layer, hidden, topk_ids, topk_weights)      # numpy or torch

    from moe_sidecar import KTMoEWrapper                        # kt-kernel's interface

docs/engines.md says how an engine attaches (C, C++, Python) and maps KTMoEWrapper field by
field; the C API is client/include/moe_client.h.
"""

from . import _native
from .client import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, FWD_DEFER_COLD, FWD_DEFER_UNION,
                     FWD_DROP_DEFERRED,
                     PLACEMENT_STRATEGIES, Client, Lease, Pending, SlotView, fingerprint,
                     placement)
from .errors import (BadDtypeError, BadExpertError, BadFieldError, BadLayerError,
                     BadTokensError, BadTopKError, BadWeightError, BusyError, ConnectError,
                     DeferredError, Error, ExpertReadError, InvalidError, MaskedError,
                     NoModelError, NonFiniteError, PeerDeadError, ProtocolError, RefusedError,
                     RequestError, ShutdownError, StartingError, TimeoutError, TooSmallError,
                     VersionError, BadLeaseError, LeaseRefusedError)
from .kt import KTMoEWrapper

ABI = (_native.ABI_MAJOR, _native.ABI_MINOR)
__version__ = "1.4.0"

__all__ = [
    "Client", "Pending", "SlotView", "KTMoEWrapper", "fingerprint", "placement",
    "PLACEMENT_STRATEGIES", "ABI", "DTYPE_F32",
    "DTYPE_F16", "DTYPE_BF16", "FWD_DROP_DEFERRED", "FWD_DEFER_COLD", "FWD_DEFER_UNION", "Error", "RequestError",
    "ConnectError", "StartingError", "VersionError", "RefusedError", "ProtocolError", "PeerDeadError",
    "TimeoutError", "BusyError", "InvalidError", "BadExpertError", "BadLayerError",
    "BadTokensError", "BadTopKError", "BadDtypeError", "BadWeightError", "NonFiniteError",
    "ExpertReadError", "ShutdownError", "BadFieldError", "NoModelError", "MaskedError",
    "TooSmallError", "DeferredError", "Lease", "BadLeaseError", "LeaseRefusedError",
]
