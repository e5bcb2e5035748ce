// Configure-time probe: clang++ finds nlohmann-json and can link a libFuzzer program with ASan and
// UBSan. If this does not build, the fuzz test is skipped with the compiler's message.
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const*, std::size_t) { return 0; }
