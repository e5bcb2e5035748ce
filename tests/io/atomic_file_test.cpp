// Atomic replacement: a failure at any system call leaves the previous file intact and no temporary
// file behind; EINTR and short writes are retried; the saved safetensors file reads back.
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "io_support.hpp"

#include <pipeswap/io/safetensors.hpp>

namespace io = pipeswap::io;
using pipeswap::dtype;
using namespace io_test;

namespace {

/// Counts calls per name; fails the `nth` call named `call` with `err` (EINTR: only that one call).
struct fault_plan {
  explicit fault_plan(std::string c, std::size_t n = 0, int e = EIO) : call(std::move(c)), nth(n), err(e) {}

  std::string call;
  std::size_t nth;
  int err;
  std::size_t max_bytes = static_cast<std::size_t>(-1);
  std::map<std::string, std::size_t, std::less<>> seen;

  io::syscall_hook hook() {
    return [this](std::string_view c) {
      std::size_t const k = seen[std::string(c)]++;
      io::syscall_fault f;
      if (c == "write") f.max_bytes = max_bytes;
      if (c == call && k == nth) f.error = err;
      return f;
    };
  }
};

/// Options whose hook is `plan`'s, with writes of at most `chunk` bytes.
io::atomic_file_options hooked(fault_plan& plan, std::size_t chunk = std::size_t{8} << 20) {
  io::atomic_file_options o;
  o.hook = plan.hook();
  o.max_write_bytes = chunk;
  return o;
}

struct fixture {
  scratch_dir dir;
  std::filesystem::path target = dir / "opt.safetensors";
  bytes old_contents = to_bytes("previous checkpoint");
  std::vector<float> exp_avg = std::vector<float>(1000, 0.25f);
  std::vector<double> exp_avg_sq = std::vector<double>(300, 3.0);
  std::vector<io::tensor_source> tensors{
      {"exp_avg.0", dtype::f32, {10, 100}, as_bytes_of(exp_avg)},
      {"exp_avg_sq.0", dtype::f64, {300}, as_bytes_of(exp_avg_sq)},
  };
  io::metadata_map metadata{{"step", "17"}};

  fixture() { write_file(target, old_contents); }

  void save(io::atomic_file_options o) {
    io::save_options so;
    so.file = std::move(o);
    io::save_file(target, tensors, metadata, so);
  }
  [[nodiscard]] bytes expected() const { return io::serialize(tensors, metadata); }
};

std::vector<std::string> only(std::string const& name) { return {name}; }

} // namespace

BOOST_AUTO_TEST_SUITE(io_atomic_file)

BOOST_FIXTURE_TEST_CASE(save_replaces_the_target_and_reads_back, fixture) {
  save(io::atomic_file_options());
  BOOST_TEST((read_file(target) == expected()));
  BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
  auto const f = io::safetensors_file::open(target);
  BOOST_TEST(f.metadata().at("step") == "17");
  BOOST_TEST(f.at("exp_avg_sq.0").numel() == 300u);
  // The new file gets 0666 less the umask, like any file the process creates.
  mode_t const mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  BOOST_REQUIRE(::stat(target.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == (0666 & ~mask));
}

BOOST_FIXTURE_TEST_CASE(a_failure_before_the_rename_leaves_the_previous_file, fixture) {
  for (std::string const call : {"open", "fsync", "close", "rename"}) {
    BOOST_TEST_CONTEXT("failing " << call) {
      fault_plan plan(call);
      try {
        save(hooked(plan));
        BOOST_FAIL("no exception");
      } catch (io::io_error const& e) {
        std::string const what = e.what();
        BOOST_TEST(e.call() == call);
        BOOST_TEST(e.code() == EIO);
        BOOST_TEST(what.starts_with("atomic write of \"" + target.string() + "\": " + call + "(\"" +
                                    dir.path().string() + "/.opt.safetensors.tmp."));
        BOOST_TEST(what.ends_with("\"): Input/output error; \"" + target.string() + "\" is unchanged"));
      }
      BOOST_TEST((read_file(target) == old_contents));
      BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
    }
  }
}

BOOST_FIXTURE_TEST_CASE(a_failure_at_every_write_leaves_the_previous_file, fixture) {
  // Small chunks: many writes, each one failed in turn.
  std::size_t nth = 0;
  for (;; ++nth) {
    fault_plan plan("write", nth, ENOSPC);
    try {
      save(hooked(plan, 1000));
    } catch (io::io_error const& e) {
      BOOST_TEST(e.call() == "write");
      BOOST_TEST(std::string(e.what()).find("No space left on device") != std::string::npos);
      BOOST_TEST((read_file(target) == old_contents));
      BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
      continue;
    }
    break; // nth is past the last write: the save succeeded
  }
  // Header in one write, then 2400 bytes of F64 and 4000 bytes of F32 in chunks of 1000.
  BOOST_TEST(nth == 1u + 3u + 4u);
  BOOST_TEST((read_file(target) == expected()));
}

BOOST_FIXTURE_TEST_CASE(a_failure_after_the_rename_reports_but_keeps_the_new_file, fixture) {
  for (std::string const call : {"open_dir", "fsync_dir"}) {
    BOOST_TEST_CONTEXT("failing " << call) {
      write_file(target, old_contents);
      fault_plan plan(call);
      try {
        save(hooked(plan));
        BOOST_FAIL("no exception");
      } catch (io::io_error const& e) {
        BOOST_TEST(e.call() == (call == "open_dir" ? "open" : "fsync"));
        BOOST_TEST(e.path() == dir.path());
        BOOST_TEST(std::string(e.what()).ends_with("; \"" + target.string() +
                                                   "\" holds the new file but the rename may not survive a crash"));
      }
      BOOST_TEST((read_file(target) == expected()));
      BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
    }
  }
}

BOOST_FIXTURE_TEST_CASE(eintr_and_short_writes_are_retried, fixture) {
  for (std::string const call : {"open", "write", "fsync", "close", "rename", "open_dir", "fsync_dir"}) {
    BOOST_TEST_CONTEXT("EINTR on " << call) {
      write_file(target, old_contents);
      fault_plan plan(call, 0, EINTR);
      save(hooked(plan));
      BOOST_TEST((read_file(target) == expected()));
      BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
    }
  }
  // Every write(2) passes at most 7 bytes: the kernel sees real short writes.
  fault_plan plan("none");
  plan.max_bytes = 7;
  save(hooked(plan));
  BOOST_TEST((read_file(target) == expected()));
  auto const ceil7 = [](std::uint64_t n) { return (n + 6) / 7; };
  io::safetensors_writer const w(tensors, metadata);
  BOOST_TEST(plan.seen["write"] == ceil7(8 + w.header_size()) + ceil7(2400) + ceil7(4000));
}

BOOST_FIXTURE_TEST_CASE(real_system_call_failures, fixture) {
  // The directory does not exist: open fails.
  auto const nowhere = dir / "no/such/dir/x.safetensors";
  try {
    io::save_file(nowhere, tensors, metadata);
    BOOST_FAIL("no exception");
  } catch (io::io_error const& e) {
    BOOST_TEST(e.call() == "open");
    BOOST_TEST(e.code() == ENOENT);
    BOOST_TEST(std::string(e.what()).find("No such file or directory") != std::string::npos);
  }
  // The target is a directory: rename fails, the directory and its contents stay.
  std::filesystem::create_directory(dir / "sub");
  write_file(dir / "sub/keep", old_contents);
  try {
    io::save_file(dir / "sub", tensors, metadata);
    BOOST_FAIL("no exception");
  } catch (io::io_error const& e) {
    BOOST_TEST(e.call() == "rename");
    BOOST_TEST(e.code() == EISDIR);
  }
  BOOST_TEST((read_file(dir / "sub/keep") == old_contents));
  auto entries = dir.entries();
  BOOST_TEST(entries == (std::vector<std::string>{"opt.safetensors", "sub"}), boost::test_tools::per_element());
  // A directory the process cannot write to (root can, so this part needs another user).
  if (::geteuid() != 0) {
    std::filesystem::create_directory(dir / "ro");
    write_file(dir / "ro/t", old_contents);
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    BOOST_CHECK_THROW(io::save_file(dir / "ro/t", tensors, metadata), io::io_error);
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_all);
    BOOST_TEST((read_file(dir / "ro/t") == old_contents));
  } else {
    BOOST_TEST_MESSAGE("running as root: the read-only directory case is covered by injected faults");
  }
}

BOOST_FIXTURE_TEST_CASE(invalid_input_throws_before_the_file_system_is_touched, fixture) {
  tensors[0].shape = {3};
  fault_plan plan("none");
  BOOST_CHECK_THROW(save(hooked(plan)), pipeswap::invalid_argument);
  BOOST_TEST(plan.seen.empty());
  BOOST_TEST((read_file(target) == old_contents));
  BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(atomic_file_lifecycle, fixture) {
  {
    io::atomic_file f(target);
    f.write(to_bytes("partial"));
    BOOST_TEST(std::filesystem::exists(f.temp_path()));
    BOOST_TEST(f.temp_path().parent_path() == dir.path());
    BOOST_TEST(f.bytes_written() == 7u);
    // Destroyed without commit: the temporary file goes, the target stays.
  }
  BOOST_TEST((read_file(target) == old_contents));
  BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());

  // Two writers to one target get distinct temporary files; the last commit wins.
  io::atomic_file a(target);
  io::atomic_file b(target);
  BOOST_TEST(a.temp_path() != b.temp_path());
  a.write(to_bytes("from a"));
  b.write(to_bytes("from b"));
  b.commit();
  a.commit();
  BOOST_TEST(a.committed());
  BOOST_TEST(to_string(read_file(target)) == "from a");
  BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());
  BOOST_CHECK_THROW(a.write(to_bytes("x")), pipeswap::state_error);
  BOOST_CHECK_THROW(a.commit(), pipeswap::state_error);

  io::atomic_file c(target);
  c.discard();
  BOOST_TEST(!c.committed());
  BOOST_CHECK_THROW(c.commit(), pipeswap::state_error);
  BOOST_TEST(dir.entries() == only("opt.safetensors"), boost::test_tools::per_element());

  // A moved-from writer does nothing on destruction; the moved-to one commits.
  io::atomic_file_options unsynced;
  unsynced.sync = false;
  io::atomic_file d(target, unsynced);
  d.write(to_bytes("from d"));
  io::atomic_file e(std::move(d));
  e.commit();
  BOOST_TEST(to_string(read_file(target)) == "from d");

  BOOST_TEST(thrown_message<pipeswap::invalid_argument>([&] { io::atomic_file x(dir.path() / ""); }) ==
             "atomic write of \"" + (dir.path() / "").string() + "\": the path names no file");
}

BOOST_FIXTURE_TEST_CASE(a_relative_target_uses_the_working_directory, fixture) {
  auto const cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  io::save_file("rel.safetensors", tensors, metadata);
  std::filesystem::current_path(cwd);
  BOOST_TEST((read_file(dir / "rel.safetensors") == expected()));
  BOOST_TEST(dir.entries() == (std::vector<std::string>{"opt.safetensors", "rel.safetensors"}),
             boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(a_large_file_is_written_in_chunks, fixture) {
  std::vector<std::uint8_t> big(std::size_t{24} << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 31 + (i >> 13));
  std::vector<io::tensor_source> const ts{{"big", dtype::u8, {big.size()}, as_bytes_of(big)}};
  fault_plan plan("none");
  io::save_options so;
  so.file = hooked(plan);
  io::save_file(target, ts, {}, so);
  BOOST_TEST(plan.seen["write"] == 1u + 3u); // header, then 3 chunks of 8 MiB
  auto const f = io::safetensors_file::open(target);
  auto const& t = f.at("big");
  BOOST_TEST((std::equal(t.bytes.begin(), t.bytes.end(), as_bytes_of(big).begin())));
}

BOOST_AUTO_TEST_SUITE_END() // io_atomic_file
