#include "l2ctl/planner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace l2ctl::planner {

const char* const mps_hint =
    "the persisting L2 limit cannot be set from a client under MPS (or this process is not allowed to set it); "
    "start the MPS control daemon with CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT=<percent> in its "
    "environment to choose the set-aside for all clients";
const char* const reentry_hint =
    "l2ctl was called while it was changing device state on this same thread: from a finalizer (__del__, a "
    "weakref callback) or a signal handler that ran in the middle of an l2ctl call. Refused, so that the change "
    "under way completes intact; make that call outside the finalizer";

namespace {
std::atomic<std::uint64_t> scope_ids{0};

bool refused_limit(const Call_failed& failure) {
  return failure.cuda && failure.call.find("SetLimit") != std::string::npos &&
         (failure.name == "cudaErrorNotSupported" || failure.name == "cudaErrorNotPermitted" ||
          failure.name == "cudaErrorUnsupportedLimit");
}

template <typename T>
double demand_of(const std::vector<T*>& scopes) {
  double demand = 0.0;
  for (const Scope* scope : scopes)
    if (scope->has_window) demand += scope->window.demand();
  return demand;
}

// (slot, scope) pairs, added as the scopes were walked in entry order, reduced to each slot's latest scope and
// sorted by slot. std::sort in place (a stable sort would allocate): ties are ordered by the scopes' ids.
void keep_latest(Top& pairs) {
  std::sort(pairs.begin(), pairs.end(), [](const std::pair<Slot, Scope*>& a, const std::pair<Slot, Scope*>& b) {
    return a.first < b.first || (a.first == b.first && a.second->id < b.second->id);
  });
  auto kept = pairs.begin();
  for (auto it = pairs.begin(); it != pairs.end(); ++it)
    if (it + 1 == pairs.end() || !((it + 1)->first == it->first)) *kept++ = *it;
  pairs.erase(kept, pairs.end());
}

// The scopes of `top`, each once, in entry order, into `out` (its storage reused): a vector sorted and made unique (a
// scope's id is unique).
void distinct(const Top& top, std::vector<Scope*>& out) {
  out.clear();
  for (const auto& [slot, scope] : top) out.push_back(scope);
  std::sort(out.begin(), out.end(), [](const Scope* a, const Scope* b) { return a->id < b->id; });
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

void share(const std::vector<Scope*>& in_force, std::optional<long long> limit) {
  std::vector<Scope*> shared;
  for (Scope* scope : in_force)
    if (scope->share && scope->has_window && scope->window.hit_prop == access_persisting) shared.push_back(scope);
  if (shared.empty() || !limit) return;
  double fixed = 0.0;
  for (Scope* scope : in_force)
    if (std::find(shared.begin(), shared.end(), scope) == shared.end() && scope->has_window)
      fixed += scope->window.demand();
  std::vector<std::pair<double, long long>> requests;
  for (Scope* scope : shared)
    requests.emplace_back(scope->window.hit_ratio, static_cast<long long>(scope->window.num_bytes));
  const auto room = static_cast<long long>(static_cast<double>(*limit) - fixed);  // Python's int(): toward zero
  const std::vector<double> ratios = shared_hit_ratios(requests, std::max(0LL, room));
  for (std::size_t i = 0; i < shared.size(); ++i) shared[i]->effective.hit_ratio = ratios[i];
}
}  // namespace

std::uint64_t next_scope_id() { return ++scope_ids; }

std::string hex_of(std::uintptr_t value) {
  char text[20];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(value));
  return text;
}

// ---- arithmetic ---------------------------------------------------------------------------------------------

double normalize_hit_ratio(double ratio) {
  if (ratio > 1.0 || static_cast<float>(ratio) > 1.0f) return 1.0;
  return ratio;
}

Checked_hit_ratio check_hit_ratio(double ratio) {
  if (!std::isfinite(ratio)) return {ratio, Hit_ratio_fault::not_finite};
  if (ratio < 0.0) return {ratio, Hit_ratio_fault::negative};
  if (ratio > 1.0 + hit_ratio_tolerance) return {ratio, Hit_ratio_fault::above_one};
  if (ratio == 0.0) return {0.0, Hit_ratio_fault::none};  // -0.0 is 0.0: a window never says "-0.000"
  return {normalize_hit_ratio(ratio), Hit_ratio_fault::none};
}

bool oversubscribed(double demand, long long limit) { return demand > static_cast<double>(limit) * (1 + 1e-9); }

long long round_up(long long nbytes, long long granularity) {
  if (granularity <= 0) throw std::invalid_argument("granularity must be positive, got " + std::to_string(granularity));
  long long quotient = nbytes / granularity;  // toward zero: the ceiling for a negative count already
  if (nbytes % granularity != 0 && nbytes > 0) ++quotient;
  return quotient * granularity;
}

long long tax_free_limit(long long maximum, long long granularity) {
  const auto fraction = static_cast<long long>(std::ceil(default_limit_fraction * static_cast<double>(maximum)));
  return std::min(maximum, round_up(fraction, std::max(1LL, granularity)));
}

long long granted_set_aside(long long request, long long maximum, bool clamp) {
  if (request <= maximum || clamp) return std::min(request, maximum);
  throw std::invalid_argument("set-aside of " + std::to_string(request) + " bytes exceeds persistingL2CacheMaxSize (" +
                              std::to_string(maximum) + " bytes); ask for at most " + std::to_string(maximum) +
                              ", or 'max'");
}

std::string set_aside_fraction_refusal(double fraction) {
  if (fraction == 1.0)
    return " is ambiguous: write 'max' for all of persistingL2CacheMaxSize, or an int for bytes (1 is one byte); a "
           "float is a fraction of the max strictly between 0 and 1";
  if (fraction == 0.0)  // -0.0 too
    return ": write 0 for no set-aside; a float is a fraction of the max strictly between 0 and 1";
  if (!(fraction > 0.0 && fraction < 1.0))  // NaN included
    return ": a float is a fraction of the max strictly between 0 and 1; write an int for bytes, 'max' for all of the "
           "max";
  return "";
}

long long requested_set_aside(Set_aside_form form, long long bytes, double fraction, long long maximum, bool clamp) {
  switch (form) {
    case Set_aside_form::max:
      return maximum;
    case Set_aside_form::fraction:
      if (const std::string refused = set_aside_fraction_refusal(fraction); !refused.empty())
        throw std::invalid_argument("set_aside=" + std::to_string(fraction) + refused);
      return static_cast<long long>(std::floor(fraction * static_cast<double>(maximum)));
    case Set_aside_form::bytes:
      break;
  }
  return granted_set_aside(bytes, maximum, clamp);
}

long long auto_set_aside(double demand, long long current, long long granularity, long long maximum) {
  if (demand <= 0) return current;
  const long long need = std::min(maximum, round_up(static_cast<long long>(std::ceil(demand)), std::max(1LL, granularity)));
  return std::max(current, need);
}

double default_hit_ratio(long long granted, long long window_bytes) {
  if (window_bytes <= 0)
    throw std::invalid_argument("window must cover at least one byte, got " + std::to_string(window_bytes));
  return normalize_hit_ratio(std::min(1.0, static_cast<double>(granted) / static_cast<double>(window_bytes)));
}

Clipped_window clip_window(long long offset, long long num_bytes, long long buffer_bytes, long long max_window) {
  Clipped_window out;
  if (offset < 0 || offset >= buffer_bytes) {
    out.fault = Window_fault::offset_outside;
    return out;
  }
  out.asked = num_bytes < 0 ? buffer_bytes - offset : num_bytes;
  if (out.asked > buffer_bytes - offset) {  // offset + num_bytes > buffer_bytes, without overflow
    out.fault = Window_fault::past_end;
    return out;
  }
  out.clipped = max_window > 0 && out.asked > max_window;
  out.num_bytes = out.clipped ? max_window : out.asked;
  return out;
}

Fitted_window fit_window(long long room, long long window_bytes) {
  const double whole = default_hit_ratio(room, window_bytes);  // refuses an empty window
  if (whole >= 1.0) return {window_bytes, 1.0};
  const long long cut = room / fit_unit * fit_unit;
  if (cut < fit_unit) return {window_bytes, whole};
  return {cut, 1.0};
}

std::vector<double> shared_hit_ratios(const std::vector<std::pair<double, long long>>& requests, long long set_aside) {
  double demand = 0.0;
  for (const auto& [ratio, nbytes] : requests) demand += ratio * static_cast<double>(nbytes);
  std::vector<double> out;
  out.reserve(requests.size());
  if (demand <= static_cast<double>(set_aside) || demand <= 0) {
    for (const auto& request : requests) out.push_back(normalize_hit_ratio(request.first));
    return out;
  }
  const double scale = static_cast<double>(std::max(0LL, set_aside)) / demand;
  for (const auto& request : requests) out.push_back(normalize_hit_ratio(std::min(1.0, request.first * scale)));
  return out;
}

std::pair<long long, std::string> probe_rounding(const std::function<long long(long long)>& ask, long long maximum) {
  if (maximum <= 1) return {1, "exact"};
  const long long one = ask(1);
  if (one == 1) return {1, "exact"};
  if (one > 1) return {one, "up"};
  const long long below = ask(maximum - 1);
  if (below < maximum) return {std::max(1LL, maximum - below), "down"};
  // Rounded to nearest: the smallest request granted non-zero is half a step (bisection).
  long long lo = 1, hi = maximum;
  while (lo < hi) {
    const long long mid = lo + (hi - lo) / 2;
    if (ask(mid) > 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return {std::max(1LL, ask(lo)), "nearest"};
}

// ---- what the device holds -----------------------------------------------------------------------------------

void Slot_windows::merge(const Changes& given, bool overwrite) {
  const auto by_slot = [](const value_type& a, const value_type& b) { return a.first < b.first; };
  Changes sorted;
  const bool in_order = std::is_sorted(given.begin(), given.end(), by_slot);
  if (!in_order) {
    sorted = given;
    std::sort(sorted.begin(), sorted.end(), by_slot);
  }
  const Changes& entries = in_order ? given : sorted;
  if (items_.empty() || entries.empty() || items_.back().first < entries.front().first) {
    items_.insert(items_.end(), entries.begin(), entries.end());  // the common case: all new, past the end
    return;
  }
  std::vector<value_type>& merged = spare_;  // its storage kept: swapped with items_ below
  merged.clear();
  merged.reserve(items_.size() + entries.size());
  auto a = items_.begin();
  auto b = entries.begin();
  while (a != items_.end() || b != entries.end()) {
    if (b == entries.end() || (a != items_.end() && a->first < b->first)) {
      merged.push_back(*a++);
    } else if (a == items_.end() || b->first < a->first) {
      merged.push_back(*b++);
    } else {  // the same slot
      merged.push_back(overwrite ? *b : *a);
      ++a;
      ++b;
    }
  }
  items_.swap(merged);
}

// ---- the plan: the rules, written once ----------------------------------------------------------------------

bool Registry::alive(const Slot& slot) const {
  if (generations_.empty()) return true;
  const auto it = generations_.find({slot.kind, slot.handle});
  return slot.generation == (it == generations_.end() ? 0 : it->second);
}

Slot Registry::slot(int kind, std::uintptr_t handle) const {
  const auto it = generations_.find({kind, handle});
  return Slot{kind, handle, it == generations_.end() ? 0 : it->second};
}

// What the device should hold, from the live scopes:
// - a slot's window is the window of the latest-entered live scope on it (with none, its base);
// - the limit is a fold over the scopes in entry order, from the base limit: an exact request sets it; "auto"
//   raises it, never lowers it, to the demand (hit ratio x bytes) of the windows in force among the scopes entered
//   so far, rounded up to the granularity and capped at the tax-free limit (the driver's default). With the base
//   unknown, the fold is the request "at least" its floor (the device raises its limit only if below, and reports
//   what it had: that is the base);
// - share=True scopes in force have their hit ratios scaled so that their demand fits what the other windows in
//   force leave of the limit (each scope's `effective` window).
const Plan& Registry::plan(Device_state& state) {
  Plan& plan = plan_;  // reused: its storage stays allocated from one plan to the next
  plan.limit.reset();
  plan.at_least = plan.capped = false;
  plan.top.clear();
  std::optional<long long> exact;
  long long floor = 0;
  bool automatic = false;
  for (auto& [id, scope] : state.scopes) {
    if (scope->has_window)
      for (const Slot& slot : scope->slots)
        if (alive(slot)) plan.top.emplace_back(slot, scope.get());
    if (scope->request == Request::none) continue;
    if (scope->request == Request::exact) {
      exact = scope->request_bytes;
      continue;
    }
    if (fixed_limits_.count(state.device)) continue;  // "auto" where the limit cannot be set: the limit as it is
    automatic = true;
    top_so_far_.assign(plan.top.begin(), plan.top.end());  // the windows in force among the scopes so far
    keep_latest(top_so_far_);
    distinct(top_so_far_, plan.in_force);
    const double demand = demand_of(plan.in_force);
    if (demand > 0) {
      std::pair<long long, long long> bounds;
      try {
        bounds = auto_bounds(state);
      } catch (const Limit_refused&) {
        // The probe could not set the limit (it changed nothing): "auto" takes the limit as it is from now on.
        fixed_limits_.insert(state.device);
        return Registry::plan(state);
      }
      const auto [step, cap] = bounds;
      const long long value = auto_set_aside(demand, exact ? *exact : floor, step, cap);
      plan.capped = plan.capped ||
                    value < std::min(state.maximum, round_up(static_cast<long long>(std::ceil(demand)), step));
      (exact ? *exact : floor) = value;
    }
  }
  keep_latest(plan.top);
  distinct(plan.top, plan.in_force);
  if (exact)
    plan.limit = exact;
  else if (state.base_limit)
    plan.limit = std::max(*state.base_limit, floor);
  else if (automatic)
    plan.limit = floor;
  plan.at_least = !exact && !state.base_limit && automatic;
  for (Scope* scope : plan.in_force) scope->effective = scope->window;
  if (state.shared) share(plan.in_force, plan.limit && !plan.at_least ? plan.limit : state.applied_limit);
  return plan;
}

std::pair<long long, long long> Registry::auto_bounds(Device_state& state) {
  if (!state.auto_bounds) {
    const long long step = granularity(state.device, state.maximum).first;
    state.auto_bounds = std::make_pair(step, tax_free_limit(state.maximum, step));
  }
  return *state.auto_bounds;
}

// ---- applying the plan --------------------------------------------------------------------------------------

// Makes the device match the plan in one batch: the windows that differ from what l2ctl last applied, the limit
// when its request differs, a reset of persisting lines when asked. `dirty` stays set until the device matches.
// `removed`: scopes or slots went, so slots nothing covers any more are forgotten.
void Registry::sync(Device_state& state, bool reset, bool removed) {
  state.dirty = true;
  if (state.batch) record_batch(state);  // a batch whose recording was cut short: what it read is needed now
  const Plan& planned = plan(state);
  Changes& changes = sync_changes_;  // reused (sync does not nest)
  changes.clear();
  for (const auto& [slot, scope] : planned.top) {
    const auto applied = state.applied_windows.find(slot);
    if (applied == state.applied_windows.end() || applied->second != scope->effective)
      changes.emplace_back(slot, scope->effective);
  }
  const std::size_t covered = changes.size();
  if (state.base_windows.size() > planned.top.size())  // slots no scope covers: back to their base
    for (const auto& [slot, base] : state.base_windows) {
      if (planned.covers(slot)) continue;
      const auto applied = state.applied_windows.find(slot);
      if (applied == state.applied_windows.end() || applied->second != base) changes.emplace_back(slot, base);
    }
  // Two sorted runs of distinct slots: one sorted sequence.
  std::inplace_merge(changes.begin(), changes.begin() + static_cast<std::ptrdiff_t>(covered), changes.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  std::optional<long long> limit = planned.limit;
  if (limit && !planned.at_least && limit == state.applied_request) limit.reset();
  // With "at least", the batch reads the base and grants max(base, the fold): the plan's own value. (A plan that
  // needs the base's value itself, shared or fitted windows, learns it before: enter.)
  if (!changes.empty() || limit || reset) apply(state, changes, limit, planned.at_least, reset);
  double demand = 0.0;
  for (const Scope* scope : planned.in_force) demand += scope->effective.demand();
  state.in_force_demand = demand;
  state.auto_capped = planned.capped;
  if (removed) forget_idle(state);
  state.dirty = false;
}

// One batch, which also reads what newly covered slots held (their base) and, with a limit, what the limit was.
// Its result lands in the journal inside the call; on a failure the registry learns what the device holds.
void Registry::apply(Device_state& state, const Changes& changes, std::optional<long long> limit,
                     bool at_least, bool reset) {
  // The batch and the record of it are the registry's own, reused: their storage stays allocated between calls.
  // (A nested apply, after a failure below, reuses them too: this call reads neither after that.)
  Batch& batch = batch_;
  batch.device = state.device;
  batch.limit = limit ? *limit : -1;
  batch.at_least = at_least;
  batch.reset_lines = reset;
  batch.read_previous = false;
  batch.changes.clear();
  std::vector<Slot>& slots = batch_slots_;
  slots.clear();
  for (const auto& change : changes) {
    if (!state.base_windows.count(change.first)) batch.read_previous = true;
    slots.push_back(change.first);
  }
  for (int pass = 0; pass < 2; ++pass)  // streams first, then kernel nodes (the map's order already)
    for (const auto& [slot, window] : changes)
      if ((slot.kind == stream_slot) == (pass == 0)) batch.changes.emplace_back(slot, window);
  Device_state::Pending pending = std::move(spare_batch_);
  pending.order.clear();
  for (const auto& change : batch.changes) pending.order.push_back(change.first);
  pending.changes.assign(changes.begin(), changes.end());  // the batch's windows, recorded when it returns
  pending.request = batch.limit;
  pending.at_least = at_least;
  pending.journal.reset();
  state.batch = std::move(pending);
  try {
    calls_->apply_batch(batch, &state.batch->journal);
  } catch (const Call_failed& failure) {
    if (failure.cuda) {
      state.batch.reset();  // a failed batch puts back what it changed: nothing to record
      const std::vector<Slot> dead = resync(state, slots);
      if (!dead.empty()) {
        // A holder destroyed by its owner under a live scope: forgotten, so that it poisons no later change; the
        // rest of the batch is applied again without it, and the error says why.
        Changes rest;
        for (const auto& [slot, window] : changes)
          if (alive(slot)) rest.emplace_back(slot, window);
        if (!rest.empty() || limit || reset) apply(state, rest, limit, at_least, reset);
        Call_failed explained = failure;
        explained.note = "l2ctl: " + std::string(dead.front().kind == stream_slot ? "stream 0x" : "kernel node 0x") +
                         hex_of(dead.front().handle) +
                         " no longer exists (destroyed by its owner while an l2ctl scope covered it): l2ctl forgot it, "
                         "and the other changes were made";
        rethrow_translated(explained, state.device);
      }
      rethrow_translated(failure, state.device);
    }
    record_batch(state);
    resync(state, slots);
    throw;
  } catch (...) {
    record_batch(state);  // cut short: the batch may have run (then its journal says what it read)
    resync(state, slots);
    throw;
  }
  record_batch(state);
}

void Registry::rethrow_translated(const Call_failed& failure, int device) {
  if (refused_limit(failure))
    throw Limit_refused("device " + std::to_string(device) + ": " + failure.what() + "; " + mps_hint, failure.cause);
  throw failure;
}

// What the batch in the journal did: the base of every slot it covered for the first time, the windows it
// applied, and the limit (the base limit, when it read it first). Idempotent; the batch is dropped last.
void Registry::record_batch(Device_state& state) {
  if (!state.batch) return;
  Device_state::Pending& batch = *state.batch;
  if (batch.journal) {
    const Batch_result& result = *batch.journal;
    Changes& bases = bases_;
    bases.clear();
    for (std::size_t i = 0; i < batch.order.size() && i < result.previous.size(); ++i)
      bases.emplace_back(batch.order[i], result.previous[i]);
    state.base_windows.merge(bases, false);  // a base, once known, is kept
    state.applied_windows.merge(batch.changes, true);
    if (batch.request >= 0) {
      if (!state.base_limit) state.base_limit = result.previous_limit;  // what was there is the base
      state.applied_request = batch.at_least ? result.granted_limit : batch.request;
      state.applied_limit = state.observed_limit = result.granted_limit;
    }
  }
  spare_batch_ = std::move(*state.batch);  // its storage, for the next batch
  state.batch.reset();
}

// After a failed batch, learn what the device really holds: the batch put back the limit and the slots it had
// read first (every slot l2ctl covered for the first time); the others may have changed.
std::vector<Slot> Registry::resync(Device_state& state, const std::vector<Slot>& slots) {
  state.dirty = true;
  std::vector<Slot> dead;
  for (const Slot& slot : slots) {
    if (!state.base_windows.count(slot)) {
      state.applied_windows.erase(slot);  // put back to what l2ctl never knew: nothing to track
      continue;
    }
    try {
      state.applied_windows[slot] = calls_->get_window(slot);
    } catch (const Call_failed& failure) {
      state.applied_windows.erase(slot);
      if (failure.cuda) {  // the holder cannot be read: it is gone, and no later plan may write there
        ++generations_[{slot.kind, slot.handle}];
        ++slot_epoch_;
        state.base_windows.erase(slot);
        dead.push_back(slot);
      }
    }
  }
  if (state.applied_limit || !state.base_limit) {
    long long limit = 0;
    try {
      limit = calls_->get_persisting_limit(state.device);
    } catch (const Call_failed&) {
      state.applied_request.reset();
      return dead;
    }
    state.observed_limit = limit;
    if (state.base_limit)  // l2ctl owns the limit: what it holds now is what it applied
      state.applied_limit = state.applied_request = limit;
    else  // the batch put back a limit l2ctl does not own
      state.applied_limit = state.applied_request = std::nullopt;
  }
  return dead;
}

// Slots no live scope covers are back to their base and forgotten (re-read when a scope next covers them, so
// changes made outside l2ctl in between are respected); so is the limit once nothing is live.
void Registry::forget_idle(Device_state& state) {
  if (state.scopes.empty()) {
    state.base_windows.clear();
    state.applied_windows.clear();
    state.base_limit = state.applied_limit = state.applied_request = std::nullopt;
    return;
  }
  std::pmr::set<Slot> covered(&pool_);
  for (const auto& [id, scope] : state.scopes) covered.insert(scope->slots.begin(), scope->slots.end());
  forget_where(state, [&](const Slot& slot) { return !covered.count(slot) || !alive(slot); });
}

// What calls cut short (or refused by CUDA) left behind, finished first by every call: scopes whose end began
// are ended (the lines reset if one asked and no window is left); a dirty device is read back and given the plan.
// `quiet`: a query's; a failed call here leaves the device dirty for the next change, which raises it.
void Registry::settle(Device_state& state, bool quiet) {
  // The registry's own list, reused (a quiet settle nests one settle, then reads nothing after it); emptied on the
  // way out however the call ends, so that it keeps no scope alive.
  std::vector<Scope_ptr>& ending = ending_;
  ending.clear();
  const struct Emptied {
    std::vector<Scope_ptr>& list;
    ~Emptied() { list.clear(); }
  } emptied{ending};
  for (const auto& [id, scope] : state.scopes)
    if (scope->ending || (scope->holder_alive != nullptr && !scope->holder_alive(scope->holder)))
      ending.push_back(scope);
  if (ending.empty() && !state.dirty) return;
  if (state.batch) record_batch(state);  // a batch cut short as it returned: what it read is in its journal
  if (quiet) {
    try {
      settle(state, false);
    } catch (const Call_failed&) {
    } catch (const Limit_refused&) {
    }
    return;
  }
  const bool was_dirty = state.dirty;
  state.dirty = true;  // first: this settling, if cut short, is done again
  for (const Scope_ptr& scope : ending) unregister(state, *scope);
  if (was_dirty) {
    state.shared = 0;
    for (const auto& [id, scope] : state.scopes) state.shared += scope->share;
    std::vector<Slot> slots;
    for (const auto& [slot, window] : state.applied_windows) slots.push_back(slot);
    resync(state, slots);
  }
  bool reset = false;
  for (const Scope_ptr& scope : ending) {
    if (!scope->reset_on_exit) continue;
    reset = true;
    for (const auto& [id, other] : state.scopes)
      if (other->has_window) reset = false;
    break;
  }
  sync(state, reset, true);
}

void Registry::register_scope(Device_state& state, const Scope_ptr& scope) {
  scope->id = next_scope_id();
  state.scopes[scope->id] = scope;
  state.shared += scope->share;
}

void Registry::unregister(Device_state& state, Scope& scope) {
  const auto it = state.scopes.find(scope.id);
  if (it != state.scopes.end() && it->second.get() == &scope) {
    Scope_ptr keep = it->second;
    state.scopes.erase(it);
    state.shared -= scope.share;
    if (keep->anchor) released_.push_back(std::move(keep->anchor));
  }
}

Device_state* Registry::lookup(int device) {
  const auto it = states_.find(device);
  return it == states_.end() ? nullptr : &it->second;
}

Device_state& Registry::state(int device, long long maximum) {
  auto it = states_.find(device);
  if (it == states_.end()) {
    it = states_.emplace(device, Device_state{}).first;
    it->second.device = device;
    it->second.maximum = maximum;
  }
  return it->second;
}

// ---- entry points (the caller holds the lock) ----------------------------------------------------------------

Entered Registry::enter(const Scope_ptr& scope, long long maximum) {
  Device_state* found = lookup(scope->device);
  if (found == nullptr)
    found = &state(scope->device, maximum);
  else if (found->dirty || !found->scopes.empty())
    settle(*found);
  Device_state& st = *found;
  double cut = 0.0;  // the demand fit_window took off the window asked for
  try {
    register_scope(st, scope);
    bool fit_capped = false;
    if (scope->fit_hit_ratio && scope->has_window) {
      // As much of the window as the set-aside can hold next to the other windows in force.
      learn_base_limit(st);
      const Plan& planned = plan(st);
      fit_capped = planned.capped;  // the whole window wanted more than "auto" gives
      double others = 0.0;
      for (const Scope* s : planned.in_force)
        if (s != scope.get() && s->has_window) others += s->window.demand();
      const double room = std::max(0.0, static_cast<double>(planned.limit.value_or(0)) - others);
      const Fitted_window fitted =
          fit_window(static_cast<long long>(room), static_cast<long long>(scope->window.num_bytes));
      cut = scope->window.demand();
      scope->window.num_bytes = static_cast<std::size_t>(fitted.num_bytes);
      scope->window.hit_ratio = fitted.hit_ratio;
      cut -= scope->window.demand();
    } else if (st.shared) {
      learn_base_limit(st);  // sharing needs the limit's value to plan
    }
    sync(st);
    st.auto_capped = st.auto_capped || fit_capped;
  } catch (...) {
    scope->ending = true;
    st.dirty = true;  // first: if what follows is cut short, the next call finishes it
    unregister(st, *scope);
    try {
      sync(st, false, true);
    } catch (...) {
      // the first error is the one to see; the device stays dirty for the next call
    }
    throw;
  }
  if (scope->standing) {
    // A plain set_aside call whose SetAside is gone can never be restored, so it shadows every earlier plain
    // call for good: those can go (the fold restarts at the latest exact request), which keeps a loop of plain
    // calls from growing the registry.
    std::uint64_t latest_orphan = 0;
    for (const auto& [id, s] : st.scopes)
      if (s->standing && s->orphaned) latest_orphan = std::max(latest_orphan, id);
    if (latest_orphan) {
      std::vector<Scope_ptr> old;
      for (const auto& [id, s] : st.scopes)
        if (s->standing && id < latest_orphan) old.push_back(s);
      for (const Scope_ptr& s : old) unregister(st, *s);
    }
  }
  Entered out;
  out.limit = st.applied_limit ? *st.applied_limit : seen_limit(st);
  out.demand = st.in_force_demand;
  out.asked = st.in_force_demand + cut;
  out.capped = scope->request == Request::automatic && st.auto_capped;
  return out;
}

void Registry::learn_base_limit(Device_state& state) {
  if (!state.base_limit) {
    const long long limit = calls_->get_persisting_limit(state.device);
    state.base_limit = state.applied_limit = state.applied_request = state.observed_limit = limit;
  }
}

void Registry::exit(Scope& scope) {
  scope.ending = true;
  if (Device_state* st = lookup(scope.device)) settle(*st);
}

int Registry::add_slots(Scope& scope, const std::vector<Slot>& slots) {
  if (scope.ending) return -1;
  Device_state* st = lookup(scope.device);
  if (st == nullptr) return -1;
  settle(*st);
  const auto it = st->scopes.find(scope.id);
  if (it == st->scopes.end() || it->second.get() != &scope) return -1;
  std::vector<Slot> added;
  for (const Slot& slot : slots)
    if (std::find(scope.slots.begin(), scope.slots.end(), slot) == scope.slots.end() &&
        std::find(added.begin(), added.end(), slot) == added.end())
      added.push_back(slot);
  if (added.empty()) return 0;
  scope.slots.insert(scope.slots.end(), added.begin(), added.end());  // the next plan (this one, or a settle) covers them
  try {
    sync(*st);
  } catch (...) {
    // Atomic as an entry: a slot that could not be written is not kept (a later plan would write it again, and
    // its handle may be reused); the device is put back to the plan without it.
    for (const Slot& slot : added) scope.slots.erase(std::remove(scope.slots.begin(), scope.slots.end(), slot), scope.slots.end());
    try {
      sync(*st, false, true);
    } catch (...) {
      // the first error is the one to see; the device stays dirty for the next call
    }
    throw;
  }
  return static_cast<int>(added.size());
}

void Registry::set_base_window(const std::vector<Slot>& slots, int device, long long maximum,
                               const Window& window) {
  Device_state& st = state(device, maximum);
  settle(st);
  std::vector<Slot> idle;
  for (const Slot& slot : slots) {
    auto it = st.base_windows.find(slot);
    if (it != st.base_windows.end())
      it->second = window;
    else
      idle.push_back(slot);
  }
  for (int kind : {stream_slot, node_slot}) {  // one window on each kind of holder: the cheap crossing
    Batch batch;
    batch.device = device;
    for (const Slot& slot : idle)
      if (slot.kind == kind) batch.changes.emplace_back(slot, window);
    if (batch.changes.empty()) continue;
    try {
      calls_->apply_batch(batch, nullptr);
    } catch (const Call_failed& failure) {
      rethrow_translated(failure, device);
    }
  }
}

void Registry::forget_slots(int kind, const std::vector<std::uintptr_t>& handles) {
  for (std::uintptr_t handle : handles) ++generations_[{kind, handle}];
  if (!handles.empty()) ++slot_epoch_;
  for (auto& [device, st] : states_) {
    const bool dead = forget_where(st, [&](const Slot& slot) { return !alive(slot); });
    // Windows that were in force there are no longer: the limit and shared ratios follow.
    if (dead && !st.scopes.empty()) sync(st, false, true);
  }
}

std::optional<long long> Registry::known_limit(int device) {
  Device_state* st = lookup(device);
  if (st == nullptr) return std::nullopt;
  settle(*st, true);
  return st->applied_limit;
}

long long Registry::seen_limit(Device_state& state) {
  if (state.applied_limit) return *state.applied_limit;
  if (!state.observed_limit) state.observed_limit = calls_->get_persisting_limit(state.device);
  return *state.observed_limit;
}

long long Registry::observed_limit(int device, long long maximum) {
  Device_state& st = state(device, maximum);
  settle(st, true);
  return seen_limit(st);
}

Snapshot Registry::snapshot(int device, long long maximum) {
  Device_state& st = state(device, maximum);
  settle(st, true);
  Snapshot out;
  out.limit = st.applied_limit ? *st.applied_limit : calls_->get_persisting_limit(device);
  st.observed_limit = out.limit;
  const Plan& planned = plan(st);
  for (Scope* scope : planned.in_force)
    if (scope->has_window) {
      out.in_force.emplace_back(st.scopes.at(scope->id), scope->effective);
      out.demand += scope->effective.demand();
    }
  return out;
}

std::vector<Scope_ptr> Registry::live_scopes(int device) {
  std::vector<Scope_ptr> out;
  Device_state* st = lookup(device);
  if (st == nullptr) return out;
  settle(*st, true);
  for (const auto& [id, scope] : st->scopes) out.push_back(scope);
  return out;
}

void Registry::reset_lines(int device) {
  try {
    calls_->reset_persisting_lines(device);
  } catch (const Call_failed& failure) {
    rethrow_translated(failure, device);
  }
}

// Probed once per device: the probe sets the limit a few times and puts back what was there.
std::pair<long long, std::string> Registry::granularity(int device, long long maximum) {
  const auto known = granularity_.find(device);
  if (known != granularity_.end()) return known->second;
  const Device_state* st = lookup(device);
  long long previous = 0;
  try {
    previous = st != nullptr && st->applied_limit ? *st->applied_limit : calls_->get_persisting_limit(device);
  } catch (const Call_failed& failure) {
    rethrow_translated(failure, device);
  }
  std::pair<long long, std::string> found;
  bool probed = false;  // a set of the probe's went through: the limit is not what it was
  const auto put_back = [&] {
    try {
      if (calls_->get_persisting_limit(device) != previous) calls_->set_persisting_limit(device, previous);
    } catch (const Call_failed& failure) {
      // A probe refused from the start (MPS) changed nothing; after one that changed the limit, a failed put-back
      // leaves the probe's limit on the device, which the caller must hear of.
      if (probed) rethrow_translated(failure, device);
    }
  };
  try {
    found = probe_rounding(
        [&](long long n) {
          const long long granted = calls_->set_persisting_limit(device, n);
          probed = true;
          return granted;
        },
        maximum);
  } catch (const Call_failed& failure) {
    put_back();
    rethrow_translated(failure, device);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
  granularity_[device] = found;
  return found;
}

std::optional<long long> Registry::known_granularity(int device) const {
  const auto known = granularity_.find(device);
  if (known == granularity_.end()) return std::nullopt;
  return known->second.first;
}

void Registry::settle_all() {
  for (auto& [device, st] : states_) settle(st);
}

void Registry::restore_all() {
  for (auto& [device, st] : states_) {
    // A device with no scope live may still be off the plan: an end cut short after its scope left the registry
    // (at exit, no later call would settle it).
    if (st.scopes.empty() && !st.dirty) continue;
    for (auto& [id, scope] : st.scopes) scope->ending = true;
    try {
      settle(st);
    } catch (const std::exception&) {
      // the process is ending; nothing left to tell
    }
  }
}

}  // namespace l2ctl::planner
