// pipeswap — detail::lean_vector<T>: the runtime's bookkeeping vector.
//
// A contiguous growable array whose storage (allocation, growth, byte moves) is one non-template
// class, lean_storage, and whose iterators are plain pointers. What lean_vector<T> adds per element
// type is a handful of short members; for a trivially copyable T growth, copy, insert and erase are
// the storage's byte operations, for any other T they construct, move and destroy in place.
//
// Why not std::vector: it instantiates, per element type, its base and implementation classes, the
// allocator and allocator_traits, the relocation and destruction helpers, and __normal_iterator with
// its operators. At -O0 every one of those is a function the compiler emits; over the 20-odd element
// types of the runtime's headers they were the largest share of what a translation unit that swaps
// AdamW compiles (docs/compile-times.md).
//
// std::vector in its place costs the runtime TU more (measured in docs/compile-times.md, "Rules"), so
// it stays, held to std::vector's guarantees:
//   - Semantics are std::vector's for what is provided. T must be nothrow move-constructible (growth
//     relocates by move, so it never loses elements); its alignment is at most
//     __STDCPP_DEFAULT_NEW_ALIGNMENT__. There is no allocator parameter.
//   - Strong exception safety where std::vector has it: a constructor, growth, resize or insert that
//     throws destroys what it built and leaves the vector as it was.
//   - Sizes whose bytes overflow std::size_t throw std::length_error, as std::vector does.
//   - With PIPESWAP_ASSERTIONS (on whenever _GLIBCXX_ASSERTIONS is), operator[], front(), back(),
//     pop_back(), insert() and erase() check their index and abort with a message on a violation.
//   - Under AddressSanitizer the storage past size() is poisoned (container annotations), so reading
//     an element past the end is reported as a container-overflow, as with libstdc++'s vector.
// Not part of the public API: no public type or signature of the library holds one.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <pipeswap/config.hpp>
#include <pipeswap/detail/message.hpp>

#if defined(__SANITIZE_ADDRESS__)
#  define PIPESWAP_DETAIL_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define PIPESWAP_DETAIL_ASAN 1
#  endif
#endif
#ifndef PIPESWAP_DETAIL_ASAN
#  define PIPESWAP_DETAIL_ASAN 0
#endif
#if PIPESWAP_DETAIL_ASAN
#  include <sanitizer/common_interface_defs.h>
#endif

namespace pipeswap::detail {

/// A violated precondition of lean_vector under PIPESWAP_ASSERTIONS.
[[noreturn]] inline void lean_vector_violation(char const* what, std::size_t i, std::size_t n) noexcept {
  std::fprintf(stderr, "pipeswap: lean_vector::%s: index %zu with size %zu\n", what, i, n);
  std::abort();
}

#if PIPESWAP_ASSERTIONS
#  define PIPESWAP_DETAIL_LEAN_CHECK(ok, what, i, n)                                                                   \
    ((ok) ? void() : ::pipeswap::detail::lean_vector_violation(what, i, n))
#else
#  define PIPESWAP_DETAIL_LEAN_CHECK(ok, what, i, n) void()
#endif

/// The untyped storage of lean_vector: a buffer from operator new; `size_` and `capacity_` count
/// bytes. It never constructs or destroys elements: lean_vector<T> does, or, for a trivially
/// copyable T, lets the byte operations here stand for them.
class lean_storage {
protected:
  lean_storage() noexcept = default;
  lean_storage(lean_storage&& o) noexcept { swap_storage(o); }
  lean_storage(lean_storage const&) = delete;
  lean_storage& operator=(lean_storage const&) = delete;
  lean_storage& operator=(lean_storage&&) = delete;
  ~lean_storage() {
    annotate(size_, capacity_);
    ::operator delete(data_);
  }

  /// Tells AddressSanitizer that the bytes [0, new_mid) of the buffer hold elements and the rest up
  /// to the capacity does not (it was [0, old_mid)). A no-op without ASan.
  void annotate([[maybe_unused]] std::size_t old_mid, [[maybe_unused]] std::size_t new_mid) const noexcept {
#if PIPESWAP_DETAIL_ASAN
    if (data_ != nullptr && capacity_ != 0 && old_mid != new_mid) {
      __sanitizer_annotate_contiguous_container(data_, data_ + capacity_, data_ + old_mid, data_ + new_mid);
    }
#endif
  }

  /// The size becomes `bytes`. Growing: before the new elements are written; shrinking: after the
  /// removed ones were destroyed.
  void set_size(std::size_t bytes) noexcept {
    annotate(size_, bytes);
    size_ = bytes;
  }

  /// `n` elements of `elem` bytes, in bytes; throws std::length_error when that overflows.
  static std::size_t bytes_for(std::size_t n, std::size_t elem) {
    if (n > static_cast<std::size_t>(-1) / 2 / elem) throw std::length_error("lean_vector: size too large");
    return n * elem;
  }

  /// Exchanges buffers with `o` (sizes and capacities included).
  void swap_storage(lean_storage& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }

  /// The capacity, in bytes, for holding at least `bytes`: at least double the current one, so
  /// appending is amortised O(1).
  [[nodiscard]] std::size_t grown_capacity(std::size_t bytes) const noexcept {
    std::size_t const doubled = capacity_ > static_cast<std::size_t>(-1) / 4 ? bytes : capacity_ * 2;
    return doubled > bytes ? doubled : bytes;
  }

  /// Trivially copyable elements: makes room for at least `bytes`, keeping the contents. On
  /// bad_alloc nothing changes.
  void reserve_bytes(std::size_t bytes) {
    if (bytes <= capacity_) return;
    std::size_t const cap = grown_capacity(bytes);
    auto* fresh = static_cast<std::byte*>(::operator new(cap));
    if (size_ != 0) std::memcpy(fresh, data_, size_);
    adopt(fresh, cap);
  }

  /// Replaces the buffer with `fresh` of `cap` bytes (the elements were already moved there).
  void adopt(std::byte* fresh, std::size_t cap) noexcept {
    annotate(size_, capacity_);
    ::operator delete(data_);
    data_ = fresh;
    capacity_ = cap;
    annotate(capacity_, size_);
  }

  /// Trivially copyable elements: resizes to `bytes`; each new element is a copy of the `elem`
  /// bytes at `fill`.
  void resize_bytes(std::size_t bytes, void const* fill, std::size_t elem) {
    auto const old = size_;
    if (bytes > old) reserve_bytes(bytes);
    set_size(bytes);
    for (std::size_t at = old; at < bytes; at += elem) std::memcpy(data_ + at, fill, elem);
  }

  /// Trivially copyable elements: opens a gap of `gap` bytes at byte `at` and returns its address.
  std::byte* open_gap(std::size_t at, std::size_t gap) {
    reserve_bytes(size_ + gap);
    auto const old = size_;
    set_size(old + gap);
    if (at != old) std::memmove(data_ + at + gap, data_ + at, old - at);
    return data_ + at;
  }

  /// Trivially copyable elements: removes bytes [first, last).
  void close_gap(std::size_t first, std::size_t last) noexcept {
    if (last != size_) std::memmove(data_ + first, data_ + last, size_ - last);
    set_size(size_ - (last - first));
  }

  /// Trivially copyable elements: appends `bytes` bytes from `src`, which may not point into this
  /// storage.
  void append_bytes(void const* src, std::size_t bytes) {
    reserve_bytes(size_ + bytes);
    auto const old = size_;
    set_size(old + bytes);
    if (bytes != 0) std::memcpy(data_ + old, src, bytes);
  }

  [[noreturn]] static void throw_index(std::size_t i, std::size_t n) {
    throw std::out_of_range(message({"lean_vector::at: index ", i, " is not below the size ", n}));
  }

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

/// A std::vector-like array (see the header comment).
template <class T>
class lean_vector : lean_storage {
  static_assert(std::is_nothrow_move_constructible_v<T> && std::is_nothrow_destructible_v<T>,
                "lean_vector relocates its elements by move: T must be nothrow move-constructible");
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "lean_vector: over-aligned element type");
  static constexpr bool trivial = std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>;

public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = T const&;
  using pointer = T*;
  using const_pointer = T const*;
  using iterator = T*;
  using const_iterator = T const*;

  lean_vector() noexcept = default;
  explicit lean_vector(size_type n) { resize(n); }
  lean_vector(size_type n, T const& value) { resize(n, value); }
  // A constructor that throws destroys the elements it built (its storage is freed by
  // lean_storage's destructor, which runs for the constructed base).
  lean_vector(std::initializer_list<T> il) {
    try {
      append(il.begin(), il.end());
    } catch (...) {
      clear();
      throw;
    }
  }
  template <std::input_iterator It>
  lean_vector(It first, It last) {
    try {
      for (; first != last; ++first) emplace_back(*first);
    } catch (...) {
      clear();
      throw;
    }
  }
  lean_vector(lean_vector const& o) requires std::is_copy_constructible_v<T> : lean_storage() {
    try {
      append(o.begin(), o.end());
    } catch (...) {
      clear();
      throw;
    }
  }
  lean_vector(lean_vector&& o) noexcept = default;
  lean_vector& operator=(lean_vector const& o) requires std::is_copy_constructible_v<T> {
    if (this != &o) {
      lean_vector copy(o);
      swap_storage(copy);
    }
    return *this;
  }
  lean_vector& operator=(lean_vector&& o) noexcept {
    if (this != &o) {
      clear();
      swap_storage(o);
    }
    return *this;
  }
  ~lean_vector() { clear(); }

  T* data() noexcept { return reinterpret_cast<T*>(data_); }
  T const* data() const noexcept { return reinterpret_cast<T const*>(data_); }
  size_type size() const noexcept { return size_ / sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  size_type capacity() const noexcept { return capacity_ / sizeof(T); }

  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size(); }
  T const* begin() const noexcept { return data(); }
  T const* end() const noexcept { return data() + size(); }

  T& operator[](size_type i) noexcept {
    PIPESWAP_DETAIL_LEAN_CHECK(i < size(), "operator[]", i, size());
    return data()[i];
  }
  T const& operator[](size_type i) const noexcept {
    PIPESWAP_DETAIL_LEAN_CHECK(i < size(), "operator[]", i, size());
    return data()[i];
  }
  T& at(size_type i) {
    if (i >= size()) throw_index(i, size());
    return data()[i];
  }
  T const& at(size_type i) const {
    if (i >= size()) throw_index(i, size());
    return data()[i];
  }
  T& front() noexcept { return (*this)[0]; }
  T const& front() const noexcept { return (*this)[0]; }
  T& back() noexcept { return (*this)[size() - 1]; }
  T const& back() const noexcept { return (*this)[size() - 1]; }

  void reserve(size_type n) {
    auto const bytes = bytes_for(n, sizeof(T));
    if constexpr (trivial) {
      reserve_bytes(bytes);
    } else if (bytes > capacity_) {
      relocate(static_cast<std::byte*>(::operator new(bytes)), bytes);
    }
  }

  void clear() noexcept {
    if constexpr (!trivial) {
      for (auto& e : *this) e.~T();
    }
    set_size(0);
  }

  /// New elements are value-initialised.
  void resize(size_type n) {
    if constexpr (trivial) {
      T const zero{};
      resize_bytes(bytes_for(n, sizeof(T)), &zero, sizeof(T));
    } else {
      grow_to(n, [](void* at) { ::new (at) T(); });
    }
  }
  /// Trivially copyable T only: as resize(n), but new elements are left uninitialised (each must be
  /// written before it is read), as std::make_unique_for_overwrite leaves them. Shrinking is free.
  void resize_for_overwrite(size_type n) requires trivial {
    auto const bytes = bytes_for(n, sizeof(T));
    reserve_bytes(bytes);
    set_size(bytes);
  }
  void resize(size_type n, T const& value) {
    T const copy = value; // `value` may live in this vector
    if constexpr (trivial) {
      resize_bytes(bytes_for(n, sizeof(T)), &copy, sizeof(T));
    } else {
      grow_to(n, [&](void* at) { ::new (at) T(copy); });
    }
  }
  void assign(size_type n, T const& value) {
    T const copy = value;
    clear();
    resize(n, copy);
  }
  /// Replaces the contents with [first, last), which may not point into this vector.
  void assign(T const* first, T const* last) {
    clear();
    append(first, last);
  }

  void push_back(T const& value) { emplace_back(value); }
  void push_back(T&& value) { emplace_back(std::move(value)); }
  template <class... A>
  T& emplace_back(A&&... a) {
    if constexpr (trivial) {
      T const value = make(std::forward<A>(a)...); // before growing: `a` may refer into this vector
      append_bytes(&value, sizeof(T));
    } else if (size_ + sizeof(T) <= capacity_) {
      auto const old = size_;
      set_size(old + sizeof(T));
      try {
        ::new (static_cast<void*>(data_ + old)) T(make(std::forward<A>(a)...));
      } catch (...) {
        set_size(old);
        throw;
      }
    } else {
      // Construct the new element in the new buffer first (`a` may refer into this one), then move
      // the old elements over; a throwing constructor leaves this vector as it was.
      auto const cap = grown_capacity(bytes_for(size() + 1, sizeof(T)));
      auto* fresh = static_cast<std::byte*>(::operator new(cap));
      try {
        ::new (static_cast<void*>(fresh + size_)) T(make(std::forward<A>(a)...));
      } catch (...) {
        ::operator delete(fresh);
        throw;
      }
      relocate(fresh, cap);
      set_size(size_ + sizeof(T));
    }
    return back();
  }
  void pop_back() noexcept {
    PIPESWAP_DETAIL_LEAN_CHECK(!empty(), "pop_back", 0, 0);
    if constexpr (!trivial) back().~T();
    set_size(size_ - sizeof(T));
  }

  T* insert(T const* pos, T const& value) {
    auto const i = static_cast<size_type>(pos - begin());
    PIPESWAP_DETAIL_LEAN_CHECK(i <= size(), "insert", i, size());
    if constexpr (trivial) {
      T const copy = value;
      auto* at = open_gap(i * sizeof(T), sizeof(T));
      std::memcpy(at, &copy, sizeof(T));
    } else {
      emplace_back(value);
      for (auto k = size() - 1; k > i; --k) std::swap(data()[k], data()[k - 1]);
    }
    return begin() + i;
  }
  T* erase(T const* pos) noexcept { return erase(pos, pos + 1); }
  T* erase(T const* first, T const* last) noexcept {
    auto const i = static_cast<size_type>(first - begin());
    auto const j = static_cast<size_type>(last - begin());
    PIPESWAP_DETAIL_LEAN_CHECK(i <= j && j <= size(), "erase", j, size());
    if constexpr (trivial) {
      close_gap(i * sizeof(T), j * sizeof(T));
    } else if (i != j) {
      static_assert(std::is_nothrow_move_assignable_v<T>, "lean_vector::erase moves elements down");
      auto const n = size();
      for (auto k = j; k < n; ++k) data()[k - (j - i)] = std::move(data()[k]);
      while (size() > n - (j - i)) pop_back();
    }
    return begin() + i;
  }

  friend bool operator==(lean_vector const& a, lean_vector const& b) {
    if (a.size() != b.size()) return false;
    for (size_type i = 0; i < a.size(); ++i) {
      if (!(a[i] == b[i])) return false;
    }
    return true;
  }

private:
  /// The element that emplace_back(a...) appends: constructed from the arguments, or, for an
  /// aggregate, brace-initialised from them.
  template <class... A>
  static T make(A&&... a) {
    if constexpr (std::is_constructible_v<T, A&&...>)
      return T(std::forward<A>(a)...);
    else
      return T{std::forward<A>(a)...};
  }

  /// Copies [first, last) onto the end; `first` may not point into this vector.
  void append(T const* first, T const* last) {
    if constexpr (trivial) {
      append_bytes(first, static_cast<std::size_t>(last - first) * sizeof(T));
    } else {
      reserve(size() + static_cast<size_type>(last - first));
      for (; first != last; ++first) emplace_back(*first);
    }
  }

  /// Moves the elements into `fresh` (`cap` bytes) and frees the old buffer.
  void relocate(std::byte* fresh, std::size_t cap) noexcept {
    auto* to = reinterpret_cast<T*>(fresh);
    for (auto& e : *this) {
      ::new (static_cast<void*>(to++)) T(std::move(e));
      e.~T();
    }
    adopt(fresh, cap);
  }

  /// Non-trivial T: resizes to n, constructing each new element with `construct(address)`. If one
  /// throws, the elements constructed so far are destroyed and the size is unchanged.
  template <class Construct>
  void grow_to(size_type n, Construct construct) {
    auto const old = size();
    if (n <= old) {
      while (size() > n) pop_back();
      return;
    }
    reserve(n);
    for (auto k = old; k < n; ++k) {
      set_size(size_ + sizeof(T));
      try {
        construct(static_cast<void*>(data_ + k * sizeof(T)));
      } catch (...) {
        set_size(size_ - sizeof(T));
        while (size() > old) pop_back();
        throw;
      }
    }
  }
};

} // namespace pipeswap::detail
