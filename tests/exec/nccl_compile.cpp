// nccl_comm compiles against the NCCL and CUDA headers found at configure time and models the Comm
// concept (its header static_asserts it). Running it needs GPUs: this file only compiles it.
#include <pipeswap/exec/nccl_comm.hpp>

#if !PIPESWAP_HAS_NCCL
#  error "built only when nccl.h and the CUDA Toolkit are found"
#endif

static_assert(pipeswap::exec::nccl_comm::reads_device_memory);
