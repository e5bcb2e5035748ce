// The backend-generic runtimes compile over the CUDA backend: every member of each class template is
// instantiated here, so a runtime that relies on something the concept does not promise (a default-
// constructible stream handle, a mock-only call) fails this build, not a user's.
#include <pipeswap/activation/activation_swap.hpp>
#include <pipeswap/backend/cuda.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>

template struct pipeswap::swap_buffer<pipeswap::cuda::backend>;
template class pipeswap::pinned_pool<pipeswap::cuda::backend>;
template class pipeswap::transfer_engine<pipeswap::cuda::backend>;
template class pipeswap::activation_swap<pipeswap::cuda::backend>;
