// The GIL given up around calls that block or take time, and taken back so that interpreter exit cannot crash.
//
// Before 3.14, CPython ends a thread that asks for the GIL once finalization has begun (a daemon thread at exit) with
// pthread_exit, whose forced unwind runs through the C++ frames above: out of a noexcept frame (pybind11's
// gil_scoped_release is a destructor) it is std::terminate; a catch-all that handles it touches Python without the
// GIL, and one that swallows it aborts. So l2ctl catches that unwind where it can begin, as the GIL is taken back
// and where C++ has called Python (`L2CTL_THREAD_ENDED`, ahead of every catch-all of the binding layer), and the
// thread sleeps there until the process ends, holding no lock of l2ctl's (CPython 3.14 parks such threads too).
#pragma once

#include <Python.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#define L2CTL_THREAD_ENDED \
  catch (abi::__forced_unwind&) { ::l2ctl_bindings::park_ended_thread(); }
#else  // no forced unwind to meet: pthread_exit does not unwind C++ frames there
#define L2CTL_THREAD_ENDED
#endif

namespace l2ctl_bindings {

// A thread the interpreter has ended: it never returns into Python, and sleeps until the process exits.
[[noreturn]] inline void park_ended_thread() noexcept {
  for (;;) ::pause();
}

class Gil_released {
 public:
  Gil_released() noexcept : state_(PyEval_SaveThread()) {}
  ~Gil_released() {
#if defined(__GLIBCXX__)
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      if (held_ != nullptr) held_->unlock();
      park_ended_thread();
    }
#else
    PyEval_RestoreThread(state_);
#endif
  }
  Gil_released(const Gil_released&) = delete;
  Gil_released& operator=(const Gil_released&) = delete;

  // A lock taken while the GIL was given up (the registry's), let go of should the thread be ended taking it back.
  void unlock_if_ended(std::timed_mutex* held) noexcept { held_ = held; }

 private:
  PyThreadState* state_;
  std::timed_mutex* held_ = nullptr;
};

// Library work that must not be running when the process exits: NVRTC's exit-time destructors run while a daemon
// thread still compiles, and the compile then crashes. Interpreter exit (`close`, from l2ctl's exit hook) waits for
// the work in progress, then lets none begin: a daemon thread sleeps at the gate, the exiting thread is refused.
class Exit_gate {
 public:
  // Held, with the GIL released, for the length of one piece of such work.
  class Pass {
   public:
    explicit Pass(Exit_gate& gate) : gate_(gate) { gate_.enter(); }
    ~Pass() { gate_.leave(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    Exit_gate& gate_;
  };

  // Called with the GIL released. Waits a minute at most: a hung compile must not hang the exit.
  void close() {
    std::unique_lock<std::mutex> hold(mutex_);
    closed_ = true;
    closer_ = std::this_thread::get_id();
    drained_.wait_for(hold, std::chrono::minutes(1), [&] { return in_flight_ == 0; });
  }

 private:
  void enter() {
    std::unique_lock<std::mutex> hold(mutex_);
    if (closed_) {
      if (closer_ == std::this_thread::get_id())
        throw std::runtime_error("l2ctl compiles no kernels after its restore at interpreter exit");
      hold.unlock();
      park_ended_thread();  // a daemon thread of a process that is exiting
    }
    ++in_flight_;
  }
  void leave() {
    std::lock_guard<std::mutex> hold(mutex_);
    if (--in_flight_ == 0) drained_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable drained_;
  int in_flight_ = 0;
  bool closed_ = false;
  std::thread::id closer_;
};

// The one gate (registry_lock.cpp; made anew in a forked child).
extern Exit_gate* exit_gate;

}  // namespace l2ctl_bindings
