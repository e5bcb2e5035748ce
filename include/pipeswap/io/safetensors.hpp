// pipeswap — the safetensors file layer: validated reading (safetensors_reader.hpp) and
// deterministic, atomic writing (safetensors_writer.hpp). Format, rules and guarantees:
// docs/checkpoint-format.md.
#pragma once

#include <pipeswap/io/atomic_file.hpp>
#include <pipeswap/io/error.hpp>
#include <pipeswap/io/safetensors_format.hpp>
#include <pipeswap/io/safetensors_reader.hpp>
#include <pipeswap/io/safetensors_writer.hpp>
