// pipeswap — a counted reference for objects shared within one thread (internal).
#pragma once

#include <cstddef>
#include <utility>

namespace pipeswap::detail {

/// Shared ownership of a T by a plain (non-atomic) count kept beside it. For objects shared only
/// among the parts of one runtime, which one host thread uses at a time (docs/guarantees.md); not
/// std::shared_ptr, whose atomic counts, weak count and control block that use does not need
/// (docs/compile-times.md, "Rules"). make() builds the object; get_mut() lets its builder fill it
/// in before it is shared.
template <class T>
class counted_ref {
public:
  counted_ref() noexcept = default;
  template <class... Args>
  [[nodiscard]] static counted_ref make(Args&&... args) {
    counted_ref r;
    r.n_ = new node{T(std::forward<Args>(args)...), 1};
    return r;
  }
  counted_ref(counted_ref const& o) noexcept : n_(o.n_) {
    if (n_) ++n_->refs;
  }
  counted_ref& operator=(counted_ref const& o) noexcept {
    counted_ref copy(o);
    std::swap(n_, copy.n_);
    return *this;
  }
  ~counted_ref() { reset(); }

  void reset() noexcept {
    if (n_ && --n_->refs == 0) delete n_;
    n_ = nullptr;
  }
  [[nodiscard]] T const* get() const noexcept { return n_ ? &n_->value : nullptr; }
  /// The object, writable: for the code that built it, before anything else holds it.
  [[nodiscard]] T* get_mut() noexcept { return n_ ? &n_->value : nullptr; }
  T const& operator*() const noexcept { return n_->value; }
  T const* operator->() const noexcept { return &n_->value; }
  explicit operator bool() const noexcept { return n_ != nullptr; }
  friend bool operator==(counted_ref const& a, counted_ref const& b) noexcept { return a.n_ == b.n_; }

private:
  struct node {
    T value;
    std::size_t refs;
  };
  node* n_ = nullptr;
};

} // namespace pipeswap::detail
