"""The CUDA runtime the engine's torch already loaded, reached with ctypes at run time.

Never a build-time dependency: moe_sidecar finds the libcudart torch mapped into the process
(/proc/self/maps), else the usual sonames, and uses four entry points: cudaHostRegister /
cudaHostUnregister (the channel mapping, once), cudaLaunchHostFunc (the stream path's host
functions) and cudaGetErrorString.
"""

import ctypes
import os

_RUNTIME = None


class CudaError(RuntimeError):
    pass


def _loaded_cudart():
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if "libcudart.so" in os.path.basename(path):
                    return path
    except OSError:
        pass
    return None


class Runtime:
    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise CudaError("CUDA is not available to torch")
        torch.cuda.init()
        candidates = [p for p in [_loaded_cudart()] if p] + [
            "libcudart.so.13", "libcudart.so.12", "libcudart.so"]
        last = None
        for name in candidates:
            try:
                self.lib = ctypes.CDLL(name)
                self.path = name
                break
            except OSError as e:
                last = e
        else:
            raise CudaError(f"no CUDA runtime library found ({last})")
        L = self.lib
        L.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        L.cudaHostRegister.restype = ctypes.c_int
        L.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        L.cudaHostUnregister.restype = ctypes.c_int
        L.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        L.cudaLaunchHostFunc.restype = ctypes.c_int
        L.cudaGetErrorString.argtypes = [ctypes.c_int]
        L.cudaGetErrorString.restype = ctypes.c_char_p

    def _check(self, rc, what):
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc).decode(errors="replace")
            raise CudaError(f"{what}: {msg} (cudaError {rc})")

    def host_register(self, addr, size):
        self._check(self.lib.cudaHostRegister(addr, size, 0), "cudaHostRegister")

    def host_unregister(self, addr):
        self._check(self.lib.cudaHostUnregister(addr), "cudaHostUnregister")

    def launch_host_func(self, stream, fn, arg):
        """Enqueues fn(arg) on stream (a cudaStream_t as an int; 0 = the legacy default)."""
        self._check(self.lib.cudaLaunchHostFunc(stream, fn, arg), "cudaLaunchHostFunc")


def runtime():
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = Runtime()
    return _RUNTIME
