// Loading the PyTorch reference vectors in tests/optim/data/ (written by gen_torch_vectors.py).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef PIPESWAP_OPTIM_DATA_DIR
#  error "define PIPESWAP_OPTIM_DATA_DIR to the tests/optim/data folder"
#endif

namespace pipeswap::test {

struct dataset {
  std::string name; // file stem, e.g. torch-2.15.0-default
  nlohmann::json json;
};

/// Every *.json under the data folder, sorted by name. Throws when the folder holds none.
inline std::vector<dataset> load_datasets() {
  std::vector<dataset> out;
  for (auto const& e : std::filesystem::directory_iterator(PIPESWAP_OPTIM_DATA_DIR)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    out.push_back({e.path().stem().string(), nlohmann::json::parse(in)});
  }
  if (out.empty()) throw std::runtime_error("no reference vectors in " PIPESWAP_OPTIM_DATA_DIR);
  std::sort(out.begin(), out.end(), [](auto const& a, auto const& b) { return a.name < b.name; });
  return out;
}

/// Splits a string of fixed-width hex words (8 digits for uint32, 4 for uint16) into values.
template <class U>
std::vector<U> hex_words(std::string_view s) {
  constexpr std::size_t w = sizeof(U) * 2;
  if (s.size() % w != 0) throw std::runtime_error("hex string length is not a multiple of the word");
  std::vector<U> out;
  for (std::size_t i = 0; i < s.size(); i += w)
    out.push_back(static_cast<U>(std::stoul(std::string(s.substr(i, w)), nullptr, 16)));
  return out;
}

} // namespace pipeswap::test
