// A small command around optimizer checkpoints, driven by python_check.py to compare pipeswap's files
// with what the Python `safetensors` package reads and writes.
//
//   checkpoint_tool write DIR
//       trains the test worlds two steps and writes DIR/adam.safetensors (AdamW, amsgrad, bf16
//       parameters with fp32 masters, some state left on the device) and DIR/momentum.safetensors
//       (bf16 momentum state), each with DIR/NAME.json: {"metadata": {...}, "tensors": {name:
//       {"dtype", "shape", "hex", "values"}}} read from the runtime's state, not from the file.
//   checkpoint_tool reload adam|momentum IN OUT
//       loads IN into a fresh world of that kind and saves it again to OUT.
//
// Exit status: 0 done, 2 the file was rejected (message on stderr), 1 anything else.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include <pipeswap/swap/checkpoint.hpp>

#include "checkpoint/checkpoint_world.hpp"

namespace ps = pipeswap;
using nlohmann::json;

namespace {

std::string to_hex(std::span<std::byte const> b) {
  static char const* digits = "0123456789abcdef";
  std::string s;
  for (auto x : b) {
    auto const v = static_cast<unsigned>(x);
    s += digits[v >> 4];
    s += digits[v & 15];
  }
  return s;
}

json values(ps::dtype t, std::span<std::byte const> b) {
  json out = json::array();
  if (t == ps::dtype::bf16) {
    for (std::size_t i = 0; i + 1 < b.size(); i += 2) {
      ps::bf16 h;
      std::memcpy(&h, b.data() + i, 2);
      out.push_back(static_cast<double>(ps::to_float(h)));
    }
  } else if (t == ps::dtype::f32) {
    for (std::size_t i = 0; i + 3 < b.size(); i += 4) {
      float f;
      std::memcpy(&f, b.data() + i, 4);
      out.push_back(static_cast<double>(f));
    }
  }
  return out;
}

template <class World, class Runtime>
void describe(World& w, Runtime& rt, std::filesystem::path const& json_path) {
  json j;
  j["metadata"] = json::object();
  for (auto const& [k, v] : rt.optimizer().metadata()) j["metadata"][k] = v;
  j["metadata"]["pipeswap.format"] = ps::checkpoint_format_name;
  j["metadata"]["pipeswap.format_version"] = ps::checkpoint_version;
  auto const state = ps::test::state_bytes(rt, w.b);
  auto const slots = rt.optimizer().slots();
  j["tensors"] = json::object();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    auto const& s = slots[i];
    j["tensors"][ps::checkpoint_tensor_name(s.param, s.key)] = {{"dtype", std::string(ps::name_of(s.type))},
                                                                {"shape", json::array({s.numel})},
                                                                {"hex", to_hex(state[i])},
                                                                {"values", values(s.type, state[i])}};
  }
  std::ofstream(json_path) << j.dump(1);
}

int write(std::filesystem::path const& dir) {
  std::filesystem::create_directories(dir);
  {
    ps::test::adam_world w;
    ps::optimizer_swap<ps::test::adam_world::opt_t> rt(w.x, w.opt, ps::test::checkpoint_swap(true));
    w.train(rt, 0, 2);
    ps::save_checkpoint(rt, dir / "adam.safetensors");
    describe(w, rt, dir / "adam.json");
  }
  {
    ps::test::momentum_world w;
    ps::optimizer_swap<ps::test::momentum_bf16> rt(w.x, w.opt, ps::test::checkpoint_swap(false));
    w.train(rt, 0, 2);
    ps::save_checkpoint(rt, dir / "momentum.safetensors");
    describe(w, rt, dir / "momentum.json");
  }
  return 0;
}

int reload(std::string const& kind, std::filesystem::path const& in, std::filesystem::path const& out) {
  if (kind == "adam") {
    ps::test::adam_world w;
    ps::optimizer_swap<ps::test::adam_world::opt_t> rt(w.x, w.opt, ps::test::checkpoint_swap(false, 2, 0));
    ps::load_checkpoint(rt, in);
    ps::save_checkpoint(rt, out);
  } else if (kind == "momentum") {
    ps::test::momentum_world w;
    ps::optimizer_swap<ps::test::momentum_bf16> rt(w.x, w.opt, ps::test::checkpoint_swap(true, 2, 0));
    ps::load_checkpoint(rt, in);
    ps::save_checkpoint(rt, out);
  } else {
    std::cerr << "unknown kind " << kind << "\n";
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    std::string const cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 3) return write(argv[2]);
    if (cmd == "reload" && argc == 5) return reload(argv[2], argv[3], argv[4]);
    std::cerr << "usage: checkpoint_tool write DIR | reload adam|momentum IN OUT\n";
    return 1;
  } catch (ps::invalid_argument const& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (std::exception const& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
