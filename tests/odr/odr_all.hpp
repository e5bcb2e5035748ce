// Every host-side public header.
#pragma once
#include <pipeswap/pipeswap.hpp>
#include <pipeswap/sim.hpp>
#include <pipeswap/io/safetensors.hpp>
#include <pipeswap/swap/checkpoint.hpp>

inline int odr_probe() {
  pipeswap::mock::backend b;
  auto d = b.allocate_device(16, b.current_stream());
  b.deallocate_device(d, 16, b.current_stream());
  return static_cast<int>(b.peak_device_bytes());
}
