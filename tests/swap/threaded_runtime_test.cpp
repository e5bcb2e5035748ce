// The runtime's newest paths, one body per backend: the deterministic mock (hazards raised) and
// support/threaded_backend.hpp (a worker thread per stream, events as completion flags, poisoned
// fresh and freed memory, random jitter, no synchronize_device). In suite "threads": .ci/run also
// runs it under ThreadSanitizer.
//
//   * the optimizer step's phases: per tensor and packed, prefetch, resident share, deferred
//     offload, the relay and the hand-over of relayed arenas: bit-exact against no swap;
//   * a checkpoint saved asynchronously with a deferred offload pending, resumed under other
//     settings: bit-exact against training that never stopped;
//   * activation swap: many groups offloaded and loaded back, each byte as saved;
//   * the pipeline executor on thread_comm, two ranks, with and without activation swap: the same
//     losses and gradient sums on both backends (the threaded one has no synchronize_device());
//   * the self-check: the threaded backend with its stream waits dropped makes the phases body fail.
#define BOOST_TEST_MODULE threaded_runtime
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/exec/thread_comm.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/swap/checkpoint.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/backend_fixture.hpp"
#include "support/backend_list.hpp"
#include "support/threaded_backend.hpp"
#include "support/world.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::test::threaded_backend;
using backends = ps::test::test_backends; // support/backend_list.hpp

namespace {

using ps::test::download;
using ps::test::upload;

/// `fn(in, out)` as a kernel on `s`: `in` and `out` give float pointers to device ranges.
template <class F>
void kernel(mock::backend& b, mock::stream s, std::vector<mock::region> reads, std::vector<mock::region> writes, F fn) {
  b.launch(s, {"stage", std::move(reads), std::move(writes), 50}, [fn](mock::kernel_context const& k) {
    fn([&](ps::device_ptr p, std::size_t n) { return k.read<float>(p, n).data(); },
       [&](ps::device_ptr p, std::size_t n) { return k.write<float>(p, n).data(); });
  });
}
template <class F>
void kernel(threaded_backend& b, threaded_backend::stream_type s, std::vector<mock::region>, std::vector<mock::region>,
            F fn) {
  b.launch(s, [fn] {
    fn([](ps::device_ptr p, std::size_t) { return p.get<float const>(); },
       [](ps::device_ptr p, std::size_t) { return p.get<float>(); });
  });
}

// ----- an AdamW model over the backend ----------------------------------------------------------

/// An AdamW model over the backend (parameters drawn from seed 7).
template <class B>
struct adam_world : ps::test::model<B, ps::adamw<B>> {
  using rt_t = ps::optimizer_swap<ps::adamw<B>>;
  adam_world(B& b, std::vector<std::size_t> const& sz) : ps::test::model<B, ps::adamw<B>>(b, sz, 7, false) {}
};

std::vector<std::size_t> const sizes{3000, 64, 5000, 2048, 1, 4000};

struct phase_setup {
  std::string name;
  ps::swap_config cfg;
  std::size_t prefetch = 0; ///< prefetch(n) before each step; 0: none
};

std::vector<phase_setup> phase_setups() {
  std::vector<phase_setup> out;
  auto base = [](std::size_t times, bool packed) {
    ps::swap_config c;
    c.swap_times = times;
    c.packed = packed;
    c.min_swap_numel = 0;
    return c;
  };
  out.push_back({"per tensor", base(4, false), 0});
  out.push_back({"packed", base(4, true), 0});
  auto c = base(4, false);
  c.resident_share = 45000;
  c.defer_offload = true;
  out.push_back({"per tensor, resident share, prefetch, deferred offload", c, 2});
  c.packed = true;
  out.push_back({"packed, resident share, prefetch, deferred offload", c, 2});
  auto relay = base(sizes.size(), true); // one batch per tensor: the relay and the hand-over
  relay.defer_offload = true;
  out.push_back({"packed relay and hand-over", relay, 3});
  return out;
}

using ps::test::no_swap;

template <class B>
std::vector<std::vector<std::byte>> train(B& b, phase_setup const& p, int steps) {
  ps::transfer_engine<B> x(b);
  ps::device_budget budget(std::uint64_t{1} << 30);
  x.set_budget(&budget);
  adam_world<B> w(b, sizes);
  std::vector<std::vector<std::byte>> out;
  {
    typename adam_world<B>::rt_t rt(x, w.opt, p.cfg);
    for (int s = 0; s < steps; ++s) {
      w.set_grads(static_cast<std::uint64_t>(s));
      if (p.prefetch) (void)rt.prefetch(p.prefetch);
      rt.step();
    }
    out = w.snapshot(rt);
  }
  BOOST_TEST(budget.used() == 0u);
  return out;
}

void check_equal(std::vector<std::vector<std::byte>> const& got, std::vector<std::vector<std::byte>> const& ref) {
  BOOST_TEST_REQUIRE(got.size() == ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST((got[i] == ref[i]), "tensor " << i);
}

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(phases_are_bit_exact, B, backends) {
  B b;
  auto const ref = train(b, {"no swap", no_swap(), 0}, 3);
  for (auto const& p : phase_setups()) {
    BOOST_TEST_CONTEXT(p.name) { check_equal(train(b, p, 3), ref); }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(an_async_checkpoint_with_a_deferred_offload_resumes_exactly, B, backends) {
  B b;
  ps::transfer_engine<B> x(b);
  auto const path = std::filesystem::temp_directory_path() /
                    ("pipeswap_threaded_" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) +
                     (std::is_same_v<B, mock::backend> ? "_mock" : "_threads") + ".safetensors");
  auto setups = phase_setups();
  std::vector<std::vector<std::byte>> ref;
  {
    adam_world<B> w(b, sizes);
    typename adam_world<B>::rt_t rt(x, w.opt, setups[3].cfg);
    for (int s = 0; s < 4; ++s) {
      w.set_grads(static_cast<std::uint64_t>(s));
      (void)rt.prefetch(2);
      rt.step();
    }
    ref = w.snapshot(rt);
  }
  adam_world<B> w(b, sizes);
  std::vector<std::vector<std::byte>> params_at_2;
  {
    typename adam_world<B>::rt_t rt(x, w.opt, setups[3].cfg);
    for (int s = 0; s < 2; ++s) {
      w.set_grads(static_cast<std::uint64_t>(s));
      (void)rt.prefetch(2);
      rt.step();
    }
    BOOST_TEST(rt.offload_pending());
    auto save = ps::save_checkpoint_async(rt, path);
    params_at_2 = w.params_bytes();
    w.set_grads(2); // a step while the file is written: it must not change the file
    rt.step();
    save.get();
  }
  // A new optimizer over the parameters as they were at the save, other swap settings.
  for (std::size_t i = 0; i < sizes.size(); ++i) upload(b, w.params[i], params_at_2[i].data(), params_at_2[i].size());
  adam_world<B> again(b, {});
  again.sizes = sizes;
  again.params = w.params;
  again.grads = w.grads;
  for (std::size_t i = 0; i < sizes.size(); ++i) again.opt.add_param({w.params[i], w.grads[i], sizes[i]});
  std::vector<std::vector<std::byte>> got;
  {
    typename adam_world<B>::rt_t rt(x, again.opt, setups[4].cfg);
    ps::load_checkpoint(rt, path);
    for (int s = 2; s < 4; ++s) {
      again.set_grads(static_cast<std::uint64_t>(s));
      (void)rt.prefetch(3);
      rt.step();
    }
    got = again.snapshot(rt);
  }
  again.sizes.clear(); // w frees the storage
  std::filesystem::remove(path);
  check_equal(got, ref);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(activation_groups_come_back_byte_for_byte, B, backends) {
  B b;
  ps::transfer_engine<B> x(b);
  ps::activation_swap<B> acts(x);
  for (int run = 0; run < 2; ++run) {
    acts.begin_run();
    std::map<int, std::vector<std::pair<ps::activation_handle, std::vector<std::byte>>>> saved;
    for (int m = 0; m < 6; ++m) {
      ps::schedule::chunk const c{0, m};
      auto scope = acts.forward(c);
      for (int k = 0; k < 3; ++k) {
        std::size_t const n = 1000 + 512 * static_cast<std::size_t>(k + m);
        std::vector<std::byte> v(n);
        ps::test::fill_pattern(v.data(), n, static_cast<std::uint32_t>(run * 100 + m * 10 + k));
        auto d = b.allocate_device(n, b.current_stream());
        upload(b, d, v.data(), n);
        saved[m].push_back({acts.save(d, n), std::move(v)});
      }
    }
    for (int m = 0; m < 6; ++m) acts.launch_offload({0, m});
    for (int m = 0; m < 6; ++m) acts.wait_offload({0, m});
    for (int m = 5; m >= 0; --m) {
      acts.launch_load({0, m});
      acts.wait_load({0, m});
      for (auto const& [h, v] : saved[m]) BOOST_TEST((download(b, acts.ptr(h), v.size()) == v), "micro " << m);
      acts.release({0, m});
    }
    acts.end_run();
  }
  BOOST_TEST(acts.active_groups() == 0u);
}

// ----- the executor on thread_comm ----------------------------------------------------------------

namespace {

constexpr std::size_t width = 256; // floats per boundary

/// A stage of y = w·x + 1 per element, saving w·x; its backward returns g·w and accumulates
/// Σ g·saved into its gradient (and the last stage's loss is Σ y). Enough to move bytes through
/// every buffer the executor owns, lends and swaps.
template <class B>
struct toy_stage {
  using stage_concept = ps::exec::stage_tag;
  B& b;
  int index, stages;
  float w;
  ps::device_ptr acc; ///< [0]: the gradient sum; [1 + m]: micro m's loss (last stage)
  toy_stage(B& be, int i, int n) : b(be), index(i), stages(n), w(0.5f + 0.25f * static_cast<float>(i)) {
    acc = b.allocate_device(64 * 4, b.current_stream());
    std::vector<float> z(64, 0.0f);
    upload(b, acc, z.data(), z.size() * 4);
  }
  ~toy_stage() { b.deallocate_device(acc, 64 * 4, b.current_stream()); }
  std::size_t input_bytes() const { return width * 4; }
  std::size_t output_bytes() const { return width * 4; }
  void forward(ps::exec::forward_args<B>& f) {
    auto in = f.input.ptr;
    if (index == 0) { // loads its own data
      in = b.allocate_device(width * 4, f.stream);
      int const m = f.micro;
      kernel(b, f.stream, {}, {{in, width * 4}}, [in, m](auto, auto wr) {
        float* p = wr(in, width);
        for (std::size_t i = 0; i < width; ++i)
          p[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(m) * 13) % 17) - 8.0f;
      });
      f.keep(in, width * 4);
    }
    auto act = b.allocate_device(width * 4, f.stream);
    float const wv = w;
    kernel(b, f.stream, {{in, width * 4}}, {{act, width * 4}}, [in, act, wv](auto rd, auto wr) {
      float const* x = rd(in, width);
      float* a = wr(act, width);
      for (std::size_t i = 0; i < width; ++i) a[i] = wv * x[i];
    });
    f.save(act, width * 4);
    if (f.output.ptr) {
      auto out = f.output.ptr;
      kernel(b, f.stream, {{act, width * 4}}, {{out, width * 4}}, [act, out](auto rd, auto wr) {
        float const* a = rd(act, width);
        float* y = wr(out, width);
        for (std::size_t i = 0; i < width; ++i) y[i] = a[i] + 1.0f;
      });
    } else {
      auto loss = acc + (1 + static_cast<std::size_t>(f.micro)) * 4;
      kernel(b, f.stream, {{act, width * 4}}, {{loss, 4}}, [act, loss](auto rd, auto wr) {
        float const* a = rd(act, width);
        float s = 0;
        for (std::size_t i = 0; i < width; ++i) s += a[i] + 1.0f;
        *wr(loss, 1) = s;
      });
    }
  }
  void backward(ps::exec::backward_args<B>& g) {
    auto const act = g.saved[0].ptr;
    auto const gout = g.grad_output.ptr;
    auto const gin = g.grad_input.ptr;
    auto const a0 = acc;
    float const wv = w;
    std::vector<mock::region> reads{{act, width * 4}};
    if (gout) reads.push_back({gout, width * 4});
    std::vector<mock::region> writes{{a0, 4}};
    if (gin) writes.push_back({gin, width * 4});
    kernel(b, g.stream, reads, writes, [act, gout, gin, a0, wv](auto rd, auto wr) {
      float const* a = rd(act, width);
      float const* go = gout ? rd(gout, width) : nullptr;
      float* sum = wr(a0, 1);
      float* gi = gin ? wr(gin, width) : nullptr;
      for (std::size_t i = 0; i < width; ++i) {
        float const gv = go ? go[i] : 1.0f;
        *sum += gv * a[i];
        if (gi) gi[i] = gv * wv;
      }
    });
  }
};

/// One rank of the toy pipeline on thread_comm: its backend, transfer engine, stage and executor
/// (a 60 s watchdog; `label`: executor_options::schedule_label).
template <class B>
struct toy_rank {
  B b;
  ps::transfer_engine<B> x{b};
  toy_stage<B> st;
  ps::exec::thread_comm c;
  ps::exec::pipeline_executor<B, ps::exec::thread_comm, toy_stage<B>> ex;
  toy_rank(ps::exec::thread_world& world, int r, int ranks, std::string label = {})
      : st(b, r, ranks), c(world.comm(r)),
        ex(x, c, ps::schedule::stage_layout(ranks), {{r, &st}}, options(std::move(label))) {}
  static ps::exec::executor_options options(std::string label) {
    ps::exec::executor_options eo;
    eo.wait_timeout = std::chrono::seconds(60);
    eo.schedule_label = std::move(label);
    return eo;
  }
};

/// Two ranks as threads on thread_comm; returns each stage's accumulator bytes.
template <class B>
std::vector<std::vector<std::byte>> run_pipeline(bool swap, int micro, int steps) {
  int const ranks = 2;
  ps::exec::thread_world world(ranks);
  std::vector<std::vector<std::byte>> out(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> ts;
  auto orders = ps::schedule::one_f_one_b(ranks, micro);
  if (swap) {
    for (auto& o : orders) o = ps::schedule::inject_swap_steps(o);
  }
  for (int r = 0; r < ranks; ++r) {
    ts.emplace_back([&, r] {
      try {
        toy_rank<B> k(world, r, ranks, "1f1b micro=" + std::to_string(micro));
        for (int s = 0; s < steps; ++s) k.ex.run_step(orders[static_cast<std::size_t>(r)], [] {});
        out[static_cast<std::size_t>(r)] = download(k.b, k.st.acc, 64 * 4);
      } catch (std::exception const& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
        try {
          world.comm(r).abort(e.what());
        } catch (...) {}
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < ranks; ++r)
    BOOST_TEST(errors[static_cast<std::size_t>(r)].empty(),
               "rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(the_executor_runs_the_same_bytes_with_and_without_swap, B, backends) {
  auto const plain = run_pipeline<B>(false, 4, 2);
  auto const swapped = run_pipeline<B>(true, 4, 2);
  BOOST_TEST_REQUIRE(plain.size() == 2u);
  BOOST_TEST((plain == swapped));
  // Both backends compute the same host math: the bytes equal the mock's.
  BOOST_TEST((run_pipeline<mock::backend>(true, 4, 2) == swapped));
  std::vector<std::byte> zeros(64 * 4, std::byte{0});
  BOOST_TEST((plain[1] != zeros)); // the last stage's losses and gradient sum were written
}

BOOST_AUTO_TEST_CASE(the_schedule_check_runs_again_when_the_orders_change) {
  // Steps 1-2 run 1F1B with 4 micro-batches, step 3 GPipe with 2 on every rank (checked again, one
  // schedule: it runs), step 4 changes rank 1 only, to 1F1B (checked again: GPipe then 1F1B pair up,
  // it runs), step 5 changes both: 1F1B on rank 0, GPipe on rank 1 (refused on both ranks before any
  // entry, naming the deadlock).
  using B = mock::backend;
  int const ranks = 2;
  ps::exec::thread_world world(ranks);
  std::vector<std::string> errors(ranks);
  std::vector<int> steps_done(ranks, 0);
  auto const f4 = ps::schedule::one_f_one_b(ranks, 4), g2 = ps::schedule::gpipe(ranks, 2),
             f2 = ps::schedule::one_f_one_b(ranks, 2);
  std::vector<ps::schedule::rank_orders> per_step = {f4, f4, g2, {g2[0], f2[1]}, {f2[0], g2[1]}};
  std::vector<std::thread> ts;
  for (int r = 0; r < ranks; ++r) {
    ts.emplace_back([&, r] {
      try {
        toy_rank<B> k(world, r, ranks);
        for (auto const& o : per_step) {
          k.ex.run_step(o[static_cast<std::size_t>(r)], [] {});
          ++steps_done[static_cast<std::size_t>(r)];
        }
      } catch (std::exception const& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < ranks; ++r) {
    auto const& e = errors[static_cast<std::size_t>(r)];
    BOOST_TEST(steps_done[static_cast<std::size_t>(r)] == 4, "rank " << r);
    BOOST_TEST(e.find("at schedule check") != std::string::npos, "rank " << r << ": " << e);
    BOOST_TEST(e.find("do not form one schedule") != std::string::npos, "rank " << r << ": " << e);
  }
}

// ----- the self-check ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(without_its_waits_the_threaded_backend_fails_the_bodies) {
  // The same phases body on the threaded backend with every stream wait dropped: copies and updates
  // on different streams run in the order the jitter gives them, and the bytes come out wrong. (The
  // waits, not luck, make the bodies above pass.)
  std::size_t wrong = 0;
  threaded_backend ref_b;
  auto const ref = train(ref_b, {"no swap", no_swap(), 0}, 3);
  for (auto const& p : phase_setups()) {
    threaded_backend b;
    b.set_drop_waits(true);
    wrong += train(b, p, 3) != ref ? 1 : 0;
  }
  BOOST_TEST_MESSAGE(wrong << " of " << phase_setups().size() << " setups went wrong without waits");
  BOOST_TEST(wrong >= 4u);
}
