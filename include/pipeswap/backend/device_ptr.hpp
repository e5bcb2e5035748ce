// pipeswap — a strongly typed device address.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

#include <pipeswap/config.hpp>

namespace pipeswap {

/// An address in device memory. It is deliberately not convertible to a host pointer, so host code
/// cannot dereference device memory by accident; backends whose device addresses are host-visible
/// numbers (CUDA) recover the raw pointer with get(). Offsetting is in bytes.
class device_ptr {
public:
  constexpr device_ptr() noexcept = default;
  constexpr explicit device_ptr(std::uintptr_t address) noexcept : address_(address) {}
  explicit device_ptr(void const* p) noexcept : address_(reinterpret_cast<std::uintptr_t>(p)) {}

  [[nodiscard]] constexpr std::uintptr_t address() const noexcept { return address_; }
  template <class T = void>
  [[nodiscard]] T* get() const noexcept {
    return reinterpret_cast<T*>(address_);
  }

  constexpr explicit operator bool() const noexcept { return address_ != 0; }

  friend constexpr device_ptr operator+(device_ptr p, std::size_t bytes) noexcept {
    return device_ptr(p.address_ + bytes);
  }
  friend constexpr auto operator<=>(device_ptr, device_ptr) noexcept = default;

private:
  std::uintptr_t address_ = 0;
};

} // namespace pipeswap
