// Training the MLP-block model (mlp_stage.hpp) with the pipeline executor, on one rank of any Comm
// and any backend the stage runs on (the mock by default), and the single-process, no-swap reference
// it must match byte for byte. Shared by the pipeline_train example (on the mock) and the executor's
// tests (on the mock and on the tests' threaded backend). What only the mock can report (peaks from
// its memory timeline, hazards, injected faults) is left at zero, or refused, on other backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/exec/thread_comm.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/layout.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "mlp_stage.hpp"

namespace pipeline_train {

enum class schedule_kind { gpipe, one_f_one_b, interleaved };

struct train_options {
  schedule_kind kind = schedule_kind::one_f_one_b;
  int ranks = 2;
  int stages_per_rank = 1; ///< stages per rank (interleaved only; 1 otherwise)
  int steps = 3;
  bool overlap_b_f = false; ///< interleaved: steady-state backward/forward pairs as OVERLAP_B_F
  bool swap_activations = false;
  bool swap_optimizer = false;
  /// With swap_optimizer: the runtime's phases, driven by the executor (executor_options::
  /// optimizer_phases): batches prefetched during each backward tail, the last offloads deferred
  /// into the next step's forward.
  bool optimizer_phases = false;
  model_config model; ///< stages and micro are set from ranks, stages_per_rank and micro
  ps::exec::executor_options exec;
  /// Orders to run instead of the generated schedule (one per rank, swap steps as given).
  std::optional<ps::schedule::rank_orders> orders;
  /// Per rank, its executor_options::schedule_label (the schedule check compares them); empty: the
  /// label of `exec` on every rank.
  std::vector<std::string> schedule_labels;
  /// Fault injection: on this rank, make the n-th operation of `site` on the mock backend throw
  /// (the mock only: on another backend train_rank refuses it).
  std::optional<int> fault_rank;
  mock::fault_site fault_site = mock::fault_site::kernel;
  std::size_t fault_after = 0;
};

inline ps::schedule::stage_layout layout_of(train_options const& o) {
  return ps::schedule::stage_layout(o.ranks, o.stages_per_rank, ps::schedule::placement::loop);
}

/// The model's stage count and micro-batches follow the schedule.
inline model_config model_of(train_options const& o) {
  auto m = o.model;
  m.stages = o.ranks * o.stages_per_rank;
  return m;
}

/// Every rank's order of the options' schedule, with swap steps when activations swap.
inline ps::schedule::rank_orders orders_of(train_options const& o) {
  namespace sch = ps::schedule;
  if (o.orders) return *o.orders;
  sch::rank_orders r;
  switch (o.kind) {
  case schedule_kind::gpipe: r = sch::gpipe(o.ranks, o.model.micro); break;
  case schedule_kind::one_f_one_b: r = sch::one_f_one_b(o.ranks, o.model.micro); break;
  case schedule_kind::interleaved:
    r = sch::interleaved_1f1b({o.ranks, o.stages_per_rank, o.model.micro, o.overlap_b_f});
    break;
  }
  if (o.swap_activations) {
    for (auto& x : r) x = sch::inject_swap_steps(x);
  }
  return r;
}

/// What one rank reports after training.
struct rank_outcome {
  int rank = 0;
  std::vector<float> losses;     ///< per step (mean over micro-batches); the last stage's rank only
  std::vector<std::byte> params; ///< every parameter byte of the rank's stages, stage by stage
  std::map<int, std::vector<std::byte>> stage_params;
  std::size_t peak_device_bytes = 0;   ///< during the steps (set-up excluded); the mock only
  std::size_t pipeline_peak_bytes = 0; ///< during the schedules' entries (optimizer steps excluded); the mock only
  std::size_t swapped_chunks = 0;      ///< over all steps
  std::size_t prefetched_batches = 0;  ///< optimizer_phases: batches prefetched when each step() began, over all steps
  std::size_t hazards = 0;             ///< the mock's hazard reports (0 elsewhere)
};

template <class B>
using opt_type_for = ps::adamw<B>;
using opt_type = opt_type_for<mock::backend>;

inline ps::swap_config swap_config_of(bool swap_optimizer, bool phases = false) {
  ps::swap_config sc;
  sc.min_swap_numel = 1;
  if (swap_optimizer) {
    sc.swap_times = 8;
    sc.defer_offload = phases;
  } else {
    sc.swap_times = 1;
    sc.state_keys = std::vector<std::string>{}; // nothing swappable: the plain optimizer, one fused update
  }
  return sc;
}

inline mock::options mock_options() {
  mock::options m;
  m.hazards = mock::hazard_policy::raise;
  return m;
}

/// The options a backend B is made with: mock::options on the mock, B::options elsewhere.
template <class B>
struct backend_options {
  using type = typename B::options;
};
template <>
struct backend_options<mock::backend> {
  using type = mock::options;
};
template <class B>
using options_of = typename backend_options<B>::type;

/// The options train_rank and reference make their backend with unless given others: on the mock,
/// mock_options(); elsewhere the backend's defaults.
template <class B>
options_of<B> default_options() {
  if constexpr (is_mock_backend<B>)
    return mock_options();
  else
    return options_of<B>{};
}

/// The host waits for everything enqueued so far: synchronize_device() where the backend has it,
/// else the compute stream and the transfer engine's copy streams.
template <class B>
void settle(B& b, ps::transfer_engine<B>& x) {
  if constexpr (ps::device_synchronizing<B>) {
    b.synchronize_device();
  } else {
    for (auto s : {b.current_stream(), x.h2d(), x.d2h()}) b.synchronize(b.record_event(s));
  }
}

/// Small pinned chunks: the model is small.
inline ps::pinned_pool_options pool_options() { return {std::size_t{1} << 20, std::size_t{64} << 10, 256}; }

template <class B>
std::vector<float> read_losses(B& b, mlp_stage<B> const& s, int micro) {
  auto const bytes = download(b, b.current_stream(), s.losses(), 4 * static_cast<std::size_t>(micro));
  std::vector<float> v(static_cast<std::size_t>(micro));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

inline float mean_loss(std::vector<float> const& v) {
  float sum = 0;
  for (float x : v) sum += x;
  return sum / static_cast<float>(v.size());
}

/// Device bytes at their peak from simulated time `t0` on (live at t0 included).
inline std::size_t peak_since(mock::backend const& b, mock::sim_time t0) {
  std::size_t peak = 0;
  for (auto const& [t, live] : b.device_memory_timeline()) peak = t <= t0 ? live : std::max(peak, live);
  return peak;
}

/// Device bytes at their peak within the intervals [from, to) (live at each `from` included).
inline std::size_t peak_within(mock::backend const& b,
                               std::vector<std::pair<mock::sim_time, mock::sim_time>> const& spans) {
  auto const tl = b.device_memory_timeline();
  std::size_t peak = 0;
  for (auto const& [from, to] : spans) {
    std::size_t live = 0;
    for (auto const& [t, n] : tl) {
      if (t <= from)
        live = n;
      else if (t < to)
        peak = std::max(peak, n);
    }
    peak = std::max(peak, live);
  }
  return peak;
}

/// The executor's finish with the optimizer-swap runtime's phases: the runtime itself, with `before`
/// called and the batches prefetched so far counted as its step() begins.
template <class R, class F>
struct phased_step {
  R& rt;
  F before;
  std::size_t prefetched = 0;
  void prefetch(std::size_t n) { rt.prefetch(n); }
  bool offload_pending() const { return rt.offload_pending(); }
  template <class S>
  void finish_offload(S s) {
    rt.finish_offload(s);
  }
  void step() {
    before();
    prefetched = rt.prefetched_batches();
    rt.step();
  }
};

/// Trains on one rank of `comm` on a backend B made with `bo`. Throws rank_failure when this or
/// another rank fails.
template <class B = mock::backend, class C>
rank_outcome train_rank(C& comm, train_options const& o, options_of<B> bo = default_options<B>()) {
  auto const layout = layout_of(o);
  auto const cfg = model_of(o);
  int const rank = comm.rank();
  if (o.orders && o.orders->size() != static_cast<std::size_t>(o.ranks)) {
    throw ps::invalid_argument("pipeline_train: " + std::to_string(o.orders->size()) + " orders for " +
                               std::to_string(o.ranks) + " ranks");
  }
  if constexpr (!is_mock_backend<B>) {
    if (o.fault_rank) throw ps::invalid_argument("pipeline_train: fault injection (fault_rank) needs the mock backend");
  }
  B b{bo};
  ps::transfer_engine<B> x(b, pool_options());
  std::vector<std::unique_ptr<mlp_stage<B>>> owned;
  std::map<ps::schedule::index_type, mlp_stage<B>*> stages;
  opt_type_for<B> opt(b);
  for (int s = 0; s < layout.stages(); ++s) {
    if (layout.rank_of(s) != rank) continue;
    owned.push_back(std::make_unique<mlp_stage<B>>(b, cfg, s));
    stages[s] = owned.back().get();
    for (auto const& t : owned.back()->tensors())
      opt.add_param({t.param, t.grad, t.numel, ps::dtype::f32, ps::dtype::f32, false});
  }
  rank_outcome out;
  out.rank = rank;
  // Simulated time on the mock (the peaks are read from its memory timeline); unused elsewhere.
  auto now = [&]() -> mock::sim_time {
    if constexpr (is_mock_backend<B>)
      return b.now();
    else
      return 0;
  };
  mock::sim_time start = 0;
  std::vector<std::pair<mock::sim_time, mock::sim_time>> phases;
  {
    bool const phased = o.swap_optimizer && o.optimizer_phases;
    ps::optimizer_swap<opt_type_for<B>> osw(x, opt, swap_config_of(o.swap_optimizer, phased));
    auto eo = o.exec;
    if (!o.schedule_labels.empty()) eo.schedule_label = o.schedule_labels.at(static_cast<std::size_t>(rank));
    if (phased) {
      eo.optimizer_phases = true;
      eo.settle_device = false; // the deferred offload drains into the next step's forward
    }
    ps::exec::pipeline_executor<B, C, mlp_stage<B>> ex(x, comm, layout, stages, eo);
    auto const orders = orders_of(o);
    settle(b, x);
    start = now(); // the steps' peak, after the set-up (weights, optimizer state materialized)
    if constexpr (is_mock_backend<B>) {
      if (o.fault_rank && *o.fault_rank == rank) b.fail_after(o.fault_site, o.fault_after);
    }
    for (int step = 0; step < o.steps; ++step) {
      auto const begin = now();
      auto const at_step = [&] {
        phases.emplace_back(begin, now());
      }; // the host synchronized the pipeline's compute work
      if (phased) {
        phased_step<ps::optimizer_swap<opt_type_for<B>>, decltype(at_step)> f{osw, at_step};
        ex.run_step(orders.at(static_cast<std::size_t>(rank)), f);
        out.prefetched_batches += f.prefetched;
      } else {
        ex.run_step(orders.at(static_cast<std::size_t>(rank)), [&] {
          at_step();
          osw.step();
        });
      }
      out.swapped_chunks += ex.last_stats().swapped_chunks;
      for (auto const& s : owned) {
        if (s->last()) out.losses.push_back(mean_loss(read_losses(b, *s, cfg.micro)));
      }
    }
  }
  settle(b, x);
  for (auto const& s : owned) {
    auto& v = out.stage_params[s->index()];
    for (auto const& t : s->tensors()) {
      auto const bytes = download(b, b.current_stream(), t.param, 4 * t.numel);
      v.insert(v.end(), bytes.begin(), bytes.end());
    }
    out.params.insert(out.params.end(), v.begin(), v.end());
  }
  if constexpr (is_mock_backend<B>) {
    out.peak_device_bytes = peak_since(b, start);
    out.pipeline_peak_bytes = peak_within(b, phases);
    out.hazards = b.hazards().size();
  }
  return out;
}

/// The reference: every stage in one process on one device, no swap, no comm. For each step every
/// micro-batch's forward runs through all stages; then each stage, from the last, runs the backward
/// of its micro-batches in `backward_order(stage)` (ascending when empty), which is the order a
/// schedule accumulates its gradients in.
struct reference_result {
  std::vector<float> losses;
  std::map<int, std::vector<std::byte>> stage_params;
};

/// Each stage's micro-batches in the order the orders run their backwards (leaves of composites
/// included).
inline std::map<int, std::vector<int>> backward_orders(ps::schedule::rank_orders const& orders) {
  std::map<int, std::vector<int>> out;
  for (auto const& o : orders) {
    for (auto const& e : o) {
      if (!e) continue;
      if (e->kind == ps::schedule::step_kind::bwd) out[e->stage].push_back(e->micro);
      for (auto const& l : e->sub) {
        if (l.kind == ps::schedule::step_kind::bwd) out[l.stage].push_back(l.micro);
      }
    }
  }
  return out;
}

template <class B = mock::backend>
reference_result reference(train_options const& o, options_of<B> bo = default_options<B>()) {
  auto const cfg = model_of(o);
  auto const backward_order = backward_orders(orders_of(o));
  B b{bo};
  ps::transfer_engine<B> x(b, pool_options());
  std::vector<std::unique_ptr<mlp_stage<B>>> st;
  opt_type_for<B> opt(b);
  for (int s = 0; s < cfg.stages; ++s) {
    st.push_back(std::make_unique<mlp_stage<B>>(b, cfg, s));
    for (auto const& t : st.back()->tensors())
      opt.add_param({t.param, t.grad, t.numel, ps::dtype::f32, ps::dtype::f32, false});
  }
  reference_result out;
  {
    ps::optimizer_swap<opt_type_for<B>> osw(x, opt, swap_config_of(false));
    auto const cs = b.current_stream();
    using buf = ps::exec::device_buffer<B>;
    std::size_t const boundary = st[0]->output_bytes();
    for (int step = 0; step < o.steps; ++step) {
      for (auto& s : st) s->begin_step(b, cs);
      // saved[s][m], inputs[s][m] (the input of stage s), grads[s][m] (the gradient into stage s's output)
      std::vector<std::vector<std::vector<buf>>> saved(st.size(),
                                                       std::vector<std::vector<buf>>(std::size_t(cfg.micro)));
      std::vector<std::vector<buf>> inputs(st.size() + 1, std::vector<buf>(std::size_t(cfg.micro)));
      for (int m = 0; m < cfg.micro; ++m) {
        for (std::size_t s = 0; s < st.size(); ++s) {
          buf out{};
          if (s + 1 < st.size()) out = {b.allocate_device(boundary, cs), boundary};
          auto& sv = saved[s][std::size_t(m)];
          ps::exec::forward_args<B> f{b,
                                      cs,
                                      int(s),
                                      m,
                                      inputs[s][std::size_t(m)],
                                      out,
                                      [&](ps::device_ptr p, std::size_t n) { sv.push_back({p, n}); },
                                      {}};
          st[s]->forward(f);
          inputs[s + 1][std::size_t(m)] = out;
        }
      }
      std::vector<std::vector<buf>> grads(st.size() + 1, std::vector<buf>(std::size_t(cfg.micro)));
      for (std::size_t s = st.size(); s-- > 0;) {
        std::vector<int> ms;
        if (auto it = backward_order.find(int(s)); it != backward_order.end())
          ms = it->second;
        else
          for (int m = 0; m < cfg.micro; ++m) ms.push_back(m);
        for (int m : ms) {
          buf gin{};
          if (s > 0) gin = {b.allocate_device(boundary, cs), boundary};
          auto const& sv = saved[s][std::size_t(m)];
          ps::exec::backward_args<B> g{b,   cs, int(s), m, inputs[s][std::size_t(m)], grads[s + 1][std::size_t(m)],
                                       gin, sv, {}};
          st[s]->backward(g);
          grads[s][std::size_t(m)] = gin;
        }
      }
      settle(b, x);
      osw.step();
      out.losses.push_back(mean_loss(read_losses(b, *st.back(), cfg.micro)));
      for (auto& per_stage : saved)
        for (auto& per_micro : per_stage)
          for (auto& x2 : per_micro) b.deallocate_device(x2.ptr, x2.bytes, cs);
      for (auto* v : {&inputs, &grads})
        for (auto& per_stage : *v)
          for (auto& x2 : per_stage)
            if (x2.ptr) b.deallocate_device(x2.ptr, x2.bytes, cs);
    }
  }
  settle(b, x);
  for (auto const& s : st) {
    auto& v = out.stage_params[s->index()];
    for (auto const& t : s->tensors()) {
      auto const bytes = download(b, b.current_stream(), t.param, 4 * t.numel);
      v.insert(v.end(), bytes.begin(), bytes.end());
    }
  }
  return out;
}

/// Every rank's outcome, or the error it ended with.
struct threaded_run {
  std::vector<std::optional<rank_outcome>> outcomes;
  std::vector<std::string> errors; ///< empty string: the rank succeeded
  [[nodiscard]] bool ok() const {
    for (auto const& e : errors)
      if (!e.empty()) return false;
    return true;
  }
};

/// Runs every rank as a thread of this process on thread_comm, each on its own backend B made with `bo`.
template <class B = mock::backend>
threaded_run train_threads(train_options const& o, options_of<B> bo = default_options<B>()) {
  ps::exec::thread_world w(o.ranks);
  threaded_run r;
  r.outcomes.resize(std::size_t(o.ranks));
  r.errors.resize(std::size_t(o.ranks));
  std::vector<std::thread> ts;
  for (int k = 0; k < o.ranks; ++k) {
    ts.emplace_back([&, k] {
      try {
        auto c = w.comm(k);
        r.outcomes[std::size_t(k)] = train_rank<B>(c, o, bo);
      } catch (std::exception const& e) {
        r.errors[std::size_t(k)] = e.what();
        if (r.errors[std::size_t(k)].empty()) r.errors[std::size_t(k)] = "(empty message)";
        try {
          w.comm(k).abort(std::string("rank ") + std::to_string(k) + " ended with: " + e.what());
        } catch (...) {}
      }
    });
  }
  for (auto& t : ts) t.join();
  return r;
}

/// Whether every stage's parameters equal the reference's, byte for byte.
inline bool bit_identical(std::vector<std::optional<rank_outcome>> const& outs, reference_result const& ref) {
  std::size_t seen = 0;
  for (auto const& o : outs) {
    if (!o) return false;
    for (auto const& [s, bytes] : o->stage_params) {
      auto it = ref.stage_params.find(s);
      if (it == ref.stage_params.end() || it->second != bytes) return false;
      ++seen;
    }
  }
  return seen == ref.stage_params.size();
}

} // namespace pipeline_train
