// pipeswap — compile the swap runtime once per program, not once per translation unit.
//
// The library is header-only: every .cpp that calls optimizer_swap<O>::step() instantiates the
// runtime, the transfer engine, the pinned pool and the optimizer state over its backend, and the
// optimizer itself. These macros let a program do that work in one .cpp of its own:
//
//   PIPESWAP_EXTERN_OPTIMIZER_SWAP(O [, Partition])       in a header every user of the runtime
//   PIPESWAP_EXTERN_ADAM(B)                                includes: explicit instantiation
//                                                          declarations (`extern template`), so
//                                                          those TUs compile no member of them;
//   PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP(O [, Partition])  in exactly one .cpp: the matching
//   PIPESWAP_INSTANTIATE_ADAM(B)                           explicit instantiation definitions.
//
// O is the optimizer type (pipeswap::adamw<my_backend>, or a type of yours that models
// swap_optimizer), Partition the partition policy (default pipeswap::balanced_partition), B a
// backend whose adam_kernels<B> is defined where the ADAM macros expand. The swap macros cover
// optimizer_swap<O, Partition>, transfer_engine<B>, pinned_pool<B>, optimizer_state<B> and
// state_view<B> with B = O::backend_type; the ADAM macros cover adam<B> and adamw<B> (default
// kernel policy). Use the swap macros once per optimizer type and partition policy, and the pieces
// over B once per backend: with two optimizers over one backend, expand
// PIPESWAP_EXTERN_OPTIMIZER_SWAP for the first and PIPESWAP_EXTERN_OPTIMIZER_SWAP_ONLY for the
// others (and likewise for INSTANTIATE). A type argument with a comma in it needs an alias.
//
// Expand them at namespace scope, outside any namespace. Function templates, lambdas and inline
// functions that are not members of these classes are still compiled where they are used.
//
// g++ instantiates (though it does not compile) the inline members of an extern class template
// that a TU calls, and everything they reach. So the members a program calls (the constructors and
// destructors of optimizer_swap, transfer_engine and adam, adam::add_param, and optimizer_swap's
// step(), prefetch(), finish_offload(next_user) and synchronize_host_mirrors()) are defined out of
// their classes, not inline: with the extern declarations a TU that calls them instantiates none
// of the runtime behind them.
#pragma once

#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#include <pipeswap/swap/partition.hpp>

/// The runtime over O (and Partition, when given), without the backend's pieces.
#define PIPESWAP_EXTERN_OPTIMIZER_SWAP_ONLY(O, ...)                                                                    \
  extern template class pipeswap::optimizer_swap<O __VA_OPT__(, ) __VA_ARGS__>
#define PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP_ONLY(O, ...)                                                               \
  template class pipeswap::optimizer_swap<O __VA_OPT__(, ) __VA_ARGS__>

/// The pieces over a backend B that every runtime over B uses.
#define PIPESWAP_EXTERN_SWAP_BACKEND(B)                                                                                \
  extern template class pipeswap::transfer_engine<B>;                                                                  \
  extern template class pipeswap::pinned_pool<B>;                                                                      \
  extern template class pipeswap::optimizer_state<B>;                                                                  \
  extern template class pipeswap::state_view<B>
#define PIPESWAP_INSTANTIATE_SWAP_BACKEND(B)                                                                           \
  template class pipeswap::transfer_engine<B>;                                                                         \
  template class pipeswap::pinned_pool<B>;                                                                             \
  template class pipeswap::optimizer_state<B>;                                                                         \
  template class pipeswap::state_view<B>

/// The runtime over O and the pieces over O's backend.
#define PIPESWAP_EXTERN_OPTIMIZER_SWAP(O, ...)                                                                         \
  PIPESWAP_EXTERN_SWAP_BACKEND(typename O::backend_type);                                                              \
  PIPESWAP_EXTERN_OPTIMIZER_SWAP_ONLY(O __VA_OPT__(, ) __VA_ARGS__)
#define PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP(O, ...)                                                                    \
  PIPESWAP_INSTANTIATE_SWAP_BACKEND(typename O::backend_type);                                                         \
  PIPESWAP_INSTANTIATE_OPTIMIZER_SWAP_ONLY(O __VA_OPT__(, ) __VA_ARGS__)

/// Adam and AdamW over B with B's adam_kernels policy (<pipeswap/optim/adam.hpp> included first).
#define PIPESWAP_EXTERN_ADAM(B)                                                                                        \
  extern template class pipeswap::adam<B>;                                                                             \
  extern template class pipeswap::adamw<B>
#define PIPESWAP_INSTANTIATE_ADAM(B)                                                                                   \
  template class pipeswap::adam<B>;                                                                                    \
  template class pipeswap::adamw<B>
