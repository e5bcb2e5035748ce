// pipeswap — the mock backend: a deterministic, hazard-checking simulator of one accelerator.
//
// pipeswap::mock::backend models the Backend concept on the host, with simulated time:
//  * streams are FIFOs; events are points on them; wait_event orders one stream behind another;
//  * one copy engine per direction (same-direction copies serialize, opposite directions overlap) and
//    one compute engine, with durations from a timing_model;
//  * device and pinned host allocations hold real bytes; every data effect (copy, kernel body,
//    release) is applied in simulated-time order when the host's clock passes its end, so a missing
//    wait shows up as stale data, exactly as on hardware;
//  * a hazard checker tracks a happens-before relation (vector clocks over the host thread and the
//    streams) and a shadow map per allocation, and reports every read of bytes whose write is not
//    ordered before it, every write while an unordered copy or kernel still uses the bytes, every
//    release of storage still in use, every host read of a D2H target that was not synchronized, and
//    every use of released storage — with the offending op, its stream and the op trace;
//  * it accounts device and pinned bytes over simulated time (peak, timeline);
//  * it injects faults (the n-th copy, allocation or kernel throws mock_error);
//  * it exports the whole timeline as Chrome trace JSON (one lane per stream and per engine).
//
// The backend is single-threaded: calls must not overlap. Kernels are host callables that declare the
// device bytes they read and write; their bodies run when the simulation reaches their end time.
// Set options::materialize = false for timing-only runs with sizes that do not fit host memory.
//
// The parts, each its own header: mock/types.hpp (handles, kernel descriptions, options),
// mock/backend.hpp (the model), mock/checker.hpp (hazard rules and reports), mock/trace.hpp (Chrome
// trace export), mock/faults.hpp (fault injection), mock/timing.hpp (the timing model) and
// mock/hazard.hpp (reports and errors). Include this header.
#pragma once

#include <pipeswap/backend/mock/backend.hpp>
#include <pipeswap/backend/mock/checker.hpp>
#include <pipeswap/backend/mock/faults.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/backend/mock/trace.hpp>
#include <pipeswap/backend/mock/types.hpp>
