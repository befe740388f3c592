"""Shared fixtures and helpers. GPU tests carry the ``gpu`` marker and skip, with the reason, where no GPU
that can persist L2 is present; every GPU test is checked afterwards for leaving the device as it found it.
``crossings`` counts the calls l2ctl makes into the backend; ``hostile`` is the table of hostile inputs to
every public call (run on the simulator by tests/api and on a GPU by tests/gpu); ``run_threads`` runs a
worker in threads and re-raises what they raised; ``trees`` stands in for torch's graph trees and ``scatter``
makes the simulator's scatter-add kernel (tests/graph)."""

from __future__ import annotations

import fractions
import threading
import types
from typing import Any, Callable

import numpy as np
import pytest

import l2ctl
from l2ctl import AccessPolicyWindow, AccessProperty, _backend, _core, bench, graph, kernels, sweep
from l2ctl._interop import parse_cuda_array_interface, resolve_buffer, resolve_stream
from l2ctl.testing import FakeBackend, FakeDevice
from l2ctl.workloads import ResetDataWorkload

MiB = 1 << 20
NAN = float("nan")


def _gpu_skip_reason() -> str | None:
    if _core.device_count() == 0:
        return f"no CUDA GPU on this machine ({_core.device_count_error()})"
    try:
        info = l2ctl.device_info()
    except Exception as exc:  # pragma: no cover - depends on the machine
        return f"device query failed: {exc}"
    if not info.supports_persistence:
        return f"{info.name}: {info.unsupported_reason}"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_threads() -> Callable[..., None]:
    """``run_threads(worker, args, timeout=60)``: ``worker(*a)`` in a thread per ``a`` in ``args``, all started
    together and joined; the first exception a thread raised is raised here. Filter the warnings a worker may
    raise on the test (``pytest.mark.filterwarnings``), not in the threads: warnings.catch_warnings is not
    thread-safe."""

    def run(worker: Callable[..., None], args: list[tuple[Any, ...]], timeout: float = 60) -> None:
        errors: list[BaseException] = []

        def guarded(*a: Any) -> None:
            try:
                worker(*a)
            except BaseException as exc:  # re-raised below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=a) for a in args]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
        if errors:
            raise errors[0]

    return run


@pytest.fixture
def fake() -> FakeBackend:
    """A simulated H100 in place of the CUDA extension."""
    with FakeBackend.installed(FakeDevice.h100()) as backend:
        yield backend


@pytest.fixture
def scope_parts(fake: FakeBackend) -> types.SimpleNamespace:
    """What the interrupt tests make every kind of scope from: two streams (``t`` with a base window a scope must
    give back), a small and a big buffer, a captured graph of four kernels, and ``nested``, a block of two scopes
    on the two streams sharing a set-aside."""
    s, t = l2ctl.Stream(), l2ctl.Stream()
    small, big = l2ctl.DeviceBuffer(2 * MiB), l2ctl.DeviceBuffer(16 * MiB)
    with graph.capture(s) as g:
        for _ in range(4):
            fake.launch_fake_kernel(s.handle)
    l2ctl.set_window(t, l2ctl.AccessPolicyWindow.for_buffer(small, 0.25))

    def nested() -> None:
        with l2ctl.persist(s, small, 0.5), l2ctl.persist(t, big, 0.25, set_aside=2 * 3_276_800, share=True):
            pass

    return types.SimpleNamespace(s=s, t=t, small=small, big=big, g=g, nested=nested)


@pytest.fixture
def trees(fake: FakeBackend):
    """The simulator's stand-in for torch.compile's CUDA graph trees, in place of torch's for the test."""
    from l2ctl import _torch_graphs
    from l2ctl.testing.torch_graphs import FakeGraphTrees

    stand_in = FakeGraphTrees()
    previous = _torch_graphs.use_trees(stand_in)
    try:
        yield stand_in
    finally:
        _torch_graphs.use_trees(previous)
        stand_in.close()


@pytest.fixture
def scatter(fake: FakeBackend) -> Callable[[Any], Callable[[int], None]]:
    """``scatter(acc)``: a kernel launcher (stream handle -> None) that re-reads ``acc`` at random while updates
    stream past, as a scatter-add does (the simulator's stand-in for the gallery's,
    l2ctl.testing.ModeledWorkload.scatter_add)."""
    def make(acc: Any) -> Callable[[int], None]:
        def launch(stream: int) -> None:
            fake.launch_modeled_kernel(stream, "index_add", streamed_bytes=1.5 * (1 << 30), hot=(acc.ptr, acc.nbytes),
                                       hot_reads=32 * (1.5 * (1 << 30) / 12), read_fraction=0.98)
        return launch
    return make


@pytest.fixture
def scatter_add_case() -> types.SimpleNamespace:
    """On the GPU, with torch: an accumulator of 0.64 x L2 (sized from this GPU), the updates a scatter-add adds
    into it (``index``, ``values``) and the expected sum (float64)."""
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    info = l2ctl.device_info()
    dev = torch.device("cuda", info.index)
    g = torch.Generator(device=dev).manual_seed(0)
    acc = torch.zeros(int(0.64 * info.l2_cache_size) // 4, device=dev)
    index = torch.randint(0, acc.numel(), (16 << 20,), device=dev, generator=g)
    values = torch.randint(1, 5, (index.numel(),), device=dev, generator=g).float()
    expected = torch.zeros_like(acc, dtype=torch.float64).index_add_(0, index, values.double())
    yield types.SimpleNamespace(acc=acc, index=index, values=values, expected=expected)
    torch.cuda.synchronize()


@pytest.fixture
def gpu_state():
    """Records the device limit at the start of a GPU test and asserts it is unchanged at the end;
    streams registered with ``gpu_state.watch(stream)`` must end with the window they started with."""

    class Watch:
        def __init__(self) -> None:
            self.device = l2ctl.device_info().index
            self.limit = l2ctl.get_set_aside(self.device)
            self.streams: list[tuple[object, l2ctl.AccessPolicyWindow]] = []

        def watch(self, stream: object) -> object:
            self.streams.append((stream, l2ctl.get_window(stream)))
            return stream

    assert _backend.current() is _core, "a GPU test must run on the real backend"
    watch = Watch()
    yield watch
    assert l2ctl.get_set_aside(watch.device) == watch.limit, "the test left the set-aside limit changed"
    for stream, window in watch.streams:
        if getattr(stream, "closed", False):
            continue
        assert l2ctl.get_window(stream) == window, "the test left a stream window changed"


@pytest.fixture
def stream(gpu_state):
    """A new l2ctl stream on the GPU, current in the test, watched for the state it leaves."""
    with l2ctl.Stream() as s:
        gpu_state.watch(s)
        yield s


@pytest.fixture(autouse=True)
def _every_gpu_test_restores_the_device(request):
    """Every GPU test gets the gpu_state check (the limit, and the windows of the streams it watches)."""
    if request.node.get_closest_marker("gpu") is not None and GPU_SKIP_REASON is None:
        request.getfixturevalue("gpu_state")
    yield


# ---- counting crossings into the backend --------------------------------------------------------------

class Crossings:
    """Counts the calls l2ctl makes into the backend (each one a crossing into C++ on a GPU)."""

    def __init__(self, fake: FakeBackend, names: tuple[str, ...]) -> None:
        self.count: dict[str, int] = {}
        self.depth = 0  # the simulator's own calls to its other methods are not crossings
        for name in names:
            original = getattr(fake, name)

            def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original) -> Any:
                if self.depth == 0:
                    self.count[_name] = self.count.get(_name, 0) + 1
                self.depth += 1
                try:
                    return _original(*args)
                finally:
                    self.depth -= 1

            setattr(fake, name, counted)

    def total(self) -> int:
        return sum(self.count.values())


NAMES = ("apply_batch", "get_stream_window", "get_persisting_limit", "set_persisting_limit", "reset_persisting_lines",
         "device_properties", "device_count", "pointer_info", "stream_device", "current_device")


@pytest.fixture
def crossings(fake: FakeBackend) -> Callable[..., Crossings]:
    """``crossings()`` starts counting the simulator's calls of NAMES (or the names given) from now."""
    return lambda names=NAMES: Crossings(fake, names)


# ---- the hostile-input table -------------------------------------------------------------------------

STATE_CHANGES = {"cudaDeviceSetLimit", "cudaStreamSetAttribute", "cudaGraphKernelNodeSetAttribute",
                 "cudaCtxResetPersistingL2Cache"}
Case = tuple[str, Callable[[], Any], type[BaseException]]


class Objects:
    """What the calls are made on: a stream, buffers (one 16-byte aligned, one big), a graph."""

    def __init__(self) -> None:
        self.s = l2ctl.Stream()
        self.buf = l2ctl.DeviceBuffer(MiB)
        self.partials = l2ctl.DeviceBuffer(64 * 1024)
        with graph.capture(self.s) as g:
            kernels.write_index(self.buf, self.s)
        self.g = g

    def work(self, stream: object) -> None:
        kernels.write_index(self.buf, stream)


def cases(o: Objects) -> list[Case]:
    """The table; run on the simulator by tests/api/test_hostile.py, on a GPU by tests/gpu/test_gpu_registry.py."""
    s, buf, p = o.s, o.buf, o.partials
    maximum = l2ctl.device_info().persisting_l2_cache_max_size
    host = np.zeros(64, dtype=np.int32)
    past = (buf.ptr, 8 * MiB)  # runs past its allocation (whatever page rounding the driver does)
    window = AccessPolicyWindow.for_buffer(buf, 0.5)
    return [
        # devices and the set-aside
        ("device_info(-1)", lambda: l2ctl.device_info(-1), ValueError),
        ("device_info(7)", lambda: l2ctl.device_info(7), ValueError),
        ("device_info('0')", lambda: l2ctl.device_info("0"), TypeError),
        ("get_set_aside(True)", lambda: l2ctl.get_set_aside(True), TypeError),
        ("set_aside(-1)", lambda: l2ctl.set_aside(-1), ValueError),
        ("set_aside(nan)", lambda: l2ctl.set_aside(NAN), ValueError),
        ("set_aside(1.5)", lambda: l2ctl.set_aside(1.5), ValueError),
        ("set_aside('lots')", lambda: l2ctl.set_aside("lots"), ValueError),  # type: ignore[arg-type]
        ("set_aside(None)", lambda: l2ctl.set_aside(None), TypeError),  # type: ignore[arg-type]
        ("set_aside(over max)", lambda: l2ctl.set_aside(maximum + 1), ValueError),
        ("set_aside(device=9)", lambda: l2ctl.set_aside(0, device=9), ValueError),
        ("reset_persisting_lines('x')", lambda: l2ctl.reset_persisting_lines("x"), TypeError),
        ("set_aside_granularity(-3)", lambda: l2ctl.set_aside_granularity(-3), ValueError),
        ("budget(2.5)", lambda: l2ctl.budget(2.5), TypeError),
        ("hit_ratio_grid(1)", lambda: l2ctl.hit_ratio_grid(1), ValueError),
        ("hit_ratio_grid(2**63)", lambda: l2ctl.hit_ratio_grid(2**63), ValueError),
        ("hit_ratio_grid(stop<start)", lambda: l2ctl.hit_ratio_grid(3, 0.9, 0.1), ValueError),
        ("hit_ratio_grid(stop 10**400)", lambda: l2ctl.hit_ratio_grid(3, 0.0, 10**400), ValueError),
        ("set_aside(Fraction 10**400)", lambda: l2ctl.set_aside(fractions.Fraction(10**400, 3)), ValueError),
        ("shared_hit_ratios(10**400)", lambda: l2ctl.shared_hit_ratios([(10**400, 64)], 1024), ValueError),
        ("Policy(hit_ratio -10**400)", lambda: l2ctl.Policy(hit_ratio=-10**400), ValueError),
        # windows
        ("get_window('s')", lambda: l2ctl.get_window("s"), TypeError),
        ("set_window(s, dict)", lambda: l2ctl.set_window(s, {"base_ptr": 1}), TypeError),  # type: ignore[arg-type]
        ("set_window(hit 2)", lambda: l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, 64, 2.0)), ValueError),
        ("set_window(hit 10**400)", lambda: l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, 64, 10**400)), ValueError),
        ("for_buffer(hit 10**400)", lambda: AccessPolicyWindow.for_buffer(buf, 10**400), ValueError),
        ("set_window(miss persisting)", lambda: l2ctl.set_window(
            s, AccessPolicyWindow(buf.ptr, 64, 0.5, AccessProperty.PERSISTING, AccessProperty.PERSISTING)), ValueError),
        ("set_window(host)", lambda: l2ctl.set_window(s, AccessPolicyWindow(host.ctypes.data, 64, 0.5)), ValueError),
        ("set_window(past)", lambda: l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, 8 * MiB, 0.5)), ValueError),
        ("set_window(over max window)", lambda: l2ctl.set_window(s, AccessPolicyWindow(buf.ptr, 129 * MiB, 0.5)),
         ValueError),
        ("clear_window(1.0)", lambda: l2ctl.clear_window(1.0), TypeError),
        ("scoped_window(s, None)", lambda: l2ctl.scoped_window(s, None), TypeError),  # type: ignore[arg-type]
        ("scoped_window(bad target)", lambda: l2ctl.scoped_window(object(), window).__enter__(), TypeError),
        # persist
        ("persist(policy + ratio)", lambda: l2ctl.persist(s, buf, 0.5, policy=l2ctl.Policy()), ValueError),
        ("persist(policy + set_aside)", lambda: l2ctl.persist(s, buf, set_aside=None, policy=l2ctl.Policy()),
         ValueError),
        ("persist(policy object)", lambda: l2ctl.persist(s, buf, policy=object()), TypeError),
        ("persist(hit_prop 2.0)", lambda: l2ctl.persist(s, buf, 0.5, hit_prop=2.0), TypeError),  # type: ignore[arg-type]
        ("persist(np.bool_)", lambda: l2ctl.persist(s, buf, np.bool_(True)), TypeError),  # type: ignore[arg-type]
        ("persist(share=1)", lambda: l2ctl.persist(s, buf, 0.5, share=1), TypeError),  # type: ignore[arg-type]
        ("persist(past)", lambda: l2ctl.persist(s, past, 0.5).__enter__(), ValueError),
        ("persist(hit 10**400)", lambda: l2ctl.persist(s, buf, 10**400), ValueError),
        ("persist(graph, empty selection)", lambda: l2ctl.persist(o.g.select(lambda k: False), buf, 0.5).__enter__(),
         ValueError),
        # memory and streams
        ("Stream(device=5)", lambda: l2ctl.Stream(5), ValueError),
        ("DeviceBuffer(0)", lambda: l2ctl.DeviceBuffer(0), ValueError),
        ("DeviceBuffer(2**64)", lambda: l2ctl.DeviceBuffer(2**64), ValueError),
        ("DeviceBuffer(beyond memory)", lambda: l2ctl.DeviceBuffer(1 << 50), ValueError),
        ("DeviceBuffer(1.5)", lambda: l2ctl.DeviceBuffer(1.5), TypeError),  # type: ignore[arg-type]
        ("DeviceBuffer(shape 2.5)", lambda: l2ctl.DeviceBuffer(16, shape=(2.5,)), TypeError),  # type: ignore[arg-type]
        ("DeviceBuffer(shape mismatch)", lambda: l2ctl.DeviceBuffer(16, dtype=np.int32, shape=(5,)), ValueError),
        ("from_numpy(empty)", lambda: l2ctl.DeviceBuffer.from_numpy(np.zeros(0)), ValueError),
        # interop
        ("resolve_stream(-1)", lambda: resolve_stream(-1), ValueError),
        ("resolve_buffer(numpy)", lambda: resolve_buffer(host), ValueError),
        ("resolve_buffer(3 ints)", lambda: resolve_buffer((1, 2, 3)), TypeError),
        ("CAI shape (2.9,)", lambda: parse_cuda_array_interface({"shape": (2.9,), "typestr": "<f4",
                                                                "data": (buf.ptr, False)}), TypeError),
        ("CAI shape ('16',)", lambda: parse_cuda_array_interface({"shape": ("16",), "typestr": "<f4",
                                                                 "data": (buf.ptr, False)}), TypeError),
        ("CAI shape overflow", lambda: parse_cuda_array_interface({"shape": (2**32 + 1, 2**32), "typestr": "<f4",
                                                                  "data": (buf.ptr, False)}), ValueError),
        ("CAI pointer -16", lambda: parse_cuda_array_interface({"shape": (4,), "typestr": "<f4",
                                                               "data": (-16, False)}), ValueError),
        ("CAI pointer 2**64", lambda: parse_cuda_array_interface({"shape": (4,), "typestr": "<f4",
                                                                 "data": (2**64, False)}), ValueError),
        ("CAI strides float", lambda: parse_cuda_array_interface({"shape": (4,), "typestr": "<f4", "strides": (4.0,),
                                                                 "data": (buf.ptr, False)}), TypeError),
        # graphs
        ("capture(default stream)", lambda: graph.capture(None).__enter__(), ValueError),
        ("capture(mode 9)", lambda: graph.capture(s, mode=9).__enter__(), ValueError),  # type: ignore[arg-type]
        ("as_graph('x')", lambda: graph.as_graph("x"), TypeError),
        ("as_graph(-1)", lambda: graph.as_graph(-1), ValueError),
        ("Graph(0)", lambda: graph.Graph(0), ValueError),
        ("select(not callable)", lambda: o.g.select(3), TypeError),  # type: ignore[arg-type]
        ("Graph.set_window(hit 1.5)", lambda: o.g.set_window(AccessPolicyWindow(buf.ptr, 64, 1.5)), ValueError),
        ("Graph.set_window(past)", lambda: o.g.set_window(AccessPolicyWindow(buf.ptr, 8 * MiB, 0.5)), ValueError),
        # kernels
        ("reset_data(variant)", lambda: kernels.reset_data(buf, buf, s, variant="fastest"), ValueError),
        ("reset_data(variant 2.0)", lambda: kernels.reset_data(buf, buf, s, variant=2.0), TypeError),
        ("reset_data(blocks_per_sm -1)", lambda: kernels.reset_data(buf, buf, s, blocks_per_sm=-1), ValueError),
        ("reset_data(host out)", lambda: kernels.reset_data(host, buf, s), ValueError),
        ("reset_data(past)", lambda: kernels.reset_data(past, buf, s), ValueError),
        ("reset_data(misaligned)", lambda: kernels.reset_data((buf.ptr + 2, 64), buf, s), ValueError),
        ("reset_data(odd size)", lambda: kernels.reset_data((buf.ptr, 6), buf, s), ValueError),
        ("verify_reset_data(past)", lambda: kernels.verify_reset_data(past, buf, s), ValueError),
        ("write_index(unaligned 16)", lambda: kernels.write_index((buf.ptr + 4, 64), s), ValueError),
        ("count_index_mismatches(past)", lambda: kernels.count_index_mismatches(past, s), ValueError),
        ("copy_words(sizes)", lambda: kernels.copy_words((buf.ptr, 64), (buf.ptr + 64, 128), s), ValueError),
        ("count_mismatches(sizes)", lambda: kernels.count_mismatches((buf.ptr, 64), (buf.ptr, 32), s), ValueError),
        ("read_sum(small partials)", lambda: kernels.read_sum(buf, (p.ptr, 8), s), ValueError),
        ("stride_read(stride 3)", lambda: kernels.stride_read(buf, 3, p, s), ValueError),
        ("stride_read(block 33)", lambda: kernels.stride_read(buf, 4, p, s, block_threads=33), ValueError),
        ("stride_read(block 0)", lambda: kernels.stride_read(buf, 4, p, s, block_threads=0), ValueError),
        ("stride_read(threads 0)", lambda: kernels.stride_read(buf, 4, p, s, threads=0), ValueError),
        ("stride_read(too many threads)", lambda: kernels.stride_read(buf, 4, p, s, threads=MiB), ValueError),
        ("sum_u64(count)", lambda: kernels.sum_u64(p, 10**9, s), ValueError),
        ("sum_u64(-1)", lambda: kernels.sum_u64(p, -1, s), ValueError),
        ("sparse_vector(sizes)", lambda: kernels.sparse_vector(buf, (buf.ptr, 64), buf, buf, s), ValueError),
        ("sparse_vector(streaming 1)", lambda: kernels.sparse_vector(buf, buf, buf, buf, s, streaming=1),  # type: ignore[arg-type]
         TypeError),
        ("stream_analysis(sizes)", lambda: kernels.stream_analysis(buf, buf, buf, buf, s), ValueError),
        ("sectors_per_request(0)", lambda: kernels.sectors_per_request(0), ValueError),
        ("dram_bytes_per_request(-4)", lambda: kernels.dram_bytes_per_request(-4), ValueError),
        # the harness
        ("time_gpu(not callable)", lambda: bench.time_gpu(5, s), TypeError),  # type: ignore[arg-type]
        ("time_gpu(repeat 0)", lambda: bench.time_gpu(o.work, s, repeat=0), ValueError),
        ("time_gpu(warmup -1)", lambda: bench.time_gpu(o.work, s, warmup=-1), ValueError),
        ("time_gpu(repeat 2**63)", lambda: bench.time_gpu(o.work, s, repeat=2**63), ValueError),
        ("clean_state(nan)", lambda: bench.clean_state(s, set_aside=NAN).__enter__(), ValueError),  # type: ignore[arg-type]
        ("clean_state(-1)", lambda: bench.clean_state(s, set_aside=-1).__enter__(), ValueError),
        ("flush_l2('s')", lambda: bench.flush_l2("s"), TypeError),
        ("measure_ceilings(0)", lambda: bench.measure_ceilings(s, 0), ValueError),
        ("measure_ceilings(repeat 0)", lambda: bench.measure_ceilings(s, MiB, repeat=0), ValueError),
        ("bench_reset_data(LUT 3)", lambda: bench.bench_reset_data([3]), ValueError),
        ("bench_reset_data(column)", lambda: bench.bench_reset_data([MiB], columns=["best"]), ValueError),
        ("bench_reset_data(out -1)", lambda: bench.bench_reset_data([MiB], out_bytes=-1), ValueError),
        ("bench_reset_data(repeat 0)", lambda: bench.bench_reset_data([MiB], repeat=0), ValueError),
        ("bench_stride(6)", lambda: bench.bench_stride([6]), ValueError),
        ("bench_stride(threads 0)", lambda: bench.bench_stride([4], threads=0), ValueError),
        ("bench_cache_streaming(0)", lambda: bench.bench_cache_streaming(0), ValueError),
        ("bench_graph(LUT 6)", lambda: bench.bench_graph(6), ValueError),
        ("bench_graph(kernels 0)", lambda: bench.bench_graph(kernels_per_graph=0), ValueError),
        ("bench_concurrent(set_aside -1)", lambda: bench.bench_concurrent(set_aside=-1), ValueError),
        ("bench_concurrent(out 0)", lambda: bench.bench_concurrent(out_bytes=0), ValueError),
        ("bench_overhead(rounds 0)", lambda: bench.bench_overhead(rounds=0), ValueError),
        ("bench_overhead(variant)", lambda: bench.bench_overhead(variants=["fast"]), ValueError),
        ("measure_point(workload 5)", lambda: sweep.measure_point(5, s, buf, 0, None), TypeError),
        ("measure_point(set_aside -1)", lambda: sweep.measure_point(o.work, s, buf, -1, None), ValueError),
        ("measure_point(hit 2)", lambda: sweep.measure_point(o.work, s, buf, 0, 2.0), ValueError),
        ("sweep_hit_ratio([])", lambda: sweep.sweep_hit_ratio(o.work, s, buf, hit_ratios=[]), ValueError),
        ("sweep_hit_ratio(nan)", lambda: sweep.sweep_hit_ratio(o.work, s, buf, hit_ratios=[NAN]), ValueError),
        ("sweep_hit_ratio(10**400)", lambda: sweep.sweep_hit_ratio(o.work, s, buf, hit_ratios=[10**400]), ValueError),
        ("sweep_set_aside(-1)", lambda: sweep.sweep_set_aside(o.work, s, buf, set_asides=[-1]), ValueError),
        ("sweep_surface(hit 7)", lambda: sweep.sweep_surface(o.work, s, buf, hit_ratios=[7.0]), ValueError),
        ("sweep_lut_size(6)", lambda: sweep.sweep_lut_size([6], s), ValueError),
        ("sweep_lut_size(policy)", lambda: sweep.sweep_lut_size([MiB], s, policy="best"), ValueError),
        ("sweep_tax([])", lambda: sweep.sweep_tax(s, set_asides=[]), ValueError),
        ("sweep_tax(nbytes 0)", lambda: sweep.sweep_tax(s, nbytes=0), ValueError),
        ("set_aside_grid('x')", lambda: sweep.set_aside_grid("x"), TypeError),
        ("tune(workload 5)", lambda: l2ctl.tune(5, s, buf), TypeError),
        ("tune(buffer None)", lambda: l2ctl.tune(o.work, s, None), TypeError),
        ("tune(repeat 0)", lambda: l2ctl.tune(o.work, s, buf, repeat=0), ValueError),
        ("tune(warmup 2**63)", lambda: l2ctl.tune(o.work, s, buf, warmup=2**63), ValueError),
        ("tune(progress 'yes')", lambda: l2ctl.tune(o.work, s, buf, progress="yes"), TypeError),  # type: ignore[arg-type]
        ("tune(rounds 2)", lambda: l2ctl.tune(o.work, s, buf, rounds=2), ValueError),
        ("tune(confidence 1.0)", lambda: l2ctl.tune(o.work, s, buf, confidence=1.0), ValueError),
        ("tune(min_gain -0.1)", lambda: l2ctl.tune(o.work, s, buf, min_gain=-0.1), ValueError),
        ("tune(no candidates)", lambda: l2ctl.tune(o.work, s, {}), ValueError),
        ("tune(a host candidate)", lambda: l2ctl.tune(o.work, s, {"host": np.zeros(4)}), ValueError),
        ("ResetDataWorkload(6)", lambda: ResetDataWorkload(6), ValueError),
        ("ResetDataWorkload(out -1)", lambda: ResetDataWorkload(MiB, -1), ValueError),
        ("ResetDataWorkload(variant)", lambda: ResetDataWorkload(MiB, variant="x"), ValueError),
        ("counters(metrics [])", lambda: l2ctl.counters(metrics=[]), ValueError),
        ("collect(not callable)", lambda: l2ctl.collect(5), TypeError),  # type: ignore[arg-type]
    ]


@pytest.fixture
def hostile() -> types.SimpleNamespace:
    """The hostile-input table: ``Objects()`` (made on the backend in use), ``cases(objects)``, and the CUDA
    calls that change state (``STATE_CHANGES``), which no refused case may make."""
    return types.SimpleNamespace(Objects=Objects, cases=cases, STATE_CHANGES=STATE_CHANGES)
