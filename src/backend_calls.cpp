// The planner's way to a device (planner::Calls), for each kind of backend: the CUDA runtime called directly
// (Cuda_calls), or a Python backend, the simulator, which implements the same calls by the same names (Python_calls
// forwards each), so the simulator tests the very planner the GPU runs.
//
// The GIL rule, written once (here): a registry call holds the GIL except around CUDA calls that take time (a
// limit, a reset, a batch of several holders); a stream attribute alone returns in well under a microsecond, so a
// batch of one window keeps it (giving it up and taking it back costs more). No Python code runs on the CUDA
// backend between a device change and its bookkeeping; the simulator's Python may raise anywhere: an exception that
// is not a failed call is a call cut short, and the batch's journal says what it did.
#include "planner_bindings.hpp"

#include "l2ctl/device.hpp"
#include "l2ctl/error.hpp"
#include "l2ctl/state.hpp"
#include "l2ctl/window.hpp"

namespace l2ctl_bindings {

namespace {

// The CUDA runtime, called directly.
class Cuda_calls final : public pl::Calls {
 public:
  long long get_persisting_limit(int device) override {
    return cuda(true, [&] { return static_cast<long long>(l2ctl::get_persisting_limit(device)); });
  }
  long long set_persisting_limit(int device, long long nbytes) override {
    return cuda(true, [&] {
      return static_cast<long long>(l2ctl::set_persisting_limit(device, static_cast<std::size_t>(nbytes)));
    });
  }
  l2ctl::Window get_window(const pl::Slot& slot) override {
    return cuda(false, [&] { return l2ctl::get_window(static_cast<l2ctl::WindowHolder>(slot.kind), slot.handle); });
  }
  void reset_persisting_lines(int device) override {
    cuda(true, [&] {
      l2ctl::reset_persisting_lines(device);
      return 0;
    });
  }
  pl::Batch_result apply_batch(const pl::Batch& batch, std::optional<pl::Batch_result>* journal) override {
    const bool slow = batch.limit >= 0 || batch.reset_lines || batch.changes.size() > 1;
    pl::Batch_result result = cuda(slow, [&] { return l2ctl::apply_batch(batch); });
    if (journal == nullptr) return result;
    *journal = std::move(result);  // a move: no allocation
    return {};
  }

 private:
  // f(), with the GIL released when it may take time (`slow`); a CUDA error as the planner's failed call.
  template <typename F>
  static auto cuda(bool slow, F&& f) -> decltype(f()) {
    try {
      if (!slow) return f();
      Gil_released released;
      return f();
    } catch (const l2ctl::CudaError& e) {
      throw pl::Call_failed(e.what(), e.call(), e.name(), true, std::current_exception());
    }
  }
};

// A Python backend (the simulator) through its methods, looked up at every call (a test may replace one on the
// instance). A Python exception becomes a failed call when it is an Exception (CudaError: `cuda`), and stays what it
// is otherwise (KeyboardInterrupt: a call cut short).
class Python_calls final : public pl::Calls {
 public:
  explicit Python_calls(py::handle backend) : backend_(backend) {}  // borrowed: the registry lives with it

  long long get_persisting_limit(int device) override {
    return call([&] { return method(L2CTL_NAME("get_persisting_limit"))(device).cast<long long>(); });
  }
  long long set_persisting_limit(int device, long long nbytes) override {
    return call([&] { return method(L2CTL_NAME("set_persisting_limit"))(device, nbytes).cast<long long>(); });
  }
  l2ctl::Window get_window(const pl::Slot& slot) override {
    return call([&] {
      const py::handle name = slot.kind == pl::stream_slot ? L2CTL_NAME("get_stream_window") : L2CTL_NAME("get_node_window");
      return to_window(method(name)(slot.handle));
    });
  }
  void reset_persisting_lines(int device) override {
    call([&] {
      method(L2CTL_NAME("reset_persisting_lines"))(device);
      return 0;
    });
  }
  // apply_batch(device, limit, at_least, reset_lines, read_previous, changes, journal): `changes` as (kind, handle,
  // window); the result, (limit before, limit after, [previous windows]), is appended to `journal` (a list, or None)
  // as the device changes.
  pl::Batch_result apply_batch(const pl::Batch& batch, std::optional<pl::Batch_result>* journal) override {
    py::list entries;
    try {
      call([&] {
        py::list changes(batch.changes.size());
        for (std::size_t i = 0; i < batch.changes.size(); ++i) {
          const auto& [slot, window] = batch.changes[i];
          changes[i] = py::make_tuple(slot.kind, slot.handle, window_object(window));
        }
        method(L2CTL_NAME("apply_batch"))(batch.device, batch.limit, batch.at_least, batch.reset_lines,
                                          batch.read_previous, changes,
                                          journal != nullptr ? py::object(entries) : py::object(py::none()));
        return 0;
      });
    } L2CTL_THREAD_ENDED catch (...) {
      record(entries, journal);  // the call may have run before it was cut short: its journal says so
      throw;
    }
    record(entries, journal);
    return journal != nullptr && *journal ? **journal : pl::Batch_result{};
  }

 private:
  py::object method(py::handle name) const { return backend_.attr(name); }

  // The journal's entry read into the planner's. The device has changed already: by index, since an iterator is a
  // Python allocation, whose failure (a MemoryError) lost what the batch read (the base limit, the base windows),
  // so that nothing ever put them back.
  static void record(const py::list& entries, std::optional<pl::Batch_result>* journal) {
    if (journal == nullptr || entries.empty()) return;
    py::tuple result = py::reinterpret_borrow<py::tuple>(entries[0]);
    pl::Batch_result out;
    out.previous_limit = result[0].cast<long long>();
    out.granted_limit = result[1].cast<long long>();
    const py::sequence previous = py::reinterpret_borrow<py::sequence>(result[2]);
    const std::size_t n = previous.size();
    out.previous.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.previous.push_back(to_window(previous[i]));
    *journal = std::move(out);
  }

  template <typename F>
  auto call(F&& f) -> decltype(f()) {
    try {
      try {
        return f();
      } catch (const py::cast_error&) {  // an argument pybind11 could not make: the Python error behind it, if any
        if (PyErr_Occurred() == nullptr) throw;
        throw py::error_already_set();
      }
    } catch (py::error_already_set& e) {
      if (e.matches(registered_host().cuda_error)) {
        py::object value = e.value();
        throw pl::Call_failed(py::str(value), py::str(value.attr("call")), py::str(value.attr("name")), true,
                              std::current_exception());
      }
      if (e.matches(PyExc_Exception)) throw pl::Call_failed(e.what(), "", "", false, std::current_exception());
      throw;  // an interrupt: the call was cut short
    }
    L2CTL_THREAD_ENDED  // the simulator's Python ran as the interpreter exited: the thread stops here
  }

  py::handle backend_;
};

}  // namespace

std::unique_ptr<pl::Calls> calls_for(py::handle backend, bool cuda) {
  if (cuda) return std::make_unique<Cuda_calls>();
  return std::make_unique<Python_calls>(backend);
}

}  // namespace l2ctl_bindings
