// The buffers a batched step's greedy ids go through: one device id a row, its pinned host copy,
// and the split argmax's partials and tickets (kernels/cuda/sampling.h's ArgmaxWorkspace) for steps
// of a few rows. They grow and are reused from step to step.
#pragma once

#include "backend/cuda/cuda_backend_impl.h"
#include "core/env.h"
#include "kernels/cuda/sampling.h"

namespace kiln::cuda_backend {

struct DeviceArgmax {
  DeviceBuffer<int32_t> ids;   // (rows) ids chosen on the device
  PinnedBuffer<int32_t> host;  // their copy on the host

  // Room for `rows` ids; the split scratch once (its tickets start zeroed, as the kernel needs).
  void ensure(int64_t rows) {
    if (tickets_.size() == 0) {
      const size_t parts = size_t(cuda::kArgmaxSplitRows) * cuda::kArgmaxMaxSplits;
      values_ = DeviceBuffer<float>(parts);
      part_ids_ = DeviceBuffer<int32_t>(parts);
      tickets_ = DeviceBuffer<uint32_t>(size_t(cuda::kArgmaxSplitRows));
      tickets_.zero();
    }
    if (int64_t(ids.size()) >= rows) return;
    ids = DeviceBuffer<int32_t>();
    ids = DeviceBuffer<int32_t>(size_t(pow2_at_least(rows)));
    host.grow(size_t(pow2_at_least(rows)));
  }

  // The greedy head's (value, id) pairs (matmul.h's gemm_argmax) for `parts` of them, and room for
  // `rows` ids.
  float2* head_parts(int64_t rows, int64_t parts) {
    ensure(rows);
    if (int64_t(head_parts_.size()) < parts) {
      head_parts_ = DeviceBuffer<float2>();
      head_parts_ = DeviceBuffer<float2>(size_t(pow2_at_least(parts)));
    }
    return head_parts_.data();
  }

  // The split argmax's scratch, or none (a block a row) with KILN_ARGMAX_SPLIT=0 (session 26: the
  // batch-1 step's argmax 18.7 -> 4.5 us).
  cuda::ArgmaxWorkspace workspace() {
    static const bool split = env_switch_on("KILN_ARGMAX_SPLIT");
    if (!split) return {};
    return {values_.data(), part_ids_.data(), tickets_.data()};
  }

 private:
  DeviceBuffer<float> values_;
  DeviceBuffer<int32_t> part_ids_;
  DeviceBuffer<uint32_t> tickets_;
  DeviceBuffer<float2> head_parts_;
};

}  // namespace kiln::cuda_backend
