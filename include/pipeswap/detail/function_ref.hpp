// pipeswap — a non-owning reference to a callable (internal).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace pipeswap::detail {

template <class Signature>
class function_ref;

/// Calls a callable it does not own: one pointer to the object, one to a function that calls it.
/// The callable must outlive every call. The one way the runtimes pass a callback down (the
/// pipelines' batch update, the attachment's slot initializer, state_view's address lookup): no
/// std::function (an allocation and a larger instantiation), no hand-written void* trampolines.
template <class R, class... Args>
class function_ref<R(Args...)> {
public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, function_ref> && std::is_invocable_r_v<R, F&, Args...>)
      function_ref(F&& f)
  noexcept // NOLINT(google-explicit-constructor): a callable converts, like std::function
      : object_(const_cast<void*>(static_cast<void const*>(std::addressof(f)))), call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

private:
  void* object_;
  R (*call_)(void*, Args...);
};

} // namespace pipeswap::detail
