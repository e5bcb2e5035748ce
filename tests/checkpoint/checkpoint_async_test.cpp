// Asynchronous checkpoint saves: the file holds the state at the time of the call even when steps
// run while it is written (the writer is held back until they are done), errors come from get()
// and leave the previous file, the handle's destructor waits, overlapping saves keep their own
// snapshots. The background thread never touches the backend; this program also runs under
// ThreadSanitizer (suite "threads", .ci/run).
#define BOOST_TEST_MODULE checkpoint_async
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <pipeswap/swap/checkpoint.hpp>

#include "checkpoint/checkpoint_world.hpp"
#include "io/io_support.hpp"
#include "support/no_hazards.hpp"

namespace ps = pipeswap;
namespace io = pipeswap::io;
using ps::test::adam_world;
using ps::test::bytes;
using ps::test::checkpoint_swap;
using rt_t = ps::optimizer_swap<adam_world::opt_t>;

namespace {

/// A file-system hook that holds the writer at its first `open` until released.
class gate {
public:
  gate() : opened_(released_.get_future().share()) {}
  ps::checkpoint_save_options options() {
    ps::checkpoint_save_options o;
    auto f = opened_;
    auto* reached = &reached_;
    o.file.hook = [f, reached](std::string_view call) {
      if (call == "open") {
        reached->store(true);
        f.wait_for(std::chrono::seconds(60)); // bounded: a failing test must not hang the suite
      }
      return io::syscall_fault{};
    };
    return o;
  }
  void release() { released_.set_value(); }
  [[nodiscard]] bool reached() const { return reached_.load(); }

private:
  std::promise<void> released_;
  std::shared_future<void> opened_;
  std::atomic<bool> reached_{false};
};

void check_same(std::vector<bytes> const& got, std::vector<bytes> const& want) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST((got[i] == want[i]), "tensor " << i);
}

} // namespace

BOOST_AUTO_TEST_CASE(steps_during_an_async_save_do_not_reach_the_file) {
  io_test::scratch_dir dir;
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      auto const path = dir / ("optimizer-" + std::to_string(packed) + ".safetensors");
      adam_world w({}, ps::test::recording_hazards());
      rt_t rt(w.x, w.opt, checkpoint_swap(packed));
      w.train(rt, 0, 2);
      auto const expected = ps::checkpoint_to_bytes(rt); // the state at the time of the save
      auto const params = w.param_bytes();

      gate g;
      auto save = ps::save_checkpoint_async(rt, path, g.options());
      BOOST_TEST(save.valid());
      BOOST_TEST(save.snapshot_bytes() == expected.size());
      BOOST_TEST(save.path() == path);
      w.train(rt, 2, 5); // steps while the writer waits at the gate
      BOOST_TEST(!save.ready());
      BOOST_TEST(!std::filesystem::exists(path));
      g.release();
      save.get();
      BOOST_TEST(!save.valid());
      BOOST_TEST(g.reached());
      BOOST_TEST((io_test::read_file(path) == expected));
      BOOST_TEST((ps::checkpoint_to_bytes(rt) != expected)); // the state did move on
      auto const straight = w.everything(rt);
      PIPESWAP_CHECK_NO_HAZARDS(w.b);

      // The file resumes training exactly where the save was taken.
      adam_world r({}, ps::test::recording_hazards());
      r.set_param_bytes(params);
      rt_t rr(r.x, r.opt, checkpoint_swap(!packed));
      ps::load_checkpoint(rr, path);
      r.train(rr, 2, 5);
      check_same(r.everything(rr), straight);
      PIPESWAP_CHECK_NO_HAZARDS(r.b);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_failed_async_write_reports_through_get_and_keeps_the_previous_file) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  w.train(rt, 0, 1);
  ps::save_checkpoint_async(rt, path).get();
  auto const previous = io_test::read_file(path);
  BOOST_TEST((previous == ps::checkpoint_to_bytes(rt)));
  w.train(rt, 1, 2);
  ps::checkpoint_save_options o;
  o.file.hook = [](std::string_view call) { return io::syscall_fault{call == "write" ? ENOSPC : 0}; };
  auto save = ps::save_checkpoint_async(rt, path, o);
  w.train(rt, 2, 3);
  save.wait();
  BOOST_TEST(save.ready());
  auto const msg = io_test::thrown_message<io::io_error>([&] { save.get(); });
  BOOST_TEST(msg.find("No space left on device") != std::string::npos, msg);
  BOOST_TEST(msg.find("is unchanged") != std::string::npos, msg);
  BOOST_TEST((io_test::read_file(path) == previous));
  BOOST_TEST((dir.entries() == std::vector<std::string>{"optimizer.safetensors"}));
}

BOOST_AUTO_TEST_CASE(destroying_the_handle_waits_for_the_write) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(false));
  w.train(rt, 0, 2);
  auto const expected = ps::checkpoint_to_bytes(rt);
  {
    ps::checkpoint_save_options o;
    o.file.hook = [](std::string_view call) {
      if (call == "rename") std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return io::syscall_fault{};
    };
    auto save = ps::save_checkpoint_async(rt, path, o);
    w.train(rt, 2, 3);
  } // no get(): the destructor joins the writer
  BOOST_TEST((io_test::read_file(path) == expected));
}

BOOST_AUTO_TEST_CASE(overlapping_saves_write_their_own_snapshots) {
  io_test::scratch_dir dir;
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  w.train(rt, 0, 1);
  auto const first = ps::checkpoint_to_bytes(rt);
  gate g;
  auto a = ps::save_checkpoint_async(rt, dir / "a.safetensors", g.options());
  w.train(rt, 1, 2);
  auto const second = ps::checkpoint_to_bytes(rt);
  auto b = ps::save_checkpoint_async(rt, dir / "b.safetensors");
  w.train(rt, 2, 3);
  auto c = ps::save_checkpoint_async(rt, dir / "a.safetensors"); // same path as a: the last rename wins
  auto const third = ps::checkpoint_to_bytes(rt);
  b.get();
  c.get();
  BOOST_TEST((io_test::read_file(dir / "b.safetensors") == second));
  BOOST_TEST((io_test::read_file(dir / "a.safetensors") == third));
  g.release();
  a.get();
  BOOST_TEST((io_test::read_file(dir / "a.safetensors") == first));
  BOOST_TEST(first != second);
  BOOST_TEST(second != third);
}

BOOST_AUTO_TEST_CASE(a_relative_path_is_resolved_when_the_save_starts) {
  io_test::scratch_dir dir;
  auto const cwd = std::filesystem::current_path();
  std::filesystem::create_directories(dir / "later");
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  w.train(rt, 0, 1);
  std::filesystem::current_path(dir.path());
  gate g;
  auto save = ps::save_checkpoint_async(rt, "optimizer.safetensors", g.options());
  std::filesystem::current_path(dir / "later");
  g.release();
  save.get();
  std::filesystem::current_path(cwd);
  BOOST_TEST(save.path() == dir / "optimizer.safetensors");
  BOOST_TEST(std::filesystem::exists(dir / "optimizer.safetensors"));
  BOOST_TEST(!std::filesystem::exists(dir / "later" / "optimizer.safetensors"));
}

BOOST_AUTO_TEST_CASE(an_empty_handle_says_so) {
  ps::checkpoint_save h;
  BOOST_TEST(!h.valid());
  BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { h.get(); }) ==
             "checkpoint_save::get: the handle holds no save (default-constructed, moved from, or get() was "
             "called)");
  BOOST_CHECK_THROW(h.wait(), ps::state_error);
  BOOST_CHECK_THROW((void)h.ready(), ps::state_error);
}
