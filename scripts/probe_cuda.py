"""Records what CUDA itself does with L2 persistence on this machine (JSON to stdout or a file).

Needs cuda-python (cuda.bindings), through which it makes CUDA's own state-setting calls. Answers the questions
l2ctl's design depends on: the limit in a fresh process; the granularity; what
setting a window on the default streams does; how a window is cleared; whether stream capture copies
the stream's window into kernel nodes; whether changing the stream after capture changes replays;
what an instantiated graph needs to pick up a new node window. Restores the limit it found.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from cuda.bindings import runtime as rt  # cuda-python: CUDA's own calls, which l2ctl makes only through its planner

import l2ctl
from l2ctl import _core, kernels

MiB = 1 << 20
LIMIT = rt.cudaLimit.cudaLimitPersistingL2CacheSize


def cuda(call: str, result: tuple) -> tuple:
    """A cuda.bindings call's values, or a RuntimeError naming the call and CUDA's error."""
    if result[0] != rt.cudaError_t.cudaSuccess:
        rt.cudaGetLastError()
        raise RuntimeError(f"{call} failed: {result[0].name}")
    return result[1:]


def set_persisting_limit(device: int, nbytes: int) -> int:
    """cudaDeviceSetLimit, then the limit granted, read back."""
    cuda("cudaSetDevice", rt.cudaSetDevice(device))
    cuda("cudaDeviceSetLimit", rt.cudaDeviceSetLimit(LIMIT, nbytes))
    return int(cuda("cudaDeviceGetLimit", rt.cudaDeviceGetLimit(LIMIT))[0])


def _window(value, base: int, num_bytes: int, hit_ratio: float, hit_prop: int, miss_prop: int):
    w = value.accessPolicyWindow
    w.base_ptr, w.num_bytes, w.hitRatio = base, num_bytes, hit_ratio
    w.hitProp, w.missProp = rt.cudaAccessProperty(hit_prop), rt.cudaAccessProperty(miss_prop)
    return value


def set_stream_window(stream: int, *window) -> None:
    ids = rt.cudaStreamAttrID  # cuda-python 13 names it by the launch attribute's name
    attribute = getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None) or ids.cudaStreamAttributeAccessPolicyWindow
    value = _window((getattr(rt, "cudaStreamAttrValue", None) or rt.cudaLaunchAttributeValue)(), *window)
    cuda("cudaStreamSetAttribute", rt.cudaStreamSetAttribute(rt.cudaStream_t(stream), attribute, value))


def set_node_window(node: int, *window) -> None:
    ids = rt.cudaKernelNodeAttrID
    attribute = (getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None)
                 or ids.cudaKernelNodeAttributeAccessPolicyWindow)
    value = _window((getattr(rt, "cudaKernelNodeAttrValue", None) or rt.cudaLaunchAttributeValue)(), *window)
    cuda("cudaGraphKernelNodeSetAttribute", rt.cudaGraphKernelNodeSetAttribute(rt.cudaGraphNode_t(node), attribute,
                                                                               value))


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as exc:  # recorded, not raised: this is a probe
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    dev = _core.current_device()
    out: dict = {"device": _core.device_properties(dev)["name"], "limit_at_process_start": _core.get_persisting_limit(dev)}
    start_limit = out["limit_at_process_start"]
    props = _core.device_properties(dev)
    try:
        out["granularity"] = l2ctl.set_aside_granularity(dev)
        out["set_3MiB_plus_12345"] = set_persisting_limit(dev, 3 * MiB + 12345)
        out["set_over_max"] = attempt(lambda: set_persisting_limit(dev, props["persisting_l2_cache_max_size"] + 1))
        out["limit_after_over_max"] = _core.get_persisting_limit(dev)
        buf = l2ctl.DeviceBuffer(4 * MiB)
        for name, handle in (("legacy_default_0", 0), ("cudaStreamLegacy_1", 1), ("cudaStreamPerThread_2", 2)):
            r = attempt(lambda h=handle: set_stream_window(h, buf.ptr, buf.nbytes, 0.5, 2, 1))
            r["read_back"] = attempt(lambda h=handle: list(_core.get_stream_window(h)))
            r["clear"] = attempt(lambda h=handle: set_stream_window(h, 0, 0, 0.0, 0, 0))
            r["after_clear"] = attempt(lambda h=handle: list(_core.get_stream_window(h)))
            out[f"window_on_{name}"] = r
        s = l2ctl.Stream()
        out["fresh_stream_window"] = list(_core.get_stream_window(s.handle))
        out["clear_with_zero_window"] = attempt(lambda: set_stream_window(s.handle, 0, 0, 0.0, 0, 0))
        out["window_over_max"] = attempt(lambda: set_stream_window(
            s.handle, buf.ptr, props["access_policy_max_window_size"] + 1, 0.5, 2, 1))
        out["hit_ratio_1.0000001"] = attempt(lambda: set_stream_window(s.handle, buf.ptr, buf.nbytes, 1.0000001, 2, 1))
        out["hit_ratio_-0.1"] = attempt(lambda: set_stream_window(s.handle, buf.ptr, buf.nbytes, -0.1, 2, 1))
        out["window_on_host_pointer"] = attempt(lambda: set_stream_window(
            s.handle, np.zeros(16).ctypes.data, 128, 0.5, 2, 1))
        set_stream_window(s.handle, 0, 0, 0.0, 0, 0)
        # graphs
        lut = l2ctl.DeviceBuffer.from_numpy(np.arange(1024, dtype=np.int32))
        o = l2ctl.DeviceBuffer(4 * MiB, dtype=np.int32)
        set_stream_window(s.handle, lut.ptr, lut.nbytes, 0.75, 2, 1)
        _core.begin_capture(s.handle, 2)  # relaxed
        kernels.reset_data(o, lut, s)
        g = _core.end_capture(s.handle)
        nodes = _core.graph_kernel_nodes(g)
        out["capture_kernel_nodes"] = [[n[1], list(n[2]), list(n[3])] for n in nodes]
        out["capture_copies_stream_window"] = [list(_core.get_node_window(n[0])) for n in nodes]
        set_stream_window(s.handle, 0, 0, 0.0, 0, 0)
        out["node_window_after_stream_cleared"] = [list(_core.get_node_window(n[0])) for n in nodes]
        ex = _core.GraphExec(g)
        set_node_window(nodes[0][0], lut.ptr, lut.nbytes, 0.25, 2, 1)
        out["node_window_set"] = list(_core.get_node_window(nodes[0][0]))
        out["exec_update_after_node_window_change"] = attempt(lambda: ex.update(g))
        ex.launch(s.handle)
        s.synchronize()
        out["replay_correct"] = kernels.verify_reset_data(o, lut, s) == 0
        ex.destroy()
        _core.Graph(g, True).destroy()
        s.close()
        lut.free(); o.free(); buf.free()
    finally:
        set_persisting_limit(dev, start_limit)
        out["limit_restored"] = _core.get_persisting_limit(dev) == start_limit
    text = json.dumps(out, indent=2, default=str)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
