"""The CUDA and CUPTI errors the simulator raises, with CUDA's own names, codes and messages."""

from __future__ import annotations

from .._errors import CudaError, CuptiError

__all__ = ["CUDA_ERRORS", "cuda_error", "cupti_error", "CUPTI_ERRORS"]

#: name -> (cudaError_t value, cudaGetErrorString text)
CUDA_ERRORS: dict[str, tuple[int, str]] = {
    "cudaErrorInvalidValue": (1, "invalid argument"),
    "cudaErrorMemoryAllocation": (2, "out of memory"),
    "cudaErrorNoDevice": (100, "no CUDA-capable device is detected"),
    "cudaErrorInvalidDevice": (101, "invalid device ordinal"),
    "cudaErrorUnsupportedLimit": (215, "limit is not supported on this architecture"),
    "cudaErrorInvalidResourceHandle": (400, "invalid resource handle"),
    "cudaErrorIllegalState": (401, "the operation cannot be performed in the present state"),
    "cudaErrorIllegalAddress": (700, "an illegal memory access was encountered"),
    "cudaErrorMisalignedAddress": (716, "misaligned address"),
    "cudaErrorNotSupported": (801, "operation not supported"),
    "cudaErrorStreamCaptureUnsupported": (900, "operation not permitted when stream is capturing"),
    "cudaErrorStreamCaptureInvalidated": (901, "operation failed due to a previous error during capture"),
}

#: CUptiResult names the simulator uses -> value
CUPTI_ERRORS: dict[str, int] = {
    "CUPTI_ERROR_INVALID_PARAMETER": 1,
    "CUPTI_ERROR_INVALID_OPERATION": 7,
    "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED": 39,
}


def cuda_error(call: str, name: str, details: str = "") -> CudaError:
    """A CudaError as the extension raises it: the call as written in the C++ core, CUDA's name, code
    and message, and the details (device, pointers, bytes)."""
    code, text = CUDA_ERRORS[name]
    return CudaError(call, code, name, text, details)


def cupti_error(call: str, name: str, detail: str = "") -> CuptiError:
    """A CuptiError as the extension raises it (``call failed: CUPTI error N: message``); ``name`` is a
    CUptiResult name, or "load" for a library that could not be opened (code -1)."""
    code = -1 if name == "load" else CUPTI_ERRORS[name]
    text = detail if name == "load" else name + (f" ({detail})" if detail else "")
    return CuptiError(call, code, f"{call} failed: CUPTI error {code}: {text}")
