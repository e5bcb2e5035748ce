// pipeswap — what a mock kernel's body sees: typed views of exactly the regions its launch declared.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock {

class backend;

/// What a kernel body sees: typed views of the regions its launch declared. Asking for bytes outside
/// the declared regions throws mock_error (the launch must declare everything it touches).
class kernel_context {
public:
  template <class T>
  [[nodiscard]] std::span<T const> read(device_ptr p, std::size_t count) const {
    static_assert(std::is_trivially_copyable_v<T>);
    return {reinterpret_cast<T const*>(bytes(p, count * sizeof(T), false)), count};
  }
  template <class T>
  [[nodiscard]] std::span<T> write(device_ptr p, std::size_t count) const {
    static_assert(std::is_trivially_copyable_v<T>);
    return {reinterpret_cast<T*>(bytes(p, count * sizeof(T), true)), count};
  }

private:
  friend class backend;
  struct bound {
    device_ptr ptr;
    std::size_t bytes;
    bool writable;
    std::byte* data;
  };
  std::byte* bytes(device_ptr p, std::size_t n, bool writable) const;
  std::string name_;
  std::vector<bound> regions_;
};

inline std::byte* kernel_context::bytes(device_ptr p, std::size_t n, bool writable) const {
  if (n == 0) return nullptr;
  for (auto const& r : regions_) {
    if (p.address() >= r.ptr.address() && p.address() + n <= r.ptr.address() + r.bytes) {
      if (writable && !r.writable) {
        throw mock_error("mock kernel '" + name_ + "' writes bytes it declared as read-only");
      }
      return r.data + (p.address() - r.ptr.address());
    }
  }
  throw mock_error(pipeswap::detail::message(
      {"mock kernel '", name_, "' touches ", n, " bytes outside the regions its launch declared"}));
}

} // namespace pipeswap::mock
