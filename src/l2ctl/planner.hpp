// The planner: the one copy of the rules of a device's L2 state (docs/DESIGN.md, "The registry").
//
// Scopes record what they ask for (a window on some slots, a limit request); what every slot and the limit
// should hold is planned from the live scopes after every change, and one batch writes what differs. Plain
// C++: no Python, no CUDA. The device is reached through `Calls` (the CUDA runtime directly, or the simulator
// through a trampoline in the bindings), so the simulator tests this very code.
//
// Interrupts: no code of the caller runs between a device change and its bookkeeping here; a backend call
// cut short (an exception that is not a failed call) leaves the marks that the next call settles: `dirty`
// (the device may be off the plan), a scope's `ending`, the batch's journal (what the call read).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <algorithm>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "l2ctl/window_value.hpp"

namespace l2ctl::planner {

enum SlotKind : int { stream_slot = 0, node_slot = 1 };  // WindowHolder's values

// A holder of a window: (kind, handle, generation). The generation changes when l2ctl learns a handle died,
// so a later object that gets the same handle is another slot.
struct Slot {
  int kind = stream_slot;
  std::uintptr_t handle = 0;
  std::uint64_t generation = 0;
  bool operator<(const Slot& o) const {
    return kind != o.kind ? kind < o.kind : handle != o.handle ? handle < o.handle : generation < o.generation;
  }
  bool operator==(const Slot& o) const { return kind == o.kind && handle == o.handle && generation == o.generation; }
};

enum class Request { none, exact, automatic };

// Windows to write, sorted by slot (streams first): built in order and read in order, so a vector.
using Changes = std::vector<std::pair<Slot, Window>>;

// What each slot held before l2ctl and what l2ctl last wrote there: a sorted vector, since a batch records its
// slots in order (one merge) and a scope's end forgets them all at once, where a tree allocated and freed a node
// per slot of every graph scope.
class Slot_windows {
 public:
  using value_type = std::pair<Slot, Window>;
  using iterator = std::vector<value_type>::iterator;

  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  std::size_t size() const { return items_.size(); }
  void clear() { items_.clear(); }
  iterator find(const Slot& slot) {
    const auto it = lower(slot);
    return it != items_.end() && it->first == slot ? it : items_.end();
  }
  std::size_t count(const Slot& slot) { return find(slot) != end() ? 1 : 0; }
  Window& operator[](const Slot& slot) {
    auto it = lower(slot);
    if (it == items_.end() || !(it->first == slot)) it = items_.insert(it, value_type{slot, Window{}});
    return it->second;
  }
  void erase(const Slot& slot) {
    const auto it = find(slot);
    if (it != items_.end()) items_.erase(it);
  }
  // Drops the entries `gone(slot)` says, in one pass.
  template <typename Gone>
  void erase_if(Gone gone) {
    items_.erase(std::remove_if(items_.begin(), items_.end(), [&](const value_type& e) { return gone(e.first); }),
                 items_.end());
  }
  // `entries` (distinct slots) written in one merge: assigned where a slot is present when `overwrite`, else kept.
  void merge(const Changes& entries, bool overwrite);

 private:
  iterator lower(const Slot& slot) {
    return std::lower_bound(items_.begin(), items_.end(), slot,
                            [](const value_type& e, const Slot& s) { return e.first < s; });
  }
  std::vector<value_type> items_;
  std::vector<value_type> spare_;  // what merge builds into, then swaps with items_: no allocation once grown
};

struct Scope {
  std::uint64_t id = 0;
  int device = 0;
  std::vector<Slot> slots;
  bool has_window = false;
  Window window;     // as asked; the hit ratio resolved at entry when fit_hit_ratio
  Window effective;  // in force (the hit ratio after sharing)
  Request request = Request::none;
  long long request_bytes = 0;
  bool share = false;
  bool reset_on_exit = false;
  bool fit_hit_ratio = false;  // the hit ratio is what the set-aside holds next to the other windows
  bool standing = false;       // a plain set_aside(n): lives until restored
  bool orphaned = false;       // a standing request nobody can restore any more
  // `ending`: its end began (set first, so an end cut short is finished by the next call); set from finalizers
  // and other threads without the lock: an atomic.
  std::atomic<bool> ending{false};
  // The object that could end it (a persist scope), when it has one: `holder_alive(holder)` says whether it still
  // lives; a scope whose holder was freed while live (its __exit__ never ran) ends at the next call. A plain
  // function and a pointer, so the planner asks without knowing what the holder is (a Python weak reference).
  bool (*holder_alive)(const void* holder) = nullptr;
  const void* holder = nullptr;
  // What the caller ties to the scope while it is registered (the bindings: its Python object). Released
  // after the registry's lock, never under it (a finalizer it runs could call the registry).
  std::shared_ptr<void> anchor;
};
using Scope_ptr = std::shared_ptr<Scope>;

// Thrown by a backend for a call that failed and changed nothing it did not put back (cudaError_t). `cause`:
// the original exception, rethrown by the bindings. `cuda`: false for any other error of the backend's
// (the simulator's own), which the planner treats as a call cut short.
struct Call_failed : std::runtime_error {
  Call_failed(std::string what, std::string call, std::string name, bool cuda, std::exception_ptr cause)
      : std::runtime_error(std::move(what)), call(std::move(call)), name(std::move(name)), cuda(cuda),
        cause(std::move(cause)) {}
  std::string call, name;
  bool cuda;
  std::exception_ptr cause;
  std::string note;  // what the planner adds (a holder found dead)
};

// A limit the process may not set (MPS client, not permitted): raised in place of the Call_failed `cause`.
struct Limit_refused : std::runtime_error {
  Limit_refused(std::string what, std::exception_ptr cause) : std::runtime_error(std::move(what)), cause(std::move(cause)) {}
  std::exception_ptr cause;
};

extern const char* const mps_hint;

struct Batch_result {
  long long previous_limit = -1;
  long long granted_limit = -1;
  std::vector<Window> previous;  // what each holder held before, in the batch's order, when asked for
};

// One batch of changes: the limit (-1: none; `at_least`: raised only), windows in order (streams first), a reset of
// lines.
struct Batch {
  int device = 0;
  long long limit = -1;
  bool at_least = false;
  bool reset_lines = false;
  bool read_previous = false;
  std::vector<std::pair<Slot, Window>> changes;
};

// The device, as the planner reaches it: the CUDA runtime (Cuda_calls, C++) or a Python backend, the simulator,
// which implements these calls by the same names (Python_calls forwards them; get_window is its get_stream_window
// or get_node_window). Errors: Call_failed (a failed call), anything else: cut short.
class Calls {
 public:
  virtual ~Calls() = default;
  virtual long long get_persisting_limit(int device) = 0;
  virtual long long set_persisting_limit(int device, long long nbytes) = 0;  // the grant, read back
  virtual Window get_window(const Slot& slot) = 0;
  virtual void reset_persisting_lines(int device) = 0;
  // Applies `batch`; writes its result to `*journal` (when given) before returning, so that an interrupt as the
  // call returns cannot lose what it read. On a failed call it puts back what it had read, and throws.
  virtual Batch_result apply_batch(const Batch& batch, std::optional<Batch_result>* journal) = 0;
};

struct Device_state {
  int device = 0;
  long long maximum = 0;
  std::map<std::uint64_t, Scope_ptr> scopes;  // by id: entry order
  std::optional<long long> base_limit, applied_request, applied_limit, observed_limit;
  Slot_windows base_windows, applied_windows;
  double in_force_demand = 0.0;
  bool auto_capped = false;
  std::optional<std::pair<long long, long long>> auto_bounds;  // (granularity, tax-free cap)
  bool dirty = false;
  int shared = 0;
  // The batch under way, until what it did is recorded: its order, changes, request and journal.
  struct Pending {
    std::vector<Slot> order;
    Changes changes;
    long long request = -1;
    bool at_least = false;
    std::optional<Batch_result> journal;
  };
  std::optional<Pending> batch;
};

// Each covered slot's top scope (the latest entered on it), sorted by slot: a vector, filled and sorted once a plan.
using Top = std::vector<std::pair<Slot, Scope*>>;

struct Plan {
  std::optional<long long> limit;
  bool at_least = false;
  Top top;
  std::vector<Scope*> in_force;  // in entry order
  bool capped = false;
  bool covers(const Slot& slot) const {
    const auto it = std::lower_bound(top.begin(), top.end(), slot,
                                     [](const std::pair<Slot, Scope*>& e, const Slot& s) { return e.first < s; });
    return it != top.end() && it->first == slot;
  }
};

struct Entered {
  long long limit = 0;
  double demand = 0.0;  // of the windows in force, as entered (a fitted window as fitted)
  double asked = 0.0;   // the same with the entered scope's window as asked, before fit_window cut it
  bool capped = false;
};

struct Snapshot {
  long long limit = 0;
  double demand = 0.0;  // of the windows in force
  std::vector<std::pair<Scope_ptr, Window>> in_force;
};

// The rules of one backend's devices. Not locked: the caller holds the registry's lock (`Lock`).
class Registry {
 public:
  explicit Registry(std::unique_ptr<Calls> calls) : calls_(std::move(calls)) {}

  Slot slot(int kind, std::uintptr_t handle) const;
  Device_state* lookup(int device);
  Device_state& state(int device, long long maximum);

  // Registers `scope` and makes the device match (atomic: on an exception nothing stays registered).
  Entered enter(const Scope_ptr& scope, long long maximum);
  // Ends `scope` (marked ending first) and makes the device match what is left.
  void exit(Scope& scope);
  // More slots for a live scope (its window planned there too); how many were new, or -1 if it is not live.
  int add_slots(Scope& scope, const std::vector<Slot>& slots);
  void set_base_window(const std::vector<Slot>& slots, int device, long long maximum, const Window& window);
  void forget_slots(int kind, const std::vector<std::uintptr_t>& handles);
  std::optional<long long> known_limit(int device);
  long long observed_limit(int device, long long maximum);
  Snapshot snapshot(int device, long long maximum);
  std::vector<Scope_ptr> live_scopes(int device);
  void reset_lines(int device);
  std::pair<long long, std::string> granularity(int device, long long maximum);
  std::optional<long long> known_granularity(int device) const;
  // How many times a handle's generation moved (a holder forgotten): slots made before are stale once it changes.
  std::uint64_t slot_epoch() const { return slot_epoch_; }
  void restore_all();  // every live scope ended; errors swallowed (the process is ending)
  void settle_all();   // what calls cut short left, and scopes marked ending meanwhile, settled on every device
  const std::map<int, Device_state>& states() const { return states_; }

  // Anchors of scopes that left the registry: the caller releases them after the lock.
  std::vector<std::shared_ptr<void>> take_released() { return std::exchange(released_, {}); }
  // The same, swapped into `into` (empty): the registry keeps its storage, so the next end allocates nothing.
  void take_released(std::vector<std::shared_ptr<void>>& into) { into.swap(released_); }

  // What the device should hold. The plan is the registry's own, reused: valid until the next call of plan().
  const Plan& plan(Device_state& state);

 private:
  bool alive(const Slot& slot) const;
  std::pair<long long, long long> auto_bounds(Device_state& state);
  void sync(Device_state& state, bool reset = false, bool removed = false);
  void apply(Device_state& state, const Changes& changes, std::optional<long long> limit, bool at_least,
             bool reset);
  void record_batch(Device_state& state);
  // What the device holds after a failed batch; returns the slots found dead (their holder destroyed).
  std::vector<Slot> resync(Device_state& state, const std::vector<Slot>& slots);
  void forget_idle(Device_state& state);
  // Forgets the slots `gone(slot)` says (their base and what l2ctl applied); whether any were.
  template <typename Gone>
  bool forget_where(Device_state& state, Gone gone) {
    std::vector<Slot> forgotten;
    state.base_windows.erase_if([&](const Slot& slot) {
      if (!gone(slot)) return false;
      forgotten.push_back(slot);  // in order: the map is sorted
      return true;
    });
    if (forgotten.empty()) return false;
    state.applied_windows.erase_if(
        [&](const Slot& slot) { return std::binary_search(forgotten.begin(), forgotten.end(), slot); });
    return true;
  }
  void settle(Device_state& state, bool quiet = false);
  void register_scope(Device_state& state, const Scope_ptr& scope);
  void unregister(Device_state& state, Scope& scope);
  void learn_base_limit(Device_state& state);
  long long seen_limit(Device_state& state);
  [[noreturn]] void rethrow_translated(const Call_failed& failure, int device);

  std::pmr::unsynchronized_pool_resource pool_;  // forget_idle's set of covered slots draws from it (under the lock)
  std::unique_ptr<Calls> calls_;
  std::map<int, Device_state> states_;
  std::map<std::pair<int, std::uintptr_t>, std::uint64_t> generations_;
  std::uint64_t slot_epoch_ = 0;
  std::map<int, std::pair<long long, std::string>> granularity_;
  // Devices whose limit this process cannot set (an MPS client: the set-aside is chosen when the MPS server starts,
  // CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT), learnt from the probe "auto" made: there "auto" takes
  // the limit as it is, as None does. An exact request or "max" is still refused, saying so.
  std::set<int> fixed_limits_;
  std::vector<std::shared_ptr<void>> released_;
  // Storage reused from one call to the next (each call runs under the lock; none nests in another of its kind):
  // a scope's entry and end then allocate nothing here once these have grown.
  Plan plan_;
  Top top_so_far_;
  Changes sync_changes_, bases_;
  Batch batch_;
  std::vector<Slot> batch_slots_;
  Device_state::Pending spare_batch_;
  std::vector<Scope_ptr> ending_;
};

// The limit a fresh process gets from the driver, as a fraction of the max: "auto" stops there (up to it the
// measured set-aside tax on other kernels is nil: README, "the set-aside tax").
constexpr double default_limit_fraction = 0.3;

// Hit ratios in (1, 1 + tolerance] are rounding noise (0.1 added ten times in float32 gives 1.0000001, which CUDA
// refuses) and are taken as 1.0; larger ones are refused.
constexpr double hit_ratio_tolerance = 1e-6;
// Why a hit ratio is refused; `none`: it is taken. The caller words the refusal (it knows the argument's name).
enum class Hit_ratio_fault : int { none = 0, not_finite = 1, negative = 2, above_one = 3 };
struct Checked_hit_ratio {
  double value;  // as CUDA takes it (normalize_hit_ratio), where `fault` is none
  Hit_ratio_fault fault;
};
// The one copy of the rule of which hit ratios a window takes, and as what: every entry (the compiled scope's fast
// path, _plan.normalize_hit_ratio) asks here.
Checked_hit_ratio check_hit_ratio(double ratio);

// The arithmetic of "auto" and sharing (pure).
double normalize_hit_ratio(double ratio);  // a ratio in [0, 1 + tolerance] as CUDA takes it (never above 1.0f)
// Whether windows asking `demand` bytes (hit ratio x bytes) oversubscribe a set-aside of `limit` bytes, so that their
// lines evict each other; a relative 1e-9 absorbs the rounding of the sum. The one copy of the test.
bool oversubscribed(double demand, long long limit);
long long round_up(long long nbytes, long long granularity);
long long tax_free_limit(long long maximum, long long granularity);
// An exact set-aside request checked against the device's max (persistingL2CacheMaxSize): the request, or, above
// the max, the max where `clamp` (the caller warns), else std::invalid_argument. The one copy of the rule.
long long granted_set_aside(long long request, long long maximum, bool clamp);
// What a set-aside request asks of a device whose max is `maximum`, in bytes: `max` the max itself, a `fraction`
// strictly between 0 and 1 that share of it rounded down, `bytes` what granted_set_aside grants
// (std::invalid_argument as it says, or for a fraction set_aside_fraction_refusal refuses).
enum class Set_aside_form : int { bytes = 0, max = 1, fraction = 2 };
// Why a float set-aside is refused, in the words that follow "set_aside=<the value>" (the caller writes the value as
// its language does), or "" where it is a fraction of the max: 1.0 could mean one byte or all of the max, 0.0 is no
// fraction (write 0), anything else outside (0, 1) or NaN is out of range. The one copy of the rule and its words:
// _plan.check_set_aside and requested_set_aside ask it.
std::string set_aside_fraction_refusal(double fraction);
long long requested_set_aside(Set_aside_form form, long long bytes, double fraction, long long maximum, bool clamp);
long long auto_set_aside(double demand, long long current, long long granularity, long long maximum);
double default_hit_ratio(long long granted, long long window_bytes);
// hit_ratio=None: the window a scope gets when `room` bytes of the set-aside are left for it. A window that fits
// is kept whole at hit ratio 1.0; a larger one is cut to its first `room` bytes (256-byte units) at 1.0, not spread
// over the whole window at room / window (docs/results.md measures both: scripts/bench_defaults.py); a room under
// 256 bytes keeps the whole window at default_hit_ratio(room, window).
// A window over [offset, offset + num_bytes) of a buffer of `buffer_bytes` bytes (num_bytes < 0: to its end): the
// bytes asked, the bytes kept (clipped to the device's largest window, `max_window`; 0: never clipped), whether they
// were clipped, and why the range is refused (`fault`; the caller words it): an offset outside the buffer, or a range
// past its end (never clipped to the buffer: it would cover memory l2ctl knows nothing of). The one copy of the rule:
// persist's entry, _plan.clip_window (persist's arguments, AccessPolicyWindow.for_buffer, the tuner's window sizes)
// and set_window's size check ask it.
enum class Window_fault : int { none = 0, offset_outside = 1, past_end = 2 };
struct Clipped_window {
  long long asked = 0, num_bytes = 0;
  bool clipped = false;
  Window_fault fault = Window_fault::none;
};
Clipped_window clip_window(long long offset, long long num_bytes, long long buffer_bytes, long long max_window);
struct Fitted_window {
  long long num_bytes;
  double hit_ratio;
};
constexpr long long fit_unit = 256;
Fitted_window fit_window(long long room, long long window_bytes);
std::vector<double> shared_hit_ratios(const std::vector<std::pair<double, long long>>& requests, long long set_aside);
// (granularity, direction) of the driver's rounding, from a few requests; `ask(n)` sets the limit, returns the grant.
std::pair<long long, std::string> probe_rounding(const std::function<long long(long long)>& ask, long long maximum);

// The registry's lock: one for every backend. Entry points refuse a call from the thread that holds it (a
// finalizer or signal handler running inside l2ctl) instead of planning over a half-made change.
extern const char* const reentry_hint;

std::uint64_t next_scope_id();
std::string hex_of(std::uintptr_t value);

}  // namespace l2ctl::planner
