// A weight matrix on the GPU in the format its kernels read: bf16, or quantized (int8 / int4 / fp8)
// in the packed layout of kernels/cuda/quant/qmatmul.h, with its scales. The CUDA backend holds its
// projections as DeviceWeights and multiplies through cuda::qmatmul, which dispatches on the format.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "model/weights.h"

namespace kiln::cuda {

struct DeviceWeight {
  QuantFormat format = QuantFormat::none;
  int64_t rows = 0, cols = 0, group = 0;
  DeviceBuffer<uint8_t> data;  // bf16 values or the packed quantized bytes
  DeviceBuffer<float> scales;  // empty for bf16

  QWeight view() const { return {format, rows, cols, group, data.data(), scales.size() ? scales.data() : nullptr}; }
  const bf16* bf16_data() const { return reinterpret_cast<const bf16*>(data.data()); }  // format none only
  bool empty() const { return rows == 0; }
  size_t bytes() const { return data.bytes() + scales.bytes(); }
  double bytes_per_weight() const { return qweight_bytes_per_weight(format, cols, group); }
};

// Host matrices stacked by rows into one device weight. Quantized when every part carries a
// quantized form (HostMatrix::quant) of one format and group size and the shape packs
// (qweight_packable); otherwise bf16 from the parts' fp32 values (a fused matrix whose parts were
// quantized differently, e.g. GGUF Q4_K_M mixes, runs in bf16 rather than failing).
DeviceWeight upload_weight(std::initializer_list<const HostMatrix*> parts);

// Random weights of `format` for speed runs, generated on the device: bf16 takes the values of
// model/random_weights.h per part (stream id, rows) as before; quantized formats fill the packed
// bytes and scales from a counter hash (values of about +-scale; speed does not depend on them).
// Group sizes: int8 per channel (cols), int4 128, fp8 per channel.
DeviceWeight random_weight(QuantFormat format, int64_t cols, std::initializer_list<std::pair<uint64_t, int64_t>> parts,
                           uint64_t seed, float scale, cudaStream_t stream);

}  // namespace kiln::cuda
