"""Writes notebooks/*.ipynb (without outputs; arguments: the two-digit numbers of the ones to write). Executed copies, with the outputs of a real GPU run, are
made by tests/package/test_notebooks.py on the GPU (L2CTL_NOTEBOOK_OUT=dir) and committed; that test file also runs this
code on the simulated H100 and lists the committed cells that still wait for a GPU run of changed code."""

from __future__ import annotations

import os
import textwrap

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.join(os.path.dirname(__file__), "..", "notebooks")

SETUP = """%matplotlib inline
import numpy as np
import matplotlib.pyplot as plt
import l2ctl
from l2ctl import sweep, plot, bench
MiB = 1 << 20
info = l2ctl.device_info()
print(f"{info.name}: L2 {info.l2_cache_size / MiB:.2f} MiB, persisting max {info.persisting_l2_cache_max_size / MiB:.2f} MiB, "
      f"granularity {l2ctl.set_aside_granularity() / MiB:.3f} MiB (rounded {l2ctl.set_aside_rounding()}), "
      f"limit now {l2ctl.get_set_aside() / MiB:.2f} MiB")
stream = l2ctl.Stream()"""


def nb(cells):
    n = new_notebook(cells=cells)
    n.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    n.metadata["language_info"] = {"name": "python"}
    return n


HIT_RATIO = nb([
    new_markdown_cell("""# Exploring `hitRatio` and the set-aside

An access-policy window marks a byte range (here: a lookup table, LUT) so that a fraction `hitRatio` of its
L2 lines are *persisting*: they live in the set-aside part of L2 that normal (streaming) accesses cannot evict.
The workload is **reset-data**: the LUT repeated into a 1 GiB output, so every LUT line is read thousands of
times while a gigabyte of writes streams past.

The textbook advice is `hitRatio = set-aside / window` ("non-thrashing"). This notebook measures what really
happens on this GPU. Every point is verified (the output is checked on the device) and the device's limit is
restored after each one."""),
    new_code_cell(SETUP),
    new_markdown_cell("""## Time against hit ratio, at a right-sized set-aside

The LUT is 8% of L2 (4 MiB on a 50 MiB L2); the set-aside is the LUT rounded up to the driver's granularity.
The dashed line is the same kernel with no set-aside and no window."""),
    new_code_cell("""lut_bytes = (info.l2_cache_size * 4 // 50) // 16 * 16
with sweep.ResetDataWorkload(lut_bytes) as w:
    small = sweep.sweep_hit_ratio(w, stream, w.buf, progress=False)
plot.hit_ratio(small)
plt.show()
best = min(small.records, key=lambda r: r.median_ms)
print(f"baseline {small.baseline.median_ms:.3f} ms; best {best.median_ms:.3f} ms at hitRatio {best.config['hit_ratio']:.1f} "
      f"({small.baseline.median_ms / best.median_ms:.2f}x); hitRatio 0 costs {small.records[0].median_ms:.3f} ms")"""),
    new_markdown_cell("""## A LUT larger than the set-aside

Now the LUT is 64% of L2 (32 MiB on an H100), larger than the largest set-aside. The rule says
`hitRatio = max / LUT`. The set-aside itself shrinks the L2 left for the streaming writes, so compare
both the rule and the other hit ratios with the baseline."""),
    new_code_cell("""big_bytes = (info.l2_cache_size * 32 // 50) // 16 * 16
with sweep.ResetDataWorkload(big_bytes) as w:
    big = sweep.sweep_hit_ratio(w, stream, w.buf, set_aside=info.persisting_l2_cache_max_size, progress=False)
plot.hit_ratio(big)
plt.show()
rule = min(1.0, big.records[0].config['set_aside_granted'] / big_bytes)
at_rule = min(big.records, key=lambda r: abs(r.config['hit_ratio'] - rule))
best = min(big.records, key=lambda r: r.median_ms)
print(f"rule hitRatio {rule:.2f}: {at_rule.median_ms:.3f} ms; best {best.median_ms:.3f} ms at {best.config['hit_ratio']:.1f}; "
      f"baseline (no set-aside) {big.baseline.median_ms:.3f} ms")
print("persistence at the max set-aside", "beats" if best.median_ms < big.baseline.median_ms else "loses to",
      "doing nothing for this LUT")"""),
    new_markdown_cell("""## The whole surface: set-aside x hit ratio

Each cell is the speedup over no persistence (blue faster, red slower). The set-aside is not free: read the
columns from left to right."""),
    new_code_cell("""mid_bytes = (info.l2_cache_size * 8 // 50) // 16 * 16
with sweep.ResetDataWorkload(mid_bytes) as w:
    surf = sweep.sweep_surface(w, stream, w.buf, progress=False)
plot.surface(surf)
plt.show()
best = min(surf.records, key=lambda r: r.median_ms)
worst = max(surf.records, key=lambda r: r.median_ms)
print(f"best {surf.baseline.median_ms / best.median_ms:.2f}x at set-aside {best.config['set_aside_granted'] / MiB:.2f} MiB, "
      f"hitRatio {best.config['hit_ratio']:.1f}; worst {surf.baseline.median_ms / worst.median_ms:.2f}x at "
      f"{worst.config['set_aside_granted'] / MiB:.2f} MiB, {worst.config['hit_ratio']:.1f}")"""),
    new_markdown_cell("""## Try it yourself

With `ipywidgets` installed, the sliders measure one verified point per change; without it, the cell
measures a few points and prints them."""),
    new_code_cell("""granules = sweep.set_aside_grid()
def explore(lut_mib=4.0, set_aside_granules=2, hit_ratio=1.0):
    lut = int(lut_mib * MiB) // 16 * 16
    with sweep.ResetDataWorkload(lut) as w:
        base = sweep.measure_point(w, stream, w.buf, 0, None, repeat=7)
        rec = sweep.measure_point(w, stream, w.buf, granules[set_aside_granules], hit_ratio, repeat=7)
    print(f"LUT {lut_mib:g} MiB, set-aside {rec.config['set_aside_granted'] / MiB:.2f} MiB, hitRatio {hit_ratio:.2f}: "
          f"{rec.median_ms:.3f} ms vs {base.median_ms:.3f} ms without ({base.median_ms / rec.median_ms:.2f}x)")
try:
    import ipywidgets as widgets
    widgets.interact_manual(explore, lut_mib=(1.0, 48.0, 1.0), set_aside_granules=(0, len(granules) - 1),
                            hit_ratio=widgets.FloatSlider(min=0.0, max=1.0, step=0.05, value=1.0))
except ImportError:
    for args in [(4, 2, 1.0), (4, len(granules) - 1, 1.0), (16, 6, 1.0), (16, 6, 0.5)]:
        explore(*args)"""),
    new_code_cell("""stream.close()
print("limit back to", l2ctl.get_set_aside(), "bytes; live scopes:", l2ctl.budget().scopes)"""),
])

TAX = nb([
    new_markdown_cell("""# The set-aside tax, and a tuner that does no harm

The set-aside is carved out of L2 for the whole device. While it is set, **every other kernel** streams
through a smaller L2, with no window anywhere. This notebook measures that tax with plain copy and
write-only kernels, then lets `l2ctl.tune` choose a policy that accounts for it."""),
    new_code_cell(SETUP),
    new_code_cell("""tax = sweep.sweep_tax(stream, progress=False)
plot.tax(tax)
plt.show()
first, last = tax.records[0].metrics, tax.records[-1].metrics
print(f"copy: {first['copy_gbps']:,.0f} GB/s with no set-aside, {last['copy_gbps']:,.0f} GB/s at the max "
      f"({tax.summary['copy_slowdown_at_max']:.2f}x slower); write-only {tax.summary['write_slowdown_at_max']:.2f}x slower")"""),
    new_markdown_cell("""## The tuner

`l2ctl.tune(workload, stream, buf)` measures the baseline and every point in shuffled, paired rounds; a
point counts only when it is faster than the baseline beyond the noise (95% confidence); among the points
within noise of the best it takes the smallest set-aside, re-measures it, and reports what that set-aside
costs a plain copy running elsewhere on the GPU. When nothing wins the answer is "no persistence"."""),
    new_code_cell("""rows = []
for fraction in (2, 8, 16, 32, 48):
    lut = (info.l2_cache_size * fraction // 50) // 16 * 16
    with sweep.ResetDataWorkload(lut) as w:
        tuned = l2ctl.tune(w, stream, w.buf)
    rows.append((lut, tuned))
    print(f"LUT {lut / MiB:5.1f} MiB: {tuned}")"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
ax.bar([f"{lut / MiB:.0f}" for lut, _ in rows], [t.speedup for _, t in rows],
       color=["tab:blue" if t.persists else "tab:gray" for _, t in rows])
ax.axhline(1, color="k", ls="--")
ax.set_xlabel("LUT size (MiB)"); ax.set_ylabel("tuned speedup over no persistence (x)")
ax.set_title(f"{info.name}: what tune() chose (gray: no persistence)")
plt.show()"""),
    new_markdown_cell("""## Applying a tuned policy

A `TunedPolicy` goes straight into `persist`; a "no persistence" answer makes `persist` change nothing."""),
    new_code_cell("""lut, tuned = rows[1]
with sweep.ResetDataWorkload(lut) as w:
    with l2ctl.persist(stream, w.buf, policy=tuned) as p:
        with l2ctl.Timer(stream) as t:
            w.enqueue(stream)
        print("window:", p.window if p.active else "none", "| set-aside:", p.set_aside)
    print(f"one run: {t.elapsed_ms:.3f} ms; verified: {w.verify(stream)}")
stream.close()
print("limit back to", l2ctl.get_set_aside(), "bytes")"""),
])

STRIDE = nb([
    new_markdown_cell("""# Coalescing: sectors per request

L2 and DRAM move 32-byte *sectors*. When the 32 threads of a warp each load 4 bytes at a stride, the
request touches `sectors_per_request(stride)` sectors: 4 at 4 B, 8 at 8 B, 16 at 16 B, 32 at 32 B and above.
Useful bandwidth falls as the stride grows; sector bandwidth should stay near the read ceiling until the
stride passes 32 B, where DRAM, which delivers 64 bytes at a time, starts moving bytes nobody asked for."""),
    new_code_cell(SETUP),
    new_code_cell("""from l2ctl import kernels
for s in (4, 8, 16, 32, 64, 128):
    print(f"stride {s:3d} B: {kernels.sectors_per_request(s):2d} sectors per warp request, "
          f"{kernels.dram_bytes_per_request(s):4d} DRAM bytes (64 B granularity) for 128 useful bytes")"""),
    new_code_cell("""report = bench.bench_stride(progress=False)
plot.stride(report)
plt.show()
for r in report.records:
    m = r.metrics
    print(f"{r.config['stride_bytes']:4d} B: {r.median_ms:.3f} ms, useful {m['useful_gbps']:7,.0f} GB/s, sectors "
          f"{m['sector_gbps']:7,.0f} GB/s ({m['sector_fraction_of_read_ceiling']:.0%} of the read ceiling), "
          f"DRAM model {m['dram_model_gbps']:7,.0f} GB/s")"""),
    new_markdown_cell("""Reading the plot: at 4 and 8 B strides a warp's one load is too little work in flight to fill the
memory system (latency-bound, not bandwidth-bound). From 16 B the sector rate reaches the read ceiling.
At 64 B and beyond, sector bandwidth halves while the DRAM model (64 B per touched sector pair) stays near the
ceiling: DRAM is busy moving the neighbouring sector of every line."""),
    new_code_cell("stream.close()"),
])

CS = nb([
    new_markdown_cell("""# Cache streaming (`ld.global.cs`): when it helps and when it hurts

`.cs` loads mark lines *evict-first*. The promise: data read once should not push out data that is reused.
The two scenarios from the source document, normal loads vs `.cs`, with outputs compared bit for bit and
against a float64 reference:

* **sparse-vector**: each thread reads one value and one index (`.cs`), and a hot 1024-float vector.
* **stream-analysis**: each thread reads 8 *consecutive* floats and ints (`.cs`), and a 32-float weight table."""),
    new_code_cell(SETUP),
    new_code_cell("""report = bench.bench_cache_streaming(progress=False)
plot.cache_streaming(report)
plt.show()
for name in ("sparse_vector", "stream_analysis"):
    n, c = report.find(f"{name}/normal").median_ms, report.find(f"{name}/cs").median_ms
    print(f"{name}: normal {n:.4f} ms, .cs {c:.4f} ms -> {n / c:.2f}x")"""),
    new_markdown_cell("""Why stream-analysis can suffer: thread *t* reads elements 8t .. 8t+7, one per loop iteration.
Neighbouring threads' first loads already pull in the whole 32-byte sectors that their next iterations
need; with normal loads those sectors wait in L1 and the next 7 loads hit. `.cs` marks them evict-first,
so they are gone before they are read again and each iteration goes back to L2. Streaming hints pay
only for data that is truly touched once; "read once per thread" is not "read once per line"."""),
    new_code_cell("stream.close()"),
])


TORCH_SETUP = """%matplotlib inline
import importlib.util
import warnings
import matplotlib.pyplot as plt
import l2ctl
from l2ctl import _backend, plot, sweep
MiB = 1 << 20
info = l2ctl.device_info()
print(f"{info.name}: L2 {info.l2_cache_size / MiB:.2f} MiB, persisting max {info.persisting_l2_cache_max_size / MiB:.2f} MiB, "
      f"'auto' stops at {l2ctl.auto_set_aside_cap() / MiB:.2f} MiB")
# torch's tensors live on a real GPU, which a simulated one (L2CTL_SIMULATE) cannot see: then the torch cells skip.
gpu = not _backend.simulated() and importlib.util.find_spec("torch") is not None
if gpu:
    import torch
    import torch.nn.functional as F
    gpu = torch.cuda.is_available()
SKIPPED = "skipped: PyTorch needs a CUDA GPU" + (" (this one is simulated)" if _backend.simulated() else "")
if gpu:
    print(f"torch {torch.__version__}")
    stream = torch.cuda.Stream()
else:
    print(SKIPPED.replace("skipped", "the cells below are skipped"))"""


def torch_cell(code: str) -> nbformat.NotebookNode:
    """A cell of PyTorch code, run only where the setup cell found torch and a real CUDA GPU."""
    return new_code_cell("if gpu:\n" + textwrap.indent(code, "    ") + "\nelse:\n    print(SKIPPED)")


OWN = nb([
    new_markdown_cell("""# Your own PyTorch workload: what to persist, and what it costs

You have a training or inference step and some tensors you suspect are hot. This notebook wraps a step
as an l2ctl workload, lets `l2ctl.tune` decide **which** tensor to keep in L2 (or none) and how, shows the
measured surface for the chosen tensor and the tax a set-aside puts on everything else, and applies the
policy. Sizes follow this GPU's L2, so the same notebook means the same thing on an H100 or an H200.

**This notebook needs a CUDA GPU and PyTorch.** The simulator (`L2CTL_SIMULATE`) cannot run PyTorch's
kernels: there every cell after the setup prints "skipped" and measures nothing. The outputs saved with
the notebook are those of an H100 run; notebooks 01 to 04 run on the simulator."""),
    new_code_cell(TORCH_SETUP),
    new_markdown_cell("""## The step

Three ordinary operations on four tensors: an embedding lookup into `table`, a bias broadcast over a
streaming activation `x`, and a scatter-add of gradients into `acc`. A workload is any object with
`enqueue(stream)`; `verify(stream)` (optional) lets every measurement check the output."""),
    torch_cell("""def fraction(f):  # bytes: a fraction of this GPU's L2, whole MiB
    return int(f * info.l2_cache_size) // MiB * MiB

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)
bias = torch.randn(fraction(0.16) // 4, device=dev, generator=g)
x = torch.randn((512 * MiB) // bias.nbytes, bias.numel(), device=dev, generator=g)
h = torch.empty_like(x)
table = torch.randn(fraction(0.64) // 256, 64, device=dev, generator=g)
lookup = torch.randint(0, table.shape[0], (512 * 1024,), device=dev, generator=g)
acc = torch.zeros(fraction(0.64) // 4, device=dev)
index = torch.randint(0, acc.numel(), (64 * MiB,), device=dev, generator=g)
values = torch.randint(1, 5, (index.numel(),), device=dev, generator=g).float()
expected = torch.zeros_like(acc, dtype=torch.float64).index_add_(0, index, values.double())


class MyStep:
    def enqueue(self, s):
        with torch.cuda.stream(s):
            self.e = F.embedding(lookup, table)
            torch.add(x, bias, out=h)
            acc.zero_()
            acc.index_add_(0, index, values)

    def verify(self, s):
        with torch.cuda.stream(s):
            return bool(torch.equal(acc.double(), expected)) and bool(torch.equal(h[-1], x[-1] + bias))


step = MyStep()
candidates = {"x": x, "bias": bias, "table": table, "acc": acc}
for name, t in candidates.items():
    print(f"{name:6s} {t.nbytes / MiB:8.1f} MiB")"""),
    new_markdown_cell("""## Which tensor?

`tune` screens every candidate at several set-asides (each with the hit ratio that fits), refines the two
best, and keeps the smallest set-aside within noise of the best, confirmed in fresh rounds."""),
    torch_cell("""tuned = l2ctl.tune(step, stream, candidates)
print(tuned)
print()
for name, c in tuned.candidates.items():
    b = c.best
    print(f"{name:6s} best {b.speedup:.3f}x (95% CI {b.ci[0]:.3f}-{b.ci[1]:.3f}) at set-aside "
          f"{b.point.set_aside / MiB:.2f} MiB, hit ratio {b.point.hit_ratio:.2f}")"""),
    new_markdown_cell("""## The surface for the chosen tensor

Every set-aside the driver can grant, times four hit ratios (points above the fitting ratio oversubscribe
the set-aside: the tuner never picks those). Blue is faster than no persistence, red slower."""),
    torch_cell("""name = tuned.buffer_name or tuned.grid_best.point.candidate
surface = sweep.sweep_surface(step, stream, candidates[name], hit_ratios=[0.25, 0.5, 0.75, 1.0], progress=False)
ax = plot.surface(surface)
ax.set_title(f"{info.name}: persisting {name}")
plt.show()"""),
    new_markdown_cell("""## The tax

While a set-aside is in place, every other kernel on the GPU streams through a smaller L2. Below the
driver's default limit (where `set_aside="auto"` stops) the tax is within noise; above it, it grows."""),
    torch_cell("""tax = sweep.sweep_tax(stream, progress=False)
ax = plot.tax(tax)
ax.axvline(l2ctl.auto_set_aside_cap() / MiB, color="k", ls=":", label="'auto' cap (driver default)")
if tuned.persists:
    ax.axvline(tuned.policy.set_aside / MiB, color="tab:green", ls="--", label="tuned choice")
ax.legend(loc="lower left")
plt.show()
print(f"the tuned set-aside costs a plain copy {tuned.tax.copy_slowdown:.2f}x; the grid's best point "
      f"({tuned.grid_best.point.set_aside / MiB:.2f} MiB) would cost {tuned.grid_best_tax.copy_slowdown:.2f}x")"""),
    new_markdown_cell("""## Apply it

`tuned.persist(stream)` is `l2ctl.persist(stream, <chosen tensor>, policy=tuned)`: it raises no warning,
and a "no persistence" answer makes it change nothing. Persisting a big tensor with the defaults instead
stops at the driver's default limit and says so (`SetAsideTaxWarning`)."""),
    torch_cell("""def run(n=20):
    with l2ctl.Timer(stream) as t:
        for _ in range(n):
            step.enqueue(stream)
    return t.elapsed_ms / n

run(3)
plain = run()
with tuned.persist(stream):
    tuned_ms = run()
print(f"plain {plain:.3f} ms per step, with the tuned policy {tuned_ms:.3f} ms ({plain / tuned_ms:.2f}x); "
      f"verified: {step.verify(stream)}")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with l2ctl.persist(stream, table) as p:
        print(f"persist(stream, table) with the defaults: set-aside {p.set_aside / MiB:.2f} MiB, hit ratio "
              f"{p.window.hit_ratio:.2f}")
print("warned:", ", ".join(w.category.__name__ for w in caught) or "nothing")
print("limit back to", l2ctl.get_set_aside(), "bytes")"""),
    new_markdown_cell("""## The same step as a CUDA graph

A stream's window reaches the kernels launched on that stream, **not a graph's replays**: each kernel node
of a graph carries its own window, and CUDA copies node windows into an executable graph only when it
instantiates it (`cudaGraphExecUpdate` reports success and carries none). So a `persist(stream, ...)`
scope around `g.replay()` would raise the set-aside while the replays run without the window: slower than
doing nothing.

Persist the graph itself. On a `torch.cuda.CUDAGraph(keep_graph=True)` (torch >= 2.9) l2ctl puts the
window on the template's kernel nodes and has torch re-instantiate its executable, so torch's own
`replay()` runs with it, also when the graph was replayed before the scope (as after any warm-up). A
graph captured with the default `keep_graph=False` has no template left: l2ctl refuses it and says what
to do instead. `tune` takes the graph as its target; the workload replays it on the stream given."""),
    torch_cell("""graph_stream = torch.cuda.Stream()
graph_stream.wait_stream(torch.cuda.current_stream())
g = torch.cuda.CUDAGraph(keep_graph=True)
with torch.cuda.stream(graph_stream):
    step.enqueue(graph_stream)                       # warm-up outside the capture
    with torch.cuda.graph(g, stream=graph_stream):
        step.enqueue(graph_stream)
    g.replay()                                       # torch has made its executable
torch.cuda.current_stream().wait_stream(graph_stream)
for k in l2ctl.graph.inspect(g):                     # torch's kernels, named through the driver
    print(f"{k.function[:60]:60s} grid {k.grid} block {k.block}")


class Replay:
    def enqueue(self, s):
        with torch.cuda.stream(s):
            g.replay()

    def verify(self, s):
        return step.verify(s)


graphed_tuned = l2ctl.tune(Replay(), g, candidates, stream=stream)
print(graphed_tuned)"""),
    new_markdown_cell("""## Compiled with `torch.compile(mode="reduce-overhead")`

torch.compile's CUDA graph trees record graphs on a stream of their own and, with torch's defaults, keep
only the executables. The target is `l2ctl.graph.torch_captures()`: while a block or scope on it lives,
every graph torch records keeps its template, so a scope's window goes on its kernel nodes (torch
re-instantiates it), and on the streams torch captures and runs eager kernels on. Call the compiled
function **for the first time inside it**; l2ctl refuses a scope when the graph trees hold graphs
recorded outside every block (their replays would not carry the window, and without it a larger
set-aside only slows them).

Two things decide whether compiled code can gain. Inductor may write into buffers of its own:
compiled together, `acc.zero_(); acc.index_add_(...)` scatters into a temporary that is then copied into
`acc`, so a window on `acc` misses the scatter; here the zeroing stays eager (`prepare`). And inputs that
are not at static addresses are copied into torch's pool before every replay, copies that pay the
set-aside's tax: mark them (`torch._dynamo.mark_static_address`). `l2ctl.workloads.Compiled` compiles the
step once per window it runs under, so `tune` measures every point on graphs recorded with its own
window."""),
    torch_cell("""class CompiledPart:
    device = info.index

    def prepare(self):
        acc.zero_()

    def step(self):
        step.e = F.embedding(lookup, table)
        torch.add(x, bias, out=h)
        acc.index_add_(0, index, values)

    def verify(self, s):
        return step.verify(s)


for t in (lookup, table, x, bias, h, acc, index, values):
    torch._dynamo.mark_static_address(t)
compiled = l2ctl.workloads.Compiled(CompiledPart())
compiled_tuned = l2ctl.tune(compiled, compiled.target(), {n: candidates[n] for n in ("bias", "acc")},  # the two that paid eagerly
                            stream=stream)
print(compiled_tuned)
print(f"{compiled.compilations} compilations, one per window measured")"""),
    torch_cell("""def run_compiled(n=20):
    with l2ctl.Timer(stream) as t:
        for _ in range(n):
            compiled.enqueue(stream)
    return t.elapsed_ms / n

plain = run_compiled()                                # the graphs recorded with no window
with compiled_tuned.persist(compiled.target()):
    run_compiled(1)                                   # recorded under this window already by tune
    tuned_ms = run_compiled()
print(f"compiled: plain {plain:.3f} ms, tuned {tuned_ms:.3f} ms ({plain / tuned_ms:.2f}x); "
      f"verified: {step.verify(stream)}")
torch.compiler.reset()"""),
    new_markdown_cell("""## When the buffer that matters is not yours: `"discover"`

Compile the zeroing with the scatter and Inductor scatters into a temporary of its own, then copies it
into `acc`: a window on `acc` reaches nothing. No name reaches that temporary, but the graph's kernels are
given its address. `tune(step, captures, "discover")` reads every kernel node's arguments of the graphs
torch recorded inside the `torch_captures()` block (through the driver), says what each range is (yours,
a temporary of a captured graph, torch's cache), in which graph and which kernels use it, and tries
them. The step stays as written: compiled with `mode="reduce-overhead"`, first called inside the block
(tune calls it first: warm-up and recording)."""),
    torch_cell("""def zero_and_scatter():
    acc.zero_()
    acc.index_add_(0, index, values)


inductor = torch.compile(zero_and_scatter, mode="reduce-overhead")   # acc is marked static above


def run_inductor(s):
    with torch.cuda.stream(s):
        torch.compiler.cudagraph_mark_step_begin()
        inductor()


with l2ctl.graph.torch_captures() as captures:
    named = l2ctl.tune(run_inductor, captures, {"acc": acc}, stream=stream)
    discovered = l2ctl.tune(run_inductor, captures, "discover", stream=stream)
    print("acc named:", named)
    print(discovered.report())
    with discovered.persist(captures):
        for _ in range(10):
            run_inductor(stream)
torch.compiler.reset()"""),
])


BOOKS = (("01_hit_ratio.ipynb", HIT_RATIO), ("02_tax_and_tuner.ipynb", TAX), ("03_coalescing.ipynb", STRIDE),
         ("04_cache_streaming.ipynb", CS), ("05_your_pytorch_workload.ipynb", OWN))


def main(names: list[str]) -> None:
    os.makedirs(HERE, exist_ok=True)
    for name, book in BOOKS:
        if names and name[:2] not in names:
            continue
        nbformat.validate(book)
        nbformat.write(book, os.path.join(HERE, name))
        print("wrote", name)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])  # e.g. "02 05": only those (the others keep their committed outputs)
