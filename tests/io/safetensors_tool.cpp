// A small command around the file layer, driven by python_crosscheck.py to compare pipeswap with
// the reference implementation in both directions.
//
//   safetensors_tool write SPEC.json OUT      writes OUT with save_file from a JSON spec:
//       {"metadata": {"k": "v"}, "tensors": [{"name", "dtype", "shape", "hex"}]}
//   safetensors_tool dump FILE [mmap|read]   validates FILE and prints it as JSON:
//       {"header_size", "data_size", "total_size", "metadata", "tensors": [{"name", "dtype",
//        "shape", "data_offsets", "hex"}]} (tensors in file order)
//
// Exit status: 0 done, 2 the file was rejected (format_error; message on stderr), 1 anything else.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <pipeswap/io/safetensors.hpp>

namespace io = pipeswap::io;
using nlohmann::json;

namespace {

std::string to_hex(std::span<std::byte const> b) {
  static char const* digits = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (auto x : b) {
    auto const v = static_cast<unsigned>(x);
    s += digits[v >> 4];
    s += digits[v & 15];
  }
  return s;
}

std::vector<std::byte> from_hex(std::string const& s) {
  if (s.size() % 2 != 0) throw std::runtime_error("odd hex length");
  std::vector<std::byte> out(s.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

int write(char const* spec_path, char const* out_path) {
  std::ifstream in(spec_path);
  json const spec = json::parse(in);
  std::vector<std::vector<std::byte>> storage;
  std::vector<io::tensor_source> tensors;
  for (auto const& t : spec.at("tensors")) {
    storage.push_back(from_hex(t.at("hex").get<std::string>()));
    io::tensor_source s;
    s.name = t.at("name").get<std::string>();
    if (!pipeswap::parse_dtype(t.at("dtype").get<std::string>(), s.type)) {
      throw std::runtime_error("bad dtype in spec");
    }
    s.shape = t.at("shape").get<std::vector<std::uint64_t>>();
    tensors.push_back(std::move(s));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].bytes = storage[i];
  io::metadata_map metadata;
  if (spec.contains("metadata")) {
    for (auto const& [k, v] : spec.at("metadata").items()) metadata.emplace(k, v.get<std::string>());
  }
  io::save_file(out_path, tensors, metadata);
  return 0;
}

int dump(char const* path, std::string const& mode) {
  io::open_options o;
  o.mode = mode == "read" ? io::load_mode::read : io::load_mode::mmap;
  auto const f = io::safetensors_file::open(path, o);
  json out;
  out["header_size"] = f.header_size();
  out["data_size"] = f.data_size();
  out["total_size"] = f.total_size();
  out["metadata"] = json::object();
  for (auto const& [k, v] : f.metadata()) out["metadata"][k] = v;
  out["tensors"] = json::array();
  for (auto const& t : f.tensors()) {
    out["tensors"].push_back({{"name", t.name},
                              {"dtype", std::string(pipeswap::name_of(t.type))},
                              {"shape", t.shape},
                              {"data_offsets", {t.begin, t.end}},
                              {"hex", to_hex(t.bytes)}});
  }
  std::cout << out.dump() << '\n';
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  std::string const cmd = argc > 1 ? argv[1] : "";
  try {
    if (cmd == "write" && argc == 4) return write(argv[2], argv[3]);
    if (cmd == "dump" && (argc == 3 || argc == 4)) return dump(argv[2], argc == 4 ? argv[3] : "mmap");
    std::fprintf(stderr, "usage: %s write SPEC.json OUT | dump FILE [mmap|read]\n", argv[0]);
    return 1;
  } catch (io::format_error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
