// One error type: every public call given a bad index, size, name or handle throws a
// pipeswap::error (never std::out_of_range or another standard exception from an internal
// container), whose message names the call, the object and the rule. The sweep covers adam,
// optimizer_swap, activation_swap, device_budget, transfer_engine, pinned_pool, thread_world and the
// pipeline executor; after each refusal the object still works (checked where it is cheap to say
// what "works" means).
#include <boost/test/unit_test.hpp>

#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/exec/pipeline_executor.hpp>
#include <pipeswap/exec/thread_comm.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

BOOST_AUTO_TEST_SUITE(core_public_errors)

namespace {

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using B = mock::backend;

/// One bad call and the words its message must hold: the call, the object, the rule.
struct bad_call {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> words;
};

/// Runs every call; each must throw a pipeswap::error whose message holds every word.
void sweep(std::vector<bad_call> const& calls) {
  for (auto const& c : calls) {
    BOOST_TEST_CONTEXT(c.name) {
      bool threw = false;
      try {
        c.call();
      } catch (ps::error const& e) {
        threw = true;
        std::string const w = e.what();
        for (auto const& word : c.words) {
          BOOST_TEST(w.find(word) != std::string::npos, "'" << w << "' names '" << word << "'");
        }
      } catch (std::exception const& e) {
        threw = true;
        BOOST_ERROR("threw a " << typeid(e).name() << ", not a pipeswap::error: " << e.what());
      }
      BOOST_TEST(threw, "the call threw");
    }
  }
}

struct no_op_stage {
  using stage_concept = ps::exec::stage_tag;
  std::size_t input_bytes() const { return 16; }
  std::size_t output_bytes() const { return 16; }
  void forward(ps::exec::forward_args<B>&) {}
  void backward(ps::exec::backward_args<B>&) {}
};

} // namespace

BOOST_AUTO_TEST_CASE(adam_and_optimizer_swap) {
  B b;
  ps::transfer_engine<B> x(b);
  auto const s = b.current_stream();
  auto p = b.allocate_device(4096 * 4, s), g = b.allocate_device(4096 * 4, s);
  ps::adamw<B> opt(b);
  opt.add_param({p, g, 4096});
  std::vector<ps::unit_range> const far = {{7, 0, 1}};
  // Never called: the ranges are refused before any address is read.
  auto const no_view = [](std::size_t, std::size_t) -> ps::device_pointer_t<B> {
    throw std::logic_error("not reached");
  };
  std::vector<ps::unit_range> const past_end = {{0, 0, 5000}};
  sweep({
      {"set_grad",
       [&] { opt.set_grad(99, g); },
       {"adam::set_grad", "parameter index 99", "not below the 1 parameters"}},
      {"step_count", [&] { (void)opt.step_count(1); }, {"adam::step_count", "parameter index 1", "not below"}},
      {"param", [&] { (void)opt.param(5); }, {"adam::param", "parameter index 5", "not below"}},
      {"initialize", [&] { opt.initialize(9, p); }, {"adam::initialize", "slot 9", "not below the 2 slots"}},
      {"add_param: bad type",
       [&] {
         opt.add_param({p + 4096 * 4, {}, 1, ps::dtype::u8});
       },
       {"adam::add_param", "parameter 1", "F32, BF16 and F16 are supported"}},
      {"add_param: tied",
       [&] {
         opt.add_param({p, {}, 4096});
       },
       {"adam::add_param", "parameter 1", "parameter 0", "once"}},
      {"update: unit",
       [&] {
         auto ctx = opt.prepare_step();
         opt.update(far, ctx, ps::state_view<B>(no_view));
       },
       {"adam::update", "unit 7", "not below"}},
      {"update: range",
       [&] {
         auto ctx = opt.prepare_step();
         opt.update(past_end, ctx, ps::state_view<B>(no_view));
       },
       {"adam::update", "[0, 5000)", "4096 elements"}},
      {"load_metadata", [&] { opt.load_metadata({}); }, {"adam", "metadata", "lacks 'optimizer'"}},
  });
  ps::swap_config bad_cfg;
  bad_cfg.swap_times = 0;
  sweep({{"swap_config",
          [&] { ps::optimizer_swap<ps::adamw<B>> rt(x, opt, bad_cfg); },
          {"swap_config::swap_times", "must be positive"}}});
  {
    ps::swap_config cfg;
    cfg.swap_times = 2;
    cfg.min_swap_numel = 1;
    ps::optimizer_swap<ps::adamw<B>> rt(x, opt, cfg);
    sweep({
        {"is_swappable",
         [&] { (void)rt.is_swappable(2); },
         {"optimizer_swap", "slot index 2", "out of range (2 slots)"}},
        {"host_mirror", [&] { (void)rt.host_mirror(40); }, {"optimizer_swap", "slot index 40", "out of range"}},
        {"unswappable_device",
         [&] { (void)rt.unswappable_device(0); },
         {"optimizer_swap", "'0.exp_avg'", "is swapped"}},
        {"slot_in",
         [&] { (void)rt.slot_in(3, ps::residency::host); },
         {"optimizer_swap", "slot index 3", "out of range"}},
        {"second runtime",
         [&] { ps::optimizer_swap<ps::adamw<B>> again(x, opt); },
         {"optimizer_swap", "already managed"}},
        {"add_param under a runtime",
         [&] {
           opt.add_param({p + 8 * 4096, {}, 1});
         },
         {"adam::add_param", "destroy the runtime"}},
    });
    rt.step();                          // still works
    BOOST_TEST(opt.step_count(0) == 3); // the two prepare_step() calls above began steps too
  }
  b.deallocate_device(p, 4096 * 4, s);
  b.deallocate_device(g, 4096 * 4, s);
}

BOOST_AUTO_TEST_CASE(activation_swap_budget_transfer_and_pool) {
  B b;
  ps::transfer_engine<B> x(b);
  ps::activation_swap<B> acts(x);
  acts.begin_run();
  ps::schedule::chunk const c{0, 0}, other{3, 1};
  auto const s = b.current_stream();
  auto d = b.allocate_device(256, s);
  ps::activation_handle h;
  {
    auto scope = acts.forward(c);
    h = acts.save(d, 256);
  }
  auto bad = h;
  bad.index = 5;
  sweep({
      {"ptr: index", [&] { (void)acts.ptr(bad); }, {"activation_swap::ptr", "handle index 5", "out of range"}},
      {"state: no group", [&] { (void)acts.state(other); }, {"activation_swap::state", "does not exist"}},
      {"group_bytes", [&] { (void)acts.group_bytes(other); }, {"activation_swap::group_bytes", "does not exist"}},
      {"kept_bytes", [&] { (void)acts.kept_bytes(other); }, {"activation_swap::kept_bytes", "does not exist"}},
      {"wait_offload before launch", [&] { acts.wait_offload(c); }, {"activation_swap::wait_offload", "collecting"}},
      {"launch_load of no group", [&] { acts.launch_load(other); }, {"activation_swap::launch_load", "does not exist"}},
      {"save outside a scope", [&] { (void)acts.save(d, 256); }, {"activation_swap::save", "no forward scope"}},
  });
  BOOST_TEST((acts.ptr(h) == d)); // still usable
  acts.release(c);
  acts.end_run();
  sweep({
      {"ptr: old run", [&] { (void)acts.ptr(h); }, {"activation_swap::ptr", "run"}},
  });
  // (the group owned d from save() on: release() freed it)

  ps::staging_arena<B> arena;
  x.allocate_arena(arena, 4096);
  ps::device_budget elsewhere(1 << 20);
  sweep({
      {"allocate_arena twice",
       [&] { x.allocate_arena(arena, 4096); },
       {"allocate_arena", "staging arena", "already allocated"}},
  });
  {
    // While the engine holds reserved bytes in a budget it cannot move to another one.
    ps::device_budget held(1 << 20);
    x.set_budget(&held);
    ps::staging_arena<B> a2;
    x.allocate_arena(a2, 512);
    sweep({{"set_budget while holding",
            [&] { x.set_budget(&elsewhere); },
            {"transfer_engine::set_budget", "512 reserved bytes", "change budgets only while"}}});
    x.release_arena(a2);
    b.synchronize_device();
    x.set_budget(nullptr);
  }
  x.release_arena(arena);

  ps::device_budget budget(1000);
  budget.reserve(ps::budget_client::optimizer, 100);
  sweep({{"release",
          [&] { budget.release(ps::budget_client::activation, 1); },
          {"device_budget::release", "activation client", "holds 0"}}});
  BOOST_TEST(budget.used() == 100u);

  sweep({
      {"pool: alignment", [&] { ps::pinned_pool<B> pool(b, {.alignment = 3}); }, {"pinned_pool", "alignment 3"}},
      {"pool: first slab",
       [&] { ps::pinned_pool<B> pool(b, {.first_slab_bytes = 0}); },
       {"pinned_pool", "first_slab_bytes"}},
      {"world size", [&] { ps::exec::thread_world w(0); }, {"thread_world", "size must be >= 1"}},
      {"world rank",
       [&] {
         ps::exec::thread_world w(2);
         (void)w.comm(2);
       },
       {"thread_world", "rank 2"}},
  });
}

BOOST_AUTO_TEST_CASE(pipeline_executor) {
  B b;
  ps::transfer_engine<B> x(b);
  ps::exec::thread_world w(1);
  auto comm = w.comm(0);
  no_op_stage st;
  using exec_t = ps::exec::pipeline_executor<B, ps::exec::thread_comm, no_op_stage>;
  sweep({
      {"layout ranks",
       [&] {
         exec_t e(x, comm, ps::schedule::stage_layout(2), {{0, &st}});
       },
       {"pipeline_executor", "layout has 2 ranks", "the comm 1"}},
      {"missing stage",
       [&] { exec_t e(x, comm, ps::schedule::stage_layout(1), {}); },
       {"pipeline_executor", "rank 0 runs stage 0", "no stage object"}},
      {"foreign stage",
       [&] {
         exec_t e(x, comm, ps::schedule::stage_layout(1), {{0, &st}, {1, &st}});
       },
       {"pipeline_executor", "given 2 stages, the layout has 1 stages per rank"}},
  });
  exec_t e(x, comm, ps::schedule::stage_layout(1), {{0, &st}}, {.fail_at = 99});
  ps::schedule::order const o = {ps::schedule::fwd(0, 0), ps::schedule::bwd(0, 0)};
  ps::schedule::order const foreign = {ps::schedule::fwd(2, 0)};
  sweep({
      {"fail_at past the order",
       [&] { e.run_step(o, [] {}); },
       {"pipeline_executor", "fail_at 99", "past the order's 2 entries"}},
  });
  exec_t ok(x, comm, ps::schedule::stage_layout(1), {{0, &st}});
  sweep({
      {"end_step without a step", [&] { ok.end_step([] {}); }, {"pipeline_executor", "end_step before"}},
      {"advance without a step", [&] { (void)ok.advance(); }, {"pipeline_executor", "advance without begin_step"}},
  });
  int finished = 0;
  ok.run_step(o, [&] { ++finished; }); // still works
  BOOST_TEST(finished == 1);
  // A failing step aborts the comm (every rank hears of it), so it comes last.
  sweep({
      {"stage outside the layout",
       [&] { ok.run_step(foreign, [] {}); },
       {"rank 0 failed", "stage 2", "outside the layout"}},
  });
}

BOOST_AUTO_TEST_SUITE_END()
