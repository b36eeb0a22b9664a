"""Array backends: NumPy on the host, CuPy on an NVIDIA GPU.

This is the only module that imports cupy. Everything in ops/ and engine/
receives the array module `xp` as an argument and never imports one itself,
so one op definition serves both backends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import BackendUnavailable
from .extras import install_hint
from .host_erf import numpy_erf


@dataclass(frozen=True)
class Backend:
    name: str          # "numpy" | "cupy" | "strict" (tests only)
    device: str        # "cpu" | "cuda" | "strict"
    xp: Any            # the array module

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        """The one explicit door from the device to the host."""
        return host(self.xp, a)

    def synchronize(self) -> None:
        if self.name == "cupy":
            self.xp.cuda.get_current_stream().synchronize()

    def memory_sampler(self):
        """A function returning the bytes the device memory pool has handed out (CuPy), or None
        on NumPy, where the engine counts the bytes of the arrays it holds instead."""
        if self.name == "cupy":
            return self.xp.get_default_memory_pool().used_bytes
        return None


NUMPY = Backend("numpy", "cpu", np)
USER_DEVICES = ("cpu", "cuda")  # what users may ask for; "strict" is for the tests only


def host(xp, a) -> np.ndarray:
    """`a` as a host NumPy array: the explicit copy (asnumpy) on a device backend, a no-op on
    NumPy. Code that holds only `xp` (fingerprints, the engine) crosses to the host here."""
    if xp is np:
        return np.asarray(a)
    return xp.asnumpy(a)


def _cupy():
    try:
        import cupy  # noqa: PLC0415 - the only cupy import in the project

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA device is visible"
        return cupy, None
    except Exception as exc:  # ImportError, CUDARuntimeError, missing driver...
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")


def cuda_available() -> bool:
    return _cupy()[0] is not None


def get_backend(device: str = "cpu") -> Backend:
    """Backend for a device name: "cpu" (NumPy) or "cuda" (CuPy)."""
    if device == "cpu":
        return NUMPY
    if device == "strict":
        # test-only: NumPy behind a wrapper that refuses what CuPy refuses (strict_backend.py);
        # never listed to users (CLI choices, GetServerInfo), so it is not in the error below
        from .strict_backend import XP  # noqa: PLC0415

        return Backend("strict", "strict", XP)
    if device == "cuda":
        cupy, why = _cupy()
        if cupy is None:
            raise BackendUnavailable(
                f"device 'cuda' is not available ({why}); {install_hint('gpu')} on a machine "
                "with an NVIDIA GPU, or use --device cpu",
                field="device",
            )
        return Backend("cupy", "cuda", cupy)
    raise BackendUnavailable(f"unknown device '{device}' (expected cpu or cuda)", field="device")


# --- special functions NumPy lacks -------------------------------------------------

def erf(xp, x):
    """Error function on either backend, to full float64 accuracy."""
    if xp is np:
        return numpy_erf(x)
    if xp.__name__ == "strict":  # the CPU stand-in for CuPy: numpy's erf on the unwrapped array
        return xp.strict_erf(x)
    from cupyx.scipy.special import erf as cp_erf  # noqa: PLC0415 - cupy side of the same door

    return cp_erf(x)


def scatter_add(xp, target, index, values):
    """target[index] += values, accumulating repeated indices, on either backend."""
    if xp is np:
        np.add.at(target, index, values)
    elif xp.__name__ == "strict":
        xp.add.at(target, index, values)
    else:
        import cupyx  # noqa: PLC0415 - cupy side of the same door

        cupyx.scatter_add(target, index, values)
    return target
