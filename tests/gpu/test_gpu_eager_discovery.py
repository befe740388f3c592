"""On the GPU, with PyTorch: eager discovery. The launch recorder (CUPTI's callbacks on the driver's launch calls)
reads the arguments of l2ctl's own kernels (cuLaunchKernel) and of torch's (<<<>>>, through the runtime); a
GNN layer's output, allocated inside the step, is found at the same address every step and named a temporary
of the step; one kept until the next step moves and is reported; tune(step, stream, "discover") leaves the
device as it found it. (What it gains is scripts/bench_eager_discovery.py's business.)"""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import _backend, _kernel_buffers, candidates, kernels
from l2ctl._counters import load_cupti

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="these tests need PyTorch")
MiB = 1 << 20


@pytest.fixture
def tstream(gpu_state):
    """A torch stream that runs after what the current stream queued, watched for the state it leaves."""
    s = torch.cuda.Stream(torch.device("cuda", l2ctl.device_info().index))
    s.wait_stream(torch.cuda.current_stream(s.device))
    gpu_state.watch(s)
    yield s
    torch.cuda.current_stream(s.device).wait_stream(s)
    s.synchronize()


def _recorder():
    """A launch recorder, or a skip saying why CUPTI cannot record here."""
    try:
        load_cupti()
        return _backend.current().LaunchRecorder(10_000)
    except l2ctl.CountersUnavailableError as exc:
        pytest.skip(f"CUPTI cannot record launches here: {exc}")


class Layer:
    """``out = torch.zeros(N, D).index_add_(0, dst, x[src])`` with N x D x 4 = 0.6 x L2; ``colsum`` reads out, as a
    next layer would. ``seen`` holds each step's output address (not the tensor: it must be freed)."""

    def __init__(self, keep: bool = False, dim: int = 16, edges: int = 1 << 20) -> None:
        info = l2ctl.device_info()
        self.dev = torch.device("cuda", info.index)
        self.nodes = int(0.6 * info.l2_cache_size) // (4 * dim)
        g = torch.Generator(device=self.dev).manual_seed(0)
        self.x = torch.randint(0, 4, (self.nodes, dim), device=self.dev, generator=g).float()
        self.src = torch.randint(0, self.nodes, (edges,), device=self.dev, generator=g)
        self.dst = torch.randint(0, self.nodes, (edges,), device=self.dev, generator=g)
        self.colsum = torch.zeros(dim, device=self.dev)
        self.expected = torch.bincount(self.src, minlength=self.nodes).double() @ self.x.double()
        self.keep, self.kept, self.seen = keep, [], []
        self.dim = dim

    def step(self, stream) -> None:
        with torch.cuda.stream(stream):
            out = torch.zeros(self.nodes, self.dim, device=self.dev).index_add_(0, self.dst, self.x[self.src])
            torch.sum(out, 0, out=self.colsum)
            self.seen.append(out.data_ptr())
            if self.keep:
                self.kept[:] = [out]

    def correct(self) -> bool:
        torch.cuda.synchronize(self.dev)
        return bool(torch.allclose(self.colsum.double(), self.expected, rtol=1e-4))


def test_the_recorder_reads_the_arguments_of_l2ctls_and_torchs_kernels(stream):
    recorder = _recorder()
    info = l2ctl.device_info()
    with l2ctl.DeviceBuffer(4 * MiB) as lut, l2ctl.DeviceBuffer(64 * MiB) as out:
        lut.fill_bytes(1, stream)
        kernels.reset_data(out, lut, stream)  # compiled and loaded before the recording
        recorder.start()
        try:
            kernels.reset_data(out, lut, stream)  # l2ctl calls cuLaunchKernel itself
            t = torch.zeros(1 << 20, device=torch.device("cuda", info.index))  # torch's <<<>>>, through the runtime
            t.add_(1.0)
        finally:
            launches = recorder.stop()
        stream.synchronize()
        pointers = {out.ptr, lut.ptr}
    shown = [(name, [hex(w[2]) for w in words][:6]) for name, _s, _d, words in launches]
    ours = [l for l in launches if "reset_data" in l[0]]
    assert ours, f"l2ctl's kernel was not seen; launches: {shown}"
    name, handle, device, words = ours[0]
    values = {w[2] for w in words}
    assert pointers <= values and device == info.index and handle == stream.handle, (name, words)
    torch_launches = [l for l in launches if t.data_ptr() in {w[2] for w in l[3]}]
    assert torch_launches, f"torch's kernels were not seen with their arguments (the runtime's launches did not fire " \
                           f"the driver's launch callbacks); {shown}"
    assert all(device == info.index for _n, _s, device, _w in launches)


def test_a_temporary_of_an_eager_step_is_found_at_the_same_address_every_step(tstream):
    _recorder()
    layer = Layer()
    found = _kernel_buffers.record_steps(lambda: layer.step(tstream), layer.dev.index)
    assert layer.correct()
    recorded = layer.seen[1:]  # the warm-up's first, then the recorded steps'
    assert len(set(recorded)) == 1, [hex(p) for p in layer.seen]  # torch's cache gave the block back every step
    out = recorded[0]
    holding = [b for b in found.stable if b.ptr <= out < b.ptr + b.nbytes]
    assert holding, [b.describe() for b in found.stable]
    (b,) = holding
    assert b.owner == "a temporary of the step" and b.nbytes >= layer.nodes * layer.dim * 4, b.describe()
    assert any("indexFunc" in k for k in b.kernels), b.describe()  # index_add_'s kernel (indexFunc{Small,Large}Index)
    assert not found.moved and found.steps == 3 and len(set(found.launches)) == 1
    listed = candidates.from_steps(lambda: layer.step(tstream))
    assert b.name in listed.tried, listed.summary()


def test_a_temporary_kept_until_the_next_step_moves_and_is_not_tried(tstream):
    _recorder()
    layer = Layer(keep=True)
    listed = candidates.from_steps(lambda: layer.step(tstream))
    assert layer.correct()
    moving = {name: why for name, why in listed.skipped.items() if why.startswith("moves between steps")}
    assert moving and not any(name in listed.tried for name in moving), listed.skipped
    assert len(set(layer.seen[1:])) > 1, [hex(p) for p in layer.seen]


def test_tune_discover_on_an_eager_step_leaves_the_device_as_found(tstream):
    _recorder()
    layer = Layer()

    def step(s) -> None:
        layer.step(s)

    step.verify = lambda s: layer.correct()  # type: ignore[attr-defined]
    limit = l2ctl.get_set_aside()
    tuned = l2ctl.tune(step, tstream, "discover", rounds=3, repeat=3)
    assert layer.correct() and l2ctl.get_set_aside() == limit
    considered = tuned.considered
    assert considered is not None and considered.tried, considered
    assert any("a temporary of the step" in considered.details[name] for name in considered.tried), considered.details
    if tuned.persists:  # the measurement decides which range (the step's temporary or another): it is one tried
        assert tuned.buffer_name in considered.tried
        with tuned.persist(tstream):
            layer.step(tstream)
        assert layer.correct()
    assert l2ctl.get_set_aside() == limit


def test_discovery_and_counters_share_cupti_one_at_a_time(tstream):
    _recorder()
    layer = Layer()
    try:
        with l2ctl.counters(metrics=["gpu__time_duration.sum"]):
            try:
                candidates.from_steps(lambda: layer.step(tstream))
            except l2ctl.CountersUnavailableError as exc:  # the profiler's launch callbacks hold the subscription
                assert "another CUPTI user" in str(exc)
    except l2ctl.CountersUnavailableError as exc:
        if "another CUPTI user" in str(exc):
            raise
        pytest.skip(f"counters unavailable here: {exc}")
    candidates.from_steps(lambda: layer.step(tstream))  # released: discovery records again
    with l2ctl.counters(metrics=["gpu__time_duration.sum"]) as c:
        layer.step(tstream)
    assert len(c.results) >= 3, [k.name for k in c.results]  # zeros, the gather, index_add, the sum: counted
