"""Exceptions: one class per libmoe_client status, all under moe_sidecar.Error.

Every error carries the status (a negative int, as in moe_abi.h), its name, and the sentence
that explains it — for a request the sidecar refused, the sidecar's own sentence ("FORWARD
layer 3: token 1 id 2: expert -5 out of range (0..63, -1 = skip)") — plus the offending value
and index where the sidecar gave them.
"""

import builtins


class Error(Exception):
    """A libmoe_client or sidecar error. status, status_name, message, value, index."""

    status = None

    def __init__(self, status, message="", value=0, index=0):
        from . import _native

        self.status = status
        self.status_name = _native.strerror(status)
        self.message = message or self.status_name
        self.value = value
        self.index = index
        super().__init__(f"{self.message} [{self.status_name}]")


class ConnectError(Error):
    """The sidecar's socket cannot be reached (is `moe-sidecar serve` running?)."""


class StartingError(ConnectError):
    """A sidecar is at the socket but still starting (warming up); the sentence says how far.
    Raised when connect_timeout_ms ran out (or was 0) before it served."""


class VersionError(Error):
    """The sidecar speaks another protocol major."""


class RefusedError(Error):
    """The sidecar refused this client: peer check, limits, or another model."""


class ProtocolError(Error):
    """The peer broke the protocol."""


class PeerDeadError(Error):
    """The sidecar is gone (socket hang-up or shutdown)."""


class TimeoutError(Error, builtins.TimeoutError):
    """Nothing completed within the timeout; the request may still complete."""


class BusyError(Error):
    """Nothing free now (every slot in use, or the submission ring full)."""


class InvalidError(Error, ValueError):
    """An argument the library refused."""


class RequestError(Error):
    """A request the sidecar refused or could not do; .value/.index locate the cause."""


class BadExpertError(RequestError):
    pass


class BadLayerError(RequestError):
    pass


class BadTokensError(RequestError):
    pass


class BadTopKError(RequestError):
    pass


class BadDtypeError(RequestError):
    pass


class BadWeightError(RequestError):
    pass


class NonFiniteError(RequestError):
    pass


class ExpertReadError(RequestError):
    """Reading an expert from the model files failed (MOE_EIO)."""


class ShutdownError(RequestError):
    pass


class BadFieldError(RequestError):
    pass


class NoModelError(RequestError):
    pass


class MaskedError(RequestError):
    """The request names an expert this client declared as on the GPU."""


class TooSmallError(RequestError):
    pass


class DeferredError(RequestError):
    """A deferred contribution is owed to another layer or batch size."""


class BadLeaseError(RequestError):
    """MOE_EBADLEASE: a lease id this channel does not hold (never leased, released already)."""


class LeaseRefusedError(RequestError):
    """MOE_ENOLEASE: leases refused (no shared pool: serve --leases; the channel's bound)."""


_BY_STATUS = {
    -1: InvalidError,
    -4: ConnectError,
    -5: VersionError,
    -6: RefusedError,
    -7: ProtocolError,
    -8: PeerDeadError,
    -9: TimeoutError,
    -10: BusyError,
    -11: StartingError,
    -35: BadTokensError,
    -36: BadDtypeError,
    -37: BadLayerError,
    -38: BadExpertError,
    -39: BadWeightError,
    -40: NonFiniteError,
    -41: ExpertReadError,
    -42: ShutdownError,
    -43: BadFieldError,
    -44: NoModelError,
    -45: BadTopKError,
    -46: MaskedError,
    -47: TooSmallError,
    -48: DeferredError,
    -49: BadLeaseError,
    -50: LeaseRefusedError,
}


def make_error(status, message="", value=0, index=0):
    """The exception instance for a status (the C extension raises what this returns)."""
    cls = _BY_STATUS.get(status, RequestError if status <= -32 else Error)
    if cls is BadExpertError and value >= 1 << 31:
        value -= 1 << 32  # the id as sent: the wire carries it as uint32
    return cls(status, message, value, index)
