// Unit tests of the planner (src/l2ctl/planner.cpp) in C++, against a device model in plain C++: no Python, no
// CUDA. Built and run by tests/registry/test_planner_cpp.py. Prints "ok <name>" per test; exits 1 on a failure.
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "l2ctl/planner.hpp"

namespace pl = l2ctl::planner;

namespace {

constexpr long long maximum = 32'768'000;  // an H100's persistingL2CacheMaxSize
constexpr long long step = maximum / 10;   // its driver's granularity, rounded up
constexpr long long initial_limit = 3 * step;

struct Cut_short : std::runtime_error {
  Cut_short() : std::runtime_error("interrupted") {}
};

// A device as CUDA keeps it: the limit (rounded up to `step`), a window per holder, holders that died.
struct Device_model {
  long long limit = initial_limit;
  std::map<std::pair<int, std::uintptr_t>, l2ctl::Window> windows;
  std::vector<std::uintptr_t> dead;
  int batches = 0;
  int fail_batch = -1;       // this batch fails (a CUDA error), putting back what it changed
  int interrupt_batch = -1;  // this batch completes, then its caller is interrupted (after the journal)
};

class Model_calls final : public pl::Calls {
 public:
  explicit Model_calls(Device_model& d) : d_(d) {}
  long long get_persisting_limit(int) override { return d_.limit; }
  long long set_persisting_limit(int, long long n) override { return d_.limit = (n + step - 1) / step * step; }
  l2ctl::Window get_window(const pl::Slot& s) override {
    check(s.handle);
    return d_.windows[{s.kind, s.handle}];
  }
  void reset_persisting_lines(int) override {}
  pl::Batch_result apply_batch(const pl::Batch& b, std::optional<pl::Batch_result>* journal) override {
    const int index = d_.batches++;
    const Device_model before = d_;
    pl::Batch_result r;
    try {
      if (index == d_.fail_batch) failed("cudaStreamSetAttribute", "cudaErrorInvalidValue");
      if (b.limit >= 0) {
        r.previous_limit = r.granted_limit = d_.limit;
        if (b.at_least ? d_.limit < b.limit : d_.limit != b.limit) r.granted_limit = set_persisting_limit(b.device, b.limit);
      }
      for (const auto& [slot, window] : b.changes) {
        check(slot.handle);
        if (b.read_previous) r.previous.push_back(d_.windows[{slot.kind, slot.handle}]);
        d_.windows[{slot.kind, slot.handle}] = window;
      }
    } catch (const pl::Call_failed&) {
      const int batches = d_.batches;
      d_ = before;  // a failed batch puts back what it changed
      d_.batches = batches;
      throw;
    }
    if (journal != nullptr) *journal = r;
    if (index == d_.interrupt_batch) throw Cut_short();
    return r;
  }

 private:
  void check(std::uintptr_t handle) {
    for (std::uintptr_t h : d_.dead)
      if (h == handle) failed("cudaStreamGetAttribute", "cudaErrorInvalidResourceHandle");
  }
  [[noreturn]] static void failed(const char* call, const char* name) {
    throw pl::Call_failed(std::string(call) + " failed: " + name, call, name, true, nullptr);
  }
  Device_model& d_;
};

struct Fixture {
  Device_model device;
  pl::Registry registry{std::unique_ptr<pl::Calls>(new Model_calls(device))};
  l2ctl::Window window(std::uintptr_t base, std::size_t bytes, double ratio) const {
    return l2ctl::Window{base, bytes, ratio, l2ctl::access_persisting, l2ctl::access_streaming};
  }
  pl::Scope_ptr scope(std::vector<pl::Slot> slots, std::optional<l2ctl::Window> w, pl::Request request,
                      long long bytes = 0, bool share = false) {
    auto s = std::make_shared<pl::Scope>();
    s->slots = std::move(slots);
    s->has_window = w.has_value();
    if (w) s->window = s->effective = *w;
    s->request = request;
    s->request_bytes = bytes;
    s->share = share;
    return s;
  }
  l2ctl::Window held(std::uintptr_t handle) { return device.windows[{pl::stream_slot, handle}]; }
};

int failures = 0;
std::string current;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s: %s\n", current.c_str(), what.c_str());
    ++failures;
  }
}

void run(const char* name, const std::function<void()>& test) {
  current = name;
  const int before = failures;
  try {
    test();
  } catch (const std::exception& e) {
    expect(false, std::string("threw ") + e.what());
  }
  if (failures == before) std::printf("ok %s\n", name);
}

const pl::Slot s1{pl::stream_slot, 0x100, 0}, s2{pl::stream_slot, 0x200, 0};

}  // namespace

int main() {
  run("a lean scope applies its window and gives the base back", [] {
    Fixture f;
    const l2ctl::Window base = f.window(0x9000, 4096, 0.25);
    f.device.windows[{0, s1.handle}] = base;
    auto scope = f.scope({s1}, f.window(0x1000, 1 << 20, 0.75), pl::Request::none);
    f.registry.enter(scope, maximum);
    expect(f.held(s1.handle) == scope->window, "the window is in force");
    expect(f.device.batches == 1, "one batch to enter");
    f.registry.exit(*scope);
    expect(f.held(s1.handle) == base, "the base is back");
    expect(f.device.batches == 2 && f.registry.live_scopes(0).empty(), "one batch to end, nothing live");
  });

  run("nested scopes: the latest wins, any exit order ends right", [] {
    Fixture f;
    auto outer = f.scope({s1}, f.window(0x1000, 4096, 0.5), pl::Request::none);
    auto inner = f.scope({s1}, f.window(0x2000, 4096, 1.0), pl::Request::none);
    f.registry.enter(outer, maximum);
    f.registry.enter(inner, maximum);
    expect(f.held(s1.handle) == inner->window, "the inner window");
    f.registry.exit(*outer);  // out of order
    expect(f.held(s1.handle) == inner->window, "still the inner window");
    f.registry.exit(*inner);
    expect(f.held(s1.handle).num_bytes == 0, "the empty base");
  });

  run("auto raises the limit to the demand, capped at the tax-free limit, and gives it back", [] {
    Fixture f;
    f.device.limit = step;
    auto small = f.scope({s1}, f.window(0x1000, 2 * step, 0.5), pl::Request::automatic);  // demand: one step
    pl::Entered e = f.registry.enter(small, maximum);
    expect(f.device.limit == step && !e.capped, "one step: the limit already holds it");
    auto big = f.scope({s2}, f.window(0x1000'0000, 8 * step, 1.0), pl::Request::automatic);
    e = f.registry.enter(big, maximum);
    expect(f.device.limit == pl::tax_free_limit(maximum, step) && e.capped, "capped at the driver's default");
    f.registry.exit(*big);
    f.registry.exit(*small);
    expect(f.device.limit == step, "the base limit is back");
  });

  run("an exact request sets the limit; auto after it never lowers it", [] {
    Fixture f;
    auto exact = f.scope({}, std::nullopt, pl::Request::exact, 5 * step);
    auto automatic = f.scope({s1}, f.window(0x1000, step, 1.0), pl::Request::automatic);
    f.registry.enter(exact, maximum);
    f.registry.enter(automatic, maximum);
    expect(f.device.limit == 5 * step, "the exact request stands");
    f.registry.exit(*exact);
    expect(f.device.limit == initial_limit, "auto alone: the base holds its demand");
    f.registry.exit(*automatic);
    expect(f.device.limit == initial_limit, "the base");
  });

  run("shared scopes split what the limit holds", [] {
    Fixture f;
    auto a = f.scope({s1}, f.window(0x1000, initial_limit, 1.0), pl::Request::none, 0, true);
    auto b = f.scope({s2}, f.window(0x1000'0000, initial_limit, 1.0), pl::Request::none, 0, true);
    f.registry.enter(a, maximum);
    f.registry.enter(b, maximum);
    expect(std::abs(f.held(s1.handle).hit_ratio - 0.5) < 1e-9 && std::abs(f.held(s2.handle).hit_ratio - 0.5) < 1e-9,
           "half each");
    f.registry.exit(*b);
    expect(f.held(s1.handle).hit_ratio == 1.0, "the whole limit again");
    f.registry.exit(*a);
  });

  run("a failed entry leaves nothing registered and the device as it was", [] {
    Fixture f;
    f.device.fail_batch = 0;
    auto scope = f.scope({s1}, f.window(0x1000, 4096, 0.5), pl::Request::exact, 6 * step);
    bool threw = false;
    try {
      f.registry.enter(scope, maximum);
    } catch (const pl::Call_failed&) {
      threw = true;
    }
    expect(threw && f.registry.live_scopes(0).empty(), "refused, nothing live");
    expect(f.device.limit == initial_limit && f.held(s1.handle).num_bytes == 0, "the device as it was");
  });

  run("a batch cut short after it ran keeps its journal: what it read is given back", [] {
    Fixture f;
    const l2ctl::Window base = f.window(0x9000, 4096, 0.25);
    f.device.windows[{0, s1.handle}] = base;
    f.device.interrupt_batch = 0;
    auto scope = f.scope({s1}, f.window(0x1000, 4096, 0.5), pl::Request::exact, 6 * step);
    try {
      f.registry.enter(scope, maximum);
    } catch (const Cut_short&) {
    }
    expect(scope->ending && f.registry.live_scopes(0).empty(), "the entry cut short ends the scope");
    expect(f.held(s1.handle) == base && f.device.limit == initial_limit, "the base window and limit are back");
    expect(!f.registry.known_limit(0), "and forgotten: nothing of l2ctl's holds the limit");
  });

  run("a holder destroyed under a scope is forgotten and poisons nothing", [] {
    Fixture f;
    auto doomed = f.scope({s1}, f.window(0x1000, 4096, 0.5), pl::Request::exact, 6 * step);
    f.registry.enter(doomed, maximum);
    f.device.dead.push_back(s1.handle);
    std::string note;
    try {
      f.registry.exit(*doomed);
    } catch (const pl::Call_failed& e) {
      note = e.note;
    }
    expect(note.find("no longer exists") != std::string::npos, "the error says why");
    expect(f.device.limit == initial_limit, "the rest was made: the limit is back");
    auto healthy = f.scope({s2}, f.window(0x2000, 4096, 0.5), pl::Request::none);
    f.registry.enter(healthy, maximum);
    f.registry.exit(*healthy);
    expect(f.held(s2.handle).num_bytes == 0, "a healthy stream works after it");
  });

  run("a standing request shadowed by a later orphan is dropped", [] {
    Fixture f;
    auto first = f.scope({}, std::nullopt, pl::Request::exact, 4 * step);
    first->standing = true;
    f.registry.enter(first, maximum);
    first->orphaned = true;
    auto second = f.scope({}, std::nullopt, pl::Request::exact, 5 * step);
    second->standing = true;
    second->orphaned = true;
    auto third = f.scope({}, std::nullopt, pl::Request::exact, 6 * step);
    third->standing = true;
    f.registry.enter(second, maximum);
    f.registry.enter(third, maximum);
    expect(f.registry.live_scopes(0).size() == 2 && f.device.limit == 6 * step, "the first is gone");
    f.registry.restore_all();
    expect(f.device.limit == initial_limit, "restore_all gives the base back");
  });

  run("the arithmetic", [] {
    expect(pl::round_up(1, step) == step && pl::round_up(step, step) == step && pl::round_up(0, 7) == 0, "round_up");
    expect(pl::tax_free_limit(maximum, step) == 3 * step, "tax-free: 30% of the max, rounded up");
    expect(pl::auto_set_aside(0.0, 5, step, maximum) == 5, "no demand: the current limit");
    expect(pl::auto_set_aside(step + 1.0, 0, step, maximum) == 2 * step, "demand rounded up");
    expect(pl::auto_set_aside(1.0, 9 * step, step, maximum) == 9 * step, "never lowered");
    const std::vector<double> half = pl::shared_hit_ratios({{1.0, 16384}, {1.0, 16384}}, 16384);
    expect(half == std::vector<double>({0.5, 0.5}), "the source documents' example");
    expect(pl::default_hit_ratio(1, 4) == 0.25 && pl::default_hit_ratio(8, 4) == 1.0, "default hit ratio");
    const pl::Fitted_window fits = pl::fit_window(4096, 1000), cut = pl::fit_window(1000, 4096),
                            tiny = pl::fit_window(100, 4096);
    expect(fits.num_bytes == 1000 && fits.hit_ratio == 1.0, "a window that fits: whole, at 1.0");
    expect(cut.num_bytes == 768 && cut.hit_ratio == 1.0, "a larger one: its first bytes, 256-byte units, at 1.0");
    expect(tiny.num_bytes == 4096 && tiny.hit_ratio == pl::default_hit_ratio(100, 4096), "under 256 bytes: whole");
    expect(pl::normalize_hit_ratio(1.0000001) == 1.0, "never above 1.0f");
    expect(pl::granted_set_aside(maximum, maximum, false) == maximum, "the max itself is granted");
    expect(pl::granted_set_aside(maximum + 1, maximum, true) == maximum, "clamped to the max on request");
    bool refused = false;
    try {
      pl::granted_set_aside(maximum + 1, maximum, false);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    expect(refused, "above the max without clamp: refused");
  });

  run("the rules Python and the compiled scope share: hit ratio, oversubscription, set-aside requests", [] {
    using pl::Hit_ratio_fault;
    const auto fault = [](double r) { return pl::check_hit_ratio(r).fault; };
    expect(pl::check_hit_ratio(0.75).value == 0.75 && fault(0.75) == Hit_ratio_fault::none, "taken as it is");
    expect(pl::check_hit_ratio(0.0).value == 0.0 && pl::check_hit_ratio(1.0).value == 1.0, "the ends");
    // 1.0000001 (0.1 added ten times in float32) and 1 + 1e-6 are noise: 1.0 for CUDA, which refuses more.
    expect(pl::check_hit_ratio(1.0000001).value == 1.0 && pl::check_hit_ratio(1 + 1e-6).value == 1.0, "never > 1.0f");
    expect(static_cast<float>(pl::check_hit_ratio(0.9999999).value) <= 1.0f, "the largest ratio below 1.0f");
    expect(fault(std::nan("")) == Hit_ratio_fault::not_finite && fault(-INFINITY) == Hit_ratio_fault::not_finite,
           "NaN and infinities");
    expect(fault(-1e-300) == Hit_ratio_fault::negative, "negative");
    expect(fault(1 + 2e-6) == Hit_ratio_fault::above_one && fault(INFINITY) == Hit_ratio_fault::not_finite, "above");
    expect(!pl::oversubscribed(100.0, 100) && !pl::oversubscribed(100.0 + 1e-8, 100), "rounding of the sum");
    expect(pl::oversubscribed(100.001, 100) && pl::oversubscribed(1.0, 0) && !pl::oversubscribed(0.0, 0), "above");
    using pl::Set_aside_form;
    expect(pl::requested_set_aside(Set_aside_form::max, 0, 0.0, maximum, false) == maximum, "'max': the max");
    expect(pl::requested_set_aside(Set_aside_form::fraction, 0, 0.5, 1001, false) == 500, "a fraction, rounded down");
    expect(pl::requested_set_aside(Set_aside_form::bytes, 7, 0.0, maximum, false) == 7, "bytes: granted");
    expect(pl::requested_set_aside(Set_aside_form::bytes, maximum + 1, 0.0, maximum, true) == maximum, "clamped");
    int refused = 0;
    for (const auto& [form, bytes, fraction] : {std::tuple{Set_aside_form::bytes, maximum + 1, 0.0},
                                                std::tuple{Set_aside_form::fraction, 0LL, 1.5},
                                                std::tuple{Set_aside_form::fraction, 0LL, std::nan("")}}) {
      try {
        pl::requested_set_aside(form, bytes, fraction, maximum, false);
      } catch (const std::invalid_argument&) {
        ++refused;
      }
    }
    expect(refused == 3, "above the max, and fractions outside [0, 1]: refused");
    expect(pl::set_aside_fraction_refusal(0.5).empty() && pl::set_aside_fraction_refusal(1e-9).empty(), "fractions");
    for (double refused_fraction : {1.0, 0.0, -0.0, 1.5, -0.5, std::nan("")})
      expect(!pl::set_aside_fraction_refusal(refused_fraction).empty(), "not a fraction: refused, with words");
    expect(pl::set_aside_fraction_refusal(1.0).rfind(" is ambiguous", 0) == 0, "1.0: one byte or all of the max?");
  });

  run("a window is clipped to the device's largest and kept inside its buffer", [] {
    using pl::Window_fault;
    const auto clip = [](long long offset, long long bytes, long long buffer, long long max_window) {
      const pl::Clipped_window w = pl::clip_window(offset, bytes, buffer, max_window);
      return std::make_tuple(w.asked, w.num_bytes, w.clipped, w.fault);
    };
    expect(clip(0, -1, 4096, 0) == std::make_tuple(4096LL, 4096LL, false, Window_fault::none), "the whole buffer");
    expect(clip(1024, -1, 4096, 1000) == std::make_tuple(3072LL, 1000LL, true, Window_fault::none), "clipped");
    expect(clip(1024, 3072, 4096, 3072) == std::make_tuple(3072LL, 3072LL, false, Window_fault::none), "to the end");
    expect(std::get<3>(clip(4096, -1, 4096, 0)) == Window_fault::offset_outside, "an offset outside the buffer");
    expect(std::get<3>(clip(1024, 3073, 4096, 0)) == Window_fault::past_end, "a range past its end");
    expect(std::get<3>(clip(1, std::numeric_limits<long long>::max(), 4096, 0)) == Window_fault::past_end,
           "past its end, without overflow");
  });

  run("the driver's rounding is probed in every direction", [] {
    const auto probe = [](std::function<long long(long long)> grant) { return pl::probe_rounding(grant, maximum); };
    expect(probe([](long long n) { return n; }) == std::make_pair(1LL, std::string("exact")), "exact");
    expect(probe([](long long n) { return (n + step - 1) / step * step; }) == std::make_pair(step, std::string("up")),
           "up");
    expect(probe([](long long n) { return n / step * step; }) == std::make_pair(step, std::string("down")), "down");
    expect(probe([](long long n) { return (n + step / 2) / step * step; }) == std::make_pair(step, std::string("nearest")),
           "nearest");
  });

  std::printf("%d failed\n", failures);
  return failures ? 1 : 0;
}
