// pipeswap — the mock backend's allocations by address (internal): which device or pinned allocation
// holds a pointer, and the errors that name the call when none does.
//
// Device allocations stay listed after their release (a later use is a use-after-release report,
// not an unknown pointer). Device addresses only grow, so both device lists are vectors sorted by
// base address: every allocation, and a short one of the live ones (which the kernels' regions and
// copies name) searched first; released entries leave the short list in batches, and one still
// there names its own released allocation, as the full list would.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock/detail/storage.hpp>
#include <pipeswap/backend/mock/hazard.hpp>

namespace pipeswap::mock::detail {

/// Which call (and part of it) an error names: the parts, joined only when an error is thrown.
struct call_site {
  std::string_view head, name = {}, tail = {};
  call_site(char const* h) : head(h) {} // implicit: a plain call name
  call_site(std::string_view h, std::string_view n, std::string_view t = {}) : head(h), name(n), tail(t) {}
  [[nodiscard]] std::string text() const {
    std::string out(head);
    return out.append(name).append(tail);
  }
};

inline std::string describe_ptr(device_ptr d) {
  std::ostringstream os;
  os << "device address 0x" << std::hex << d.address();
  return os.str();
}

/// The offset of [addr, addr + n) in `a`; mock_error naming `what` if the bytes exceed it.
inline std::size_t range_in(allocation const& a, std::uintptr_t addr, std::size_t n, call_site const& what) {
  auto const off = static_cast<std::size_t>(addr - a.base);
  if (off + n > a.size) {
    throw mock_error(
        pipeswap::detail::message({"mock::backend::", what.text(), ": bytes [", off, ", ", off + n, ") exceed ",
                                   (a.device ? "device" : "pinned"), " allocation #", a.id, " of ", a.size, " bytes"}));
  }
  return off;
}

class allocation_table {
public:
  /// A new device allocation: its base is above every earlier one's.
  void add_device(alloc_ptr a) {
    entry const e{a->base, a->base + a->size, device_.size()};
    device_.push_back(std::move(a));
    ranges_.push_back(e);
    live_device_.push_back(e);
    slot_of(e.base) = e; // most lookups name the base of an allocation made not long before
  }
  /// After a device allocation was marked released.
  void device_released() {
    if (++released_in_live_ > live_device_.size() / 2) {
      std::erase_if(live_device_, [this](entry const& e) { return device_[e.index]->released; });
      released_in_live_ = 0;
    }
  }
  void add_host(alloc_ptr const& a) { host_.emplace(a->base, a); }
  void erase_host(std::uintptr_t base) { host_.erase(base); }

  /// The device allocation holding `d` (live or released); mock_error naming `what` if none.
  [[nodiscard]] alloc_ptr find_device(device_ptr d, call_site const& what) const { return find_device_ref(d, what); }
  /// The same, as a reference into the table (valid until the next add_device).
  [[nodiscard]] alloc_ptr const& find_device_ref(device_ptr d, call_site const& what) const {
    auto const addr = d.address();
    // Device ranges never overlap and are never reused: an allocation found before for the same
    // address slot, if it holds the address, is the one the lists would find.
    // The entries hold each allocation's range: a lookup reads the allocation itself only once found.
    // They name the allocation by its index: a miss copies no shared pointer.
    auto& hit = slot_of(addr);
    if (addr >= hit.base && addr < hit.end) return device_[hit.index];
    for (auto const* list : {&live_device_, &ranges_}) {
      auto const it = find_in(*list, addr);
      if (it != list->end() && addr < it->end) {
        hit = *it;
        return device_[hit.index];
      }
    }
    throw mock_error("mock::backend::" + what.text() + ": " + describe_ptr(d) +
                     " is not device memory allocated by this backend");
  }

  /// The pinned allocation (not released) holding `h`, as a reference into the table (valid until
  /// the next add_host or erase_host); mock_error naming `what` if none.
  [[nodiscard]] alloc_ptr const& find_host(std::byte const* h, call_site const& what) const {
    auto const addr = reinterpret_cast<std::uintptr_t>(h);
    auto it = host_.upper_bound(addr);
    if (it != host_.begin()) {
      --it;
      if (addr < it->second->base + it->second->size) return it->second;
    }
    throw mock_error("mock::backend::" + what.text() +
                     ": the host pointer is not pinned memory allocated by this backend (pageable "
                     "memory would make the copy synchronous)");
  }

  /// Calls `f(allocation&)` for every device allocation and every pinned one not released.
  template <class F>
  void for_each(F&& f) const {
    for (auto const& a : device_) f(*a);
    for (auto const& e : host_) f(*e.second);
  }

private:
  /// A device allocation's address range [base, end) (an empty range: no allocation) and its index
  /// in device_.
  struct entry {
    std::uintptr_t base = 0, end = 0;
    std::size_t index = 0;
  };
  using alloc_list = std::vector<entry>;
  /// The cache slot of the lookups of `addr`.
  [[nodiscard]] entry& slot_of(std::uintptr_t addr) const {
    return recent_[(addr / allocation_alignment) % recent_.size()];
  }
  /// The entry of `list` (sorted by base address) with the highest base at or below `addr`, or end.
  static alloc_list::const_iterator find_in(alloc_list const& list, std::uintptr_t addr) {
    auto it =
        std::upper_bound(list.begin(), list.end(), addr, [](std::uintptr_t x, entry const& e) { return x < e.base; });
    return it == list.begin() ? list.end() : std::prev(it);
  }

  std::vector<alloc_ptr> device_;    ///< every device allocation, by base address
  alloc_list ranges_;                ///< the ranges of device_, in its order
  alloc_list live_device_;           ///< those not released (and a few released), by base address
  std::size_t released_in_live_ = 0; ///< releases since live_device_ was last pruned
  /// Device allocations found before, by address slot (a direct-mapped cache of the lookups).
  mutable std::array<entry, 512> recent_{};
  std::map<std::uintptr_t, alloc_ptr> host_;
};

} // namespace pipeswap::mock::detail
