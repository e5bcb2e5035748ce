// Optimizer checkpoints: resuming from a checkpoint equals uninterrupted training bit for bit (both
// pipelines, non-swappable slots, bf16 masters, amsgrad, across runtime configurations) and the file
// does not depend on the runtime, on every backend of support/backend_list.hpp (the mock, the
// threaded backend); on the mock alone (hazard checker raising, or recording where a test asserts
// that there was none; faults; its exact bytes): a bf16-state optimizer; the file's names, dtypes, shapes
// and metadata; every class of bad file rejected with its message while the optimizer keeps every
// byte and stays usable; failures injected at every allocation and copy of a load; interrupted
// steps, timing-only backends and reentrant calls refused; a failed save keeps the previous file;
// each stream wait the checkpoint code issues is necessary (removed, the hazard checker objects).
#ifndef PIPESWAP_MUTATION_TESTING
#  define PIPESWAP_MUTATION_TESTING
#endif
#define BOOST_TEST_MODULE checkpoint
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/swap/checkpoint.hpp>

#include "checkpoint/checkpoint_world.hpp"
#include "io/io_support.hpp"
#include "support/backend_list.hpp"
#include "support/no_hazards.hpp"

namespace ps = pipeswap;
namespace io = pipeswap::io;
namespace mock = pipeswap::mock;
using ps::test::adam_world;
using ps::test::basic_adam_world;
using ps::test::bytes;
using ps::test::checkpoint_swap;
using ps::test::momentum_world;
using ps::test::test_backends;
using rt_t = ps::optimizer_swap<adam_world::opt_t>;

#if defined(PIPESWAP_TEST_CUDA)
// cuda_checkpoint (tests/cuda/meson.build) runs the cases over test_backends on the device (and skips
// as a whole without one).
using gate = ps::test::skip_unless_available<test_backends>;
BOOST_TEST_GLOBAL_FIXTURE(gate);
#endif

namespace {

using ps::test::no_swap;

/// Parameters, state and step counts after `steps` uninterrupted steps on a B.
template <class B>
std::vector<bytes> straight(adam_world::spec const& s, ps::swap_config cfg, int steps) {
  basic_adam_world<B> w(s);
  ps::optimizer_swap<ps::adam<B>> rt(w.x, w.opt, cfg);
  w.train(rt, 0, steps);
  return w.everything(rt);
}

/// Trains `n` steps on a B, saves to `path`, returns the parameters at that point.
template <class B>
std::vector<bytes> train_and_save(adam_world::spec const& s, ps::swap_config cfg, int n,
                                  std::filesystem::path const& path) {
  basic_adam_world<B> w(s);
  ps::optimizer_swap<ps::adam<B>> rt(w.x, w.opt, cfg);
  w.train(rt, 0, n);
  ps::save_checkpoint(rt, path);
  return w.param_bytes();
}

/// A fresh world and runtime on a B, the parameters of a model checkpoint, the optimizer checkpoint,
/// then steps `from` .. `to`.
template <class B>
std::vector<bytes> resume(adam_world::spec const& s, ps::swap_config cfg, std::vector<bytes> const& params,
                          std::filesystem::path const& path, int from, int to) {
  basic_adam_world<B> w(s);
  w.set_param_bytes(params);
  ps::optimizer_swap<ps::adam<B>> rt(w.x, w.opt, cfg);
  ps::load_checkpoint(rt, path);
  w.train(rt, from, to);
  return w.everything(rt);
}

void check_same(std::vector<bytes> const& got, std::vector<bytes> const& want) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST((got[i] == want[i]), "tensor " << i);
}

/// The checkpoint `base` with its tensors or metadata edited, re-serialized.
bytes rebuild(bytes const& base, std::function<void(std::vector<io::tensor_source>&, io::metadata_map&)> edit) {
  auto const v = io::safetensors_view::parse(base);
  std::vector<io::tensor_source> ts;
  for (auto const& t : v.tensors()) ts.push_back({t.name, t.type, t.shape, t.bytes});
  auto meta = v.metadata();
  edit(ts, meta);
  return io::serialize(ts, meta);
}

io::tensor_source& find(std::vector<io::tensor_source>& ts, std::string const& name) {
  for (auto& t : ts) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no tensor " + name);
}

std::uint64_t header_length(bytes const& f) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(f[static_cast<std::size_t>(i)]);
  return n;
}

/// The checkpoint `base` with its header JSON edited (offsets and all), data section kept.
bytes with_header(bytes const& base, std::function<void(nlohmann::json&)> edit) {
  auto const n = header_length(base);
  auto h = nlohmann::json::parse(std::string(reinterpret_cast<char const*>(base.data()) + 8, n));
  edit(h);
  auto const text = h.dump();
  auto out = io_test::length_field(text.size());
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), base.begin() + static_cast<std::ptrdiff_t>(8 + n), base.end());
  return out;
}

bytes first(bytes const& b, std::size_t n) { return {b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)}; }

bool injected(mock::mock_error const& e) { return std::string(e.what()).find("injected fault") != std::string::npos; }

/// A failed step arrives as a step_error with the backend's injected fault nested.
bool injected_step(ps::step_error const& e) {
  try {
    std::rethrow_if_nested(e);
  } catch (mock::mock_error const& inner) {
    return injected(inner);
  } catch (...) {}
  return false;
}

/// "format: MESSAGE" for io::format_error, "invalid: MESSAGE" for another invalid_argument.
std::string rejection(std::function<void()> const& f) {
  try {
    f();
  } catch (io::format_error const& e) {
    return std::string("format: ") + e.what();
  } catch (ps::invalid_argument const& e) {
    return std::string("invalid: ") + e.what();
  }
  return "<accepted>";
}

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(resume_equals_uninterrupted_training_bit_for_bit, B, test_backends) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  for (bool adamw : {true, false}) {
    adam_world::spec s;
    s.adamw = adamw;
    auto const ref = straight<B>(s, checkpoint_swap(true), 4);
    if constexpr (!ps::test::is_mock<B>) check_same(ref, straight<mock::backend>(s, checkpoint_swap(true), 4));
    for (bool packed : {false, true}) {
      BOOST_TEST_CONTEXT("adamw " << adamw << " packed " << packed) {
        auto const params = train_and_save<B>(s, checkpoint_swap(packed), 2, path);
        check_same(resume<B>(s, checkpoint_swap(packed), params, path, 2, 4), ref);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_checkpoint_resumes_under_any_runtime_configuration, B, test_backends) {
  // The file does not depend on the pipeline, the batches or which slots are swapped: a checkpoint
  // of a packed run resumes a per-tensor run, a run that swaps everything, and one that swaps nothing.
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world::spec const s;
  auto const ref = straight<B>(s, no_swap(), 5);
  auto const params = train_and_save<B>(s, checkpoint_swap(true, 3, 64), 3, path);
  for (auto const& cfg :
       {checkpoint_swap(false, 5, 0), checkpoint_swap(true, 1, 0), checkpoint_swap(false, 2, 2048), no_swap()}) {
    BOOST_TEST_CONTEXT("packed " << cfg.packed << " swap_times " << cfg.swap_times << " min_swap_numel "
                                 << cfg.min_swap_numel << " swap " << !cfg.state_keys) {
      check_same(resume<B>(s, cfg, params, path, 3, 5), ref);
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(the_same_state_gives_the_same_file_whatever_the_runtime, B, test_backends) {
  adam_world::spec const s;
  bytes ref;
  for (auto const& cfg : {no_swap(), checkpoint_swap(false), checkpoint_swap(true), checkpoint_swap(true, 7, 0)}) {
    basic_adam_world<B> w(s);
    ps::optimizer_swap<ps::adam<B>> rt(w.x, w.opt, cfg);
    w.train(rt, 0, 2);
    auto const got = ps::checkpoint_to_bytes(rt);
    if (ref.empty()) ref = got;
    BOOST_TEST((got == ref), "packed " << cfg.packed << " swap_times " << cfg.swap_times);
  }
}

BOOST_AUTO_TEST_CASE(a_bf16_state_optimizer_resumes_bit_for_bit) {
  io_test::scratch_dir dir;
  auto const path = dir / "momentum.safetensors";
  using mrt = ps::optimizer_swap<ps::test::momentum_bf16>;
  for (bool packed : {false, true}) {
    BOOST_TEST_CONTEXT("packed " << packed) {
      std::vector<bytes> ref, params;
      {
        momentum_world w;
        mrt rt(w.x, w.opt, checkpoint_swap(packed));
        w.train(rt, 0, 4);
        ref = w.param_bytes();
        for (auto& b : ps::test::state_bytes(rt, w.b)) ref.push_back(std::move(b));
      }
      {
        momentum_world w;
        mrt rt(w.x, w.opt, checkpoint_swap(packed));
        w.train(rt, 0, 2);
        ps::save_checkpoint(rt, path);
        params = w.param_bytes();
      }
      auto const f = io::safetensors_file::open(path);
      BOOST_TEST((f.at("state.0.exp_avg").type == ps::dtype::bf16));
      BOOST_TEST(f.metadata().at("steps") == "2");
      momentum_world w;
      w.set_param_bytes(params);
      mrt rt(w.x, w.opt, checkpoint_swap(!packed));
      ps::load_checkpoint(rt, path);
      w.train(rt, 2, 4);
      auto got = w.param_bytes();
      for (auto& b : ps::test::state_bytes(rt, w.b)) got.push_back(std::move(b));
      check_same(got, ref);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_file_holds_every_slot_and_the_metadata) {
  for (bool packed : {false, true}) {
    adam_world w({}, ps::test::recording_hazards());
    rt_t rt(w.x, w.opt, checkpoint_swap(packed));
    w.train(rt, 0, 2);
    auto const file = ps::checkpoint_to_bytes(rt);
    auto const v = io::safetensors_view::parse(file);
    auto const state = ps::test::state_bytes(rt, w.b);
    auto const slots = w.opt.slots();
    BOOST_TEST(v.size() == slots.size());
    std::size_t resident = 0;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const& s = slots[i];
      resident += !rt.is_swappable(i);
      auto const name = ps::checkpoint_tensor_name(s.param, s.key);
      BOOST_TEST_CONTEXT(name) {
        auto const& t = v.at(name);
        BOOST_TEST((t.type == ps::dtype::f32));
        BOOST_TEST((t.shape == std::vector<std::uint64_t>{s.numel}));
        BOOST_TEST((bytes(t.bytes.begin(), t.bytes.end()) == state[i]));
      }
    }
    BOOST_TEST(resident > 3u); // small and empty parameters keep their state on the device
    BOOST_TEST(v.contains("state.0.master_param"));
    BOOST_TEST(!v.contains("state.1.master_param"));
    BOOST_TEST(v.contains("state.8.max_exp_avg_sq"));
    auto expected = io::metadata_map{{"pipeswap.format", "optimizer_state"}, {"pipeswap.format_version", "1"}};
    for (auto const& [k, val] : w.opt.metadata()) expected.emplace(k, val);
    BOOST_TEST((v.metadata() == expected));
    BOOST_TEST(v.metadata().at("steps") == "2,2,0,2,2,2,2,2,2"); // the empty parameter has no gradient
    BOOST_TEST(v.metadata().at("optimizer") == "AdamW");
    PIPESWAP_CHECK_NO_HAZARDS(w.b);
  }
}

BOOST_AUTO_TEST_CASE(after_a_load_swapped_state_rests_on_the_host_and_resident_state_on_the_device) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world::spec const s;
  train_and_save<mock::backend>(s, checkpoint_swap(true), 2, path);
  for (bool packed : {false, true}) {
    adam_world w(s);
    rt_t rt(w.x, w.opt, checkpoint_swap(packed));
    w.train(rt, 0, 1);
    auto const in_use = w.b.device_bytes_in_use();
    ps::load_checkpoint(rt, path, {io::load_mode::read});
    BOOST_TEST(w.b.device_bytes_in_use() == in_use); // the old unswappable storage went, the new came
    auto const f = io::safetensors_file::open(path);
    auto const slots = w.opt.slots();
    for (std::size_t i = 0; i < slots.size(); ++i) {
      auto const& slot = slots[i];
      BOOST_TEST_CONTEXT(slot.name()) {
        if (rt.is_swappable(i)) {
          BOOST_TEST(rt.slot_in(i, ps::residency::host));
        } else {
          BOOST_TEST(rt.slot_in(i, ps::residency::device));
          BOOST_TEST((!rt.unswappable_device(i)) == (slot.bytes() == 0));
        }
        auto const& t = f.at(ps::checkpoint_tensor_name(slot.param, slot.key));
        bytes got;
        if (slot.bytes() && rt.is_swappable(i)) {
          auto const m = rt.host_mirror(i);
          w.b.note_host_read(m.data(), m.size());
          got.assign(m.begin(), m.end());
        } else if (slot.bytes()) {
          got = w.b.read_device(rt.unswappable_device(i), slot.bytes());
        }
        BOOST_TEST((got == bytes(t.bytes.begin(), t.bytes.end())));
      }
    }
    BOOST_TEST(w.opt.step_count(0) == 2);
  }
}

BOOST_AUTO_TEST_CASE(bad_files_are_rejected_and_the_optimizer_keeps_every_byte) {
  io_test::scratch_dir dir;
  adam_world::spec const s;
  bytes base;
  {
    adam_world w(s);
    rt_t rt(w.x, w.opt, checkpoint_swap(true));
    w.train(rt, 0, 2);
    base = ps::checkpoint_to_bytes(rt);
  }
  auto const n = header_length(base);
  auto const total = base.size();
  auto const view = io::safetensors_view::parse(base);
  auto const data = view.data_size();

  struct bad_case {
    std::string what;
    bytes file;
    std::string expected; ///< the whole rejection, or its start when `prefix`
    bool prefix = false;
    ps::checkpoint_load_options options{};
  };
  std::vector<bad_case> cases;
  auto const q = [](std::string const& s) { return "\"" + s + "\""; };

  // Truncated at several points: inside the length field, the header, the data.
  cases.push_back(
      {"empty file", {}, "format: safetensors: header: file is 0 bytes, shorter than the 8-byte header length"});
  cases.push_back({"cut in the length field", first(base, 5),
                   "format: safetensors: header: file is 5 bytes, shorter than the 8-byte header length"});
  cases.push_back({"length field only", first(base, 8),
                   "format: safetensors: header: length " + std::to_string(n) +
                       " runs past the end of the file (0 bytes follow the length field)"});
  cases.push_back({"cut in the header", first(base, 8 + n / 2),
                   "format: safetensors: header: length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(n / 2) + " bytes follow the length field)"});
  cases.push_back({"header without data", first(base, 8 + n), "format: safetensors: tensor ", true});
  cases.push_back({"cut in the data", first(base, 8 + n + data / 2), "format: safetensors: tensor ", true});
  cases.push_back({"last byte missing", first(base, total - 1), "format: safetensors: tensor ", true});
  // Oversized header: over the format's limit, and over the caller's.
  {
    auto f = base;
    auto const len = io_test::length_field(100'000'001);
    std::copy(len.begin(), len.end(), f.begin());
    cases.push_back({"header length over the limit", f,
                     "format: safetensors: header: length 100000001 exceeds the limit of 100000000 bytes"});
    bad_case c{"header over the caller's limit", base,
               "format: safetensors: header: length " + std::to_string(n) + " exceeds the limit of 256 bytes"};
    c.options.max_header_size = 256;
    cases.push_back(c);
  }
  // Overlapping byte ranges; a corrupted header byte; a trailing byte.
  cases.push_back({"overlapping ranges",
                   with_header(base,
                               [](nlohmann::json& h) {
                                 h["state.0.exp_avg_sq"]["data_offsets"] = h["state.0.exp_avg"]["data_offsets"];
                               }),
                   "format: safetensors: tensor \"state.0.exp_avg", true});
  {
    auto f = base;
    std::string const header(reinterpret_cast<char const*>(base.data()) + 8, n);
    f[8 + header.find("\"data_offsets\":", n / 2) + 14] = std::byte{';'}; // a colon of the JSON
    cases.push_back({"corrupted header byte", f, "format: safetensors: header: not valid JSON", true});
    f = base;
    f[8 + 1] = std::byte{0};
    cases.push_back({"NUL in the header", f, "format: safetensors: header: NUL byte at header offset 1"});
    f = base;
    f.push_back(std::byte{0});
    cases.push_back({"trailing byte", f,
                     "format: safetensors: header: the tensors cover " + std::to_string(data) +
                         " bytes but the data section holds " + std::to_string(data + 1) + " (1 trailing bytes)"});
  }
  // Well-formed files that do not match the optimizer.
  cases.push_back({"wrong dtype",
                   rebuild(base,
                           [&](auto& ts, auto&) {
                             auto& t = find(ts, "state.0.exp_avg");
                             t.type = ps::dtype::bf16;
                             t.shape = {6000};
                           }),
                   "invalid: checkpoint: tensor \"state.0.exp_avg\": dtype BF16 does not match (the optimizer's "
                   "slot is F32 [3000])"});
  cases.push_back({"wrong shape",
                   rebuild(base,
                           [&](auto& ts, auto&) {
                             find(ts, "state.4.exp_avg_sq").shape = {1024, 2};
                           }),
                   "invalid: checkpoint: tensor \"state.4.exp_avg_sq\": shape [1024, 2] does not match (the "
                   "optimizer's slot is F32 [2048])"});
  cases.push_back({"wrong size",
                   rebuild(base,
                           [&](auto& ts, auto&) {
                             auto& t = find(ts, "state.3.max_exp_avg_sq");
                             t.shape = {64};
                             t.bytes = t.bytes.first(256);
                           }),
                   "invalid: checkpoint: tensor \"state.3.max_exp_avg_sq\": shape [64] does not match (the "
                   "optimizer's slot is F32 [65])"});
  cases.push_back(
      {"missing tensor",
       rebuild(base, [&](auto& ts,
                         auto&) { std::erase_if(ts, [](auto const& t) { return t.name == "state.6.master_param"; }); }),
       "invalid: checkpoint: tensor \"state.6.master_param\" is missing (the optimizer's slot is F32 "
       "[4096])"});
  cases.push_back(
      {"missing empty tensor",
       rebuild(base,
               [&](auto& ts, auto&) { std::erase_if(ts, [](auto const& t) { return t.name == "state.2.exp_avg"; }); }),
       "invalid: checkpoint: tensor \"state.2.exp_avg\" is missing (the optimizer's slot is F32 [0])"});
  cases.push_back({"unexpected tensor",
                   rebuild(base,
                           [&](auto& ts, auto&) {
                             auto t = find(ts, "state.1.exp_avg");
                             t.name = "state.9.exp_avg";
                             ts.push_back(t);
                           }),
                   "invalid: checkpoint: tensor \"state.9.exp_avg\" is unexpected: the optimizer has no such slot"});
  cases.push_back({"a master for an fp32 parameter",
                   rebuild(base,
                           [&](auto& ts, auto&) {
                             auto t = find(ts, "state.1.exp_avg");
                             t.name = "state.1.master_param";
                             ts.push_back(t);
                           }),
                   "invalid: checkpoint: tensor \"state.1.master_param\" is unexpected: the optimizer has no such "
                   "slot"});
  // Metadata: the format, its version, the optimizer's hyper-parameters and step counts.
  auto meta_case = [&](std::string what, std::function<void(io::metadata_map&)> edit, std::string expected) {
    cases.push_back({std::move(what), rebuild(base, [&](auto&, auto& m) { edit(m); }), std::move(expected)});
  };
  meta_case(
      "no format", [](auto& m) { m.erase("pipeswap.format"); },
      "invalid: checkpoint: metadata \"pipeswap.format\" is missing: not a pipeswap optimizer checkpoint");
  meta_case(
      "another format", [](auto& m) { m["pipeswap.format"] = "model"; },
      "invalid: checkpoint: metadata \"pipeswap.format\" is \"model\", not \"optimizer_state\"");
  meta_case(
      "no version", [](auto& m) { m.erase("pipeswap.format_version"); },
      "invalid: checkpoint: metadata \"pipeswap.format_version\" is missing");
  meta_case(
      "a newer version", [](auto& m) { m["pipeswap.format_version"] = "2"; },
      "invalid: checkpoint: metadata \"pipeswap.format_version\" is \"2\", but this build reads version 1 "
      "only");
  meta_case(
      "an unknown format key", [](auto& m) { m["pipeswap.compression"] = "zstd"; },
      "invalid: checkpoint: metadata \"pipeswap.compression\" is not defined by format version 1");
  meta_case(
      "another learning rate", [](auto& m) { m["lr"] = "0.5"; },
      "invalid: checkpoint: adam: checkpoint metadata 'lr' is '0.5' but this optimizer has '0.01'");
  meta_case(
      "Adam instead of AdamW", [](auto& m) { m["optimizer"] = "Adam"; },
      "invalid: checkpoint: adam: checkpoint metadata 'optimizer' is 'Adam' but this optimizer has 'AdamW'");
  meta_case(
      "no amsgrad", [](auto& m) { m["amsgrad"] = "false"; },
      "invalid: checkpoint: adam: checkpoint metadata 'amsgrad' is 'false' but this optimizer has 'true'");
  meta_case(
      "bad step counts", [](auto& m) { m["steps"] = "2,2,x,2,2,2,2,2,2"; },
      "invalid: checkpoint: adam: checkpoint metadata 'steps' has a bad entry 'x'");
  meta_case(
      "too few step counts", [](auto& m) { m["steps"] = "2,2"; },
      "invalid: checkpoint: adam: checkpoint metadata 'steps' has 2 entries for 9 parameters");
  meta_case(
      "no step counts", [](auto& m) { m.erase("steps"); },
      "invalid: checkpoint: adam: checkpoint metadata lacks 'steps'");
  cases.push_back({"a plain safetensors file", io::serialize(std::vector<io::tensor_source>{}),
                   "invalid: checkpoint: metadata \"pipeswap.format\" is missing: not a pipeswap optimizer "
                   "checkpoint"});
  // A checkpoint of Adam without amsgrad: its tensors are checked before its metadata.
  {
    auto other = s;
    other.amsgrad = false;
    adam_world w(other);
    rt_t rt(w.x, w.opt, checkpoint_swap(true));
    w.train(rt, 0, 1);
    cases.push_back({"a checkpoint without amsgrad", ps::checkpoint_to_bytes(rt),
                     "invalid: checkpoint: tensor \"state.0.max_exp_avg_sq\" is missing (the optimizer's slot is "
                     "F32 [3000])"});
  }

  for (bool packed : {false, true}) {
    // The victim sees every bad file; its twin does not. Both take a step after each case.
    adam_world victim(s), twin(s);
    rt_t rv(victim.x, victim.opt, checkpoint_swap(packed)), rw(twin.x, twin.opt, checkpoint_swap(packed));
    int step = 0;
    victim.train(rv, step, step + 1);
    twin.train(rw, step, step + 1);
    ++step;
    for (auto const& c : cases) {
      BOOST_TEST_CONTEXT(c.what << " (packed " << packed << ")") {
        auto const before = victim.everything(rv);
        auto const in_use = victim.b.device_bytes_in_use();
        auto const got = rejection([&] { ps::load_checkpoint_from_bytes(rv, c.file, c.options); });
        if (c.prefix) {
          BOOST_TEST(got.starts_with(c.expected), got);
        } else {
          BOOST_TEST(got == c.expected);
        }
        BOOST_TEST(!rv.has_interrupted_step());
        check_same(victim.everything(rv), before);
        BOOST_TEST(victim.b.device_bytes_in_use() == in_use);
        victim.train(rv, step, step + 1);
        twin.train(rw, step, step + 1);
        ++step;
        check_same(victim.everything(rv), twin.everything(rw));
      }
    }
    // The same through files: messages name the path.
    auto const path = dir / "bad.safetensors";
    io_test::write_file(path, cases.front().file);
    BOOST_TEST(rejection([&] { ps::load_checkpoint(rv, path); }) ==
               "format: safetensors: " + path.native() +
                   ": header: file is 0 bytes, shorter than the 8-byte header length");
    auto const no_steps =
        std::find_if(cases.begin(), cases.end(), [](auto const& c) { return c.what == "no step counts"; });
    io_test::write_file(path, no_steps->file);
    BOOST_TEST(rejection([&] { ps::load_checkpoint(rv, path); }) ==
               "invalid: checkpoint " + q(path.native()) + ": adam: checkpoint metadata lacks 'steps'");
    BOOST_CHECK_THROW(ps::load_checkpoint(rv, dir / "absent.safetensors"), io::io_error);
    check_same(victim.everything(rv), twin.everything(rw));
  }
}

BOOST_AUTO_TEST_CASE(a_failure_at_every_allocation_and_copy_of_a_load_changes_nothing) {
  adam_world::spec const s;
  bytes file;
  {
    adam_world w(s);
    rt_t rt(w.x, w.opt, checkpoint_swap(true));
    w.train(rt, 0, 3);
    file = ps::checkpoint_to_bytes(rt);
  }
  for (bool packed : {false, true}) {
    for (auto site : {mock::fault_site::allocation, mock::fault_site::copy}) {
      std::size_t count = 0;
      {
        adam_world w(s);
        rt_t rt(w.x, w.opt, checkpoint_swap(packed));
        w.train(rt, 0, 1);
        auto const before = w.b.attempts(site);
        ps::load_checkpoint_from_bytes(rt, file);
        count = w.b.attempts(site) - before;
      }
      BOOST_TEST(count > 0u);
      for (std::size_t i = 0; i < count; ++i) {
        BOOST_TEST_CONTEXT("packed " << packed << " site " << static_cast<int>(site) << " index " << i) {
          adam_world victim(s), twin(s);
          rt_t rv(victim.x, victim.opt, checkpoint_swap(packed)), rw(twin.x, twin.opt, checkpoint_swap(packed));
          victim.train(rv, 0, 1);
          twin.train(rw, 0, 1);
          auto const before = victim.everything(rv);
          auto const in_use = victim.b.device_bytes_in_use();
          victim.b.fail_after(site, i);
          BOOST_CHECK_EXCEPTION(ps::load_checkpoint_from_bytes(rv, file), mock::mock_error, injected);
          check_same(victim.everything(rv), before);
          BOOST_TEST(victim.b.device_bytes_in_use() == in_use);
          victim.train(rv, 1, 2);
          twin.train(rw, 1, 2);
          check_same(victim.everything(rv), twin.everything(rw));
          // And a load that succeeds afterwards.
          ps::load_checkpoint_from_bytes(rv, file);
          ps::load_checkpoint_from_bytes(rw, file);
          victim.train(rv, 3, 4);
          twin.train(rw, 3, 4);
          check_same(victim.everything(rv), twin.everything(rw));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_interrupted_step_blocks_checkpoints_until_it_is_resolved) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world::spec const s;
  auto const ref = straight<mock::backend>(s, checkpoint_swap(true), 4);
  std::string const save_msg =
      "checkpoint save: the runtime has an unfinished step (step() threw, or this call comes from inside "
      "step()); finish it with step() or give it up with discard_interrupted_step() first";
  std::string const load_msg =
      "checkpoint load: the runtime has an unfinished step (step() threw, or this call comes from inside "
      "step()); finish it with step() or give it up with discard_interrupted_step() first";
  for (bool packed : {false, true}) {
    adam_world w(s);
    rt_t rt(w.x, w.opt, checkpoint_swap(packed));
    w.train(rt, 0, 2);
    ps::save_checkpoint(rt, path);
    auto const params = w.param_bytes();
    auto const file = io_test::read_file(path);
    w.set_grads(2);
    w.b.fail_after(mock::fault_site::copy, 3);
    BOOST_CHECK_EXCEPTION(rt.step(), ps::step_error, injected_step);
    BOOST_TEST_REQUIRE(rt.has_interrupted_step());
    BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { ps::save_checkpoint(rt, path); }) == save_msg);
    BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { (void)ps::checkpoint_to_bytes(rt); }) == save_msg);
    BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { (void)ps::save_checkpoint_async(rt, path); }) ==
               save_msg);
    BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { ps::load_checkpoint(rt, path); }) == load_msg);
    BOOST_TEST((io_test::read_file(path) == file)); // nothing written
    BOOST_TEST(rt.has_interrupted_step());
    // Roll back: give the step up, restore the model and the optimizer, train on.
    rt.discard_interrupted_step();
    w.set_param_bytes(params);
    ps::load_checkpoint(rt, path);
    w.train(rt, 2, 4);
    check_same(w.everything(rt), ref);
  }
}

BOOST_AUTO_TEST_CASE(a_call_from_inside_a_step_is_refused) {
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  std::vector<std::string> errors;
  rt.set_listener([&](std::string_view op) {
    if (op != "update:1") return;
    errors.push_back(io_test::thrown_message<ps::state_error>([&] { (void)ps::checkpoint_to_bytes(rt); }));
    errors.push_back(io_test::thrown_message<ps::state_error>([&] { ps::load_checkpoint_from_bytes(rt, {}); }));
  });
  w.train(rt, 0, 1);
  BOOST_TEST_REQUIRE(errors.size() == 2u);
  BOOST_TEST(errors[0].starts_with("checkpoint save: the runtime has an unfinished step"));
  BOOST_TEST(errors[1].starts_with("checkpoint load: the runtime has an unfinished step"));
  BOOST_TEST(!rt.has_interrupted_step());
}

BOOST_AUTO_TEST_CASE(timing_only_backends_cannot_save_or_load) {
  mock::options o{mock::timing_model::unit()};
  o.materialize = false;
  adam_world w(adam_world::spec{}, o);
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  rt.step();
  io_test::scratch_dir dir;
  std::string const save_msg =
      "checkpoint save: the backend keeps no bytes (a timing-only simulation), so there is no optimizer state to "
      "save or load";
  BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { ps::save_checkpoint(rt, dir / "x"); }) == save_msg);
  BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { (void)ps::save_checkpoint_async(rt, dir / "x"); }) ==
             save_msg);
  BOOST_TEST(io_test::thrown_message<ps::state_error>([&] { ps::load_checkpoint(rt, dir / "x"); }) ==
             "checkpoint load: the backend keeps no bytes (a timing-only simulation), so there is no optimizer "
             "state to save or load");
  BOOST_TEST(dir.entries().empty());
  rt.step(); // still usable
}

BOOST_AUTO_TEST_CASE(a_failed_save_keeps_the_previous_checkpoint) {
  io_test::scratch_dir dir;
  auto const path = dir / "optimizer.safetensors";
  adam_world w;
  rt_t rt(w.x, w.opt, checkpoint_swap(true));
  w.train(rt, 0, 1);
  ps::save_checkpoint(rt, path);
  auto const previous = io_test::read_file(path);
  w.train(rt, 1, 2);
  auto const state = w.everything(rt);
  for (std::string call : {"open", "write", "fsync", "rename"}) {
    BOOST_TEST_CONTEXT(call) {
      ps::checkpoint_save_options o;
      o.file.hook = [&](std::string_view c) { return io::syscall_fault{c == call ? EIO : 0}; };
      auto const msg = io_test::thrown_message<io::io_error>([&] { ps::save_checkpoint(rt, path, o); });
      BOOST_TEST(msg.find("Input/output error") != std::string::npos, msg);
      BOOST_TEST((io_test::read_file(path) == previous));
      BOOST_TEST((dir.entries() == std::vector<std::string>{"optimizer.safetensors"}));
      check_same(w.everything(rt), state);
    }
  }
  ps::save_checkpoint(rt, path);
  BOOST_TEST((io_test::read_file(path) == ps::checkpoint_to_bytes(rt)));
}

BOOST_AUTO_TEST_CASE(save_and_load_leave_no_hazard_and_release_what_they_borrow) {
  // Unswappable state is copied through a pinned pool block that goes back to the pool; the device
  // holds exactly what it held before.
  adam_world w({}, ps::test::recording_hazards());
  rt_t rt(w.x, w.opt, checkpoint_swap(false));
  w.train(rt, 0, 2);
  auto const device = w.b.device_bytes_in_use();
  auto const used = w.x.pool().stats().used_bytes;
  auto const file = ps::checkpoint_to_bytes(rt);
  BOOST_TEST(w.x.pool().stats().used_bytes == used);
  ps::load_checkpoint_from_bytes(rt, file);
  BOOST_TEST(w.x.pool().stats().used_bytes == used);
  BOOST_TEST(w.b.device_bytes_in_use() == device);
  BOOST_TEST(rt.unswappable_bytes() > 0u);
  PIPESWAP_CHECK_NO_HAZARDS(w.b);
  w.train(rt, 2, 3);
}

BOOST_AUTO_TEST_CASE(every_wait_of_save_and_load_is_necessary) {
  // Nothing is swapped, so no offload orders the d2h stream after the updates and no prefetch
  // orders the updates after a load: only the checkpoint's own waits do.
  using ps::detail::wait_site;
  auto const mutate = [](wait_site w) { ps::detail::mutated_sites = 1u << static_cast<unsigned>(w); };
  bytes file;
  {
    adam_world w;
    rt_t rt(w.x, w.opt, no_swap());
    w.train(rt, 0, 2);
    file = ps::checkpoint_to_bytes(rt); // clean
    w.set_grads(2);                     // (synchronizes the host with the device)
    rt.step();
    mutate(wait_site::offload_after_compute);
    BOOST_CHECK_THROW((void)ps::checkpoint_to_bytes(rt), mock::hazard_error); // D2H before the update
    ps::detail::mutated_sites = 0;
    w.b.set_hazard_policy(mock::hazard_policy::ignore);
  }
  {
    adam_world w;
    rt_t rt(w.x, w.opt, no_swap());
    w.train(rt, 0, 1);
    ps::load_checkpoint_from_bytes(rt, file);
    rt.step(); // clean: the update waits the upload
    mutate(wait_site::use_after_load);
    ps::load_checkpoint_from_bytes(rt, file);
    ps::detail::mutated_sites = 0;
    BOOST_CHECK_THROW(rt.step(),
                      ps::step_error); // the update would read storage still being filled (a nested hazard_error)
    w.b.set_hazard_policy(mock::hazard_policy::ignore);
  }
}
