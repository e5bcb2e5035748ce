// Every host-side public header.
#pragma once
#include <pipeswap/pipeswap.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/schedule/json.hpp>

inline int odr_probe() {
  pipeswap::mock::backend b;
  auto d = b.allocate_device(16, b.current_stream());
  b.deallocate_device(d, 16, b.current_stream());
  return static_cast<int>(b.peak_device_bytes());
}
