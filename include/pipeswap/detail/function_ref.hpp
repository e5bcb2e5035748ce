// pipeswap — a non-owning reference to a callable (internal).
#pragma once

#include <type_traits>
#include <utility>

namespace pipeswap::detail {

template <class Signature>
class function_ref;

/// F is not (a cv-ref variant of) Self: keeps function_ref's converting constructor off its copies.
template <class F, class Self>
concept other_than = !std::is_same_v<std::remove_cvref_t<F>, Self>;

/// Calls a callable it does not own: one pointer to the object, one to a function that calls it.
/// The callable must outlive every call. The one way the runtimes pass a callback down (the
/// pipelines' batch update, the attachment's slot initializer, state_view's address lookup): no
/// std::function (an allocation and a larger instantiation), no hand-written void* trampolines.
template <class R, class... Args>
class function_ref<R(Args...)> {
public:
  /// From any callable (converts implicitly, like std::function).
  template <other_than<function_ref> F>
  function_ref(F&& f) noexcept
      : object_(const_cast<void*>(static_cast<void const*>(__builtin_addressof(f)))),
        call_(&call<std::remove_reference_t<F>>) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

private:
  template <class F>
  static R call(void* o, Args... args) {
    return (*static_cast<F*>(o))(std::forward<Args>(args)...);
  }

  void* object_;
  R (*call_)(void*, Args...);
};

} // namespace pipeswap::detail
