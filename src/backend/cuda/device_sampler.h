// Token draws of a batched step's logits rows on the device (kernels/cuda/sampling.h): each row's
// RowSampling and the (id, count) pairs of its penalty window are planned on the host, uploaded
// with the step's stream, and one sample_rows launch writes an id per row. The buffers grow and are
// reused from step to step.
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "kernels/cuda/sampling.h"

namespace kiln::cuda_backend {

class DeviceSampler {
 public:
  // Row r of `logits` (entries[row_entries[r]]) draws with its entry's `sampling`; rows without
  // one (greedy, or left to the host sampler) get the argmax. ids: R device ints. The penalties
  // are applied to `logits` in place.
  void draw(CudaBackend::Impl& m, float* logits, int64_t vocab, std::span<const BatchEntry> entries,
            const std::vector<size_t>& row_entries, int32_t* ids);

 private:
  // Fills rows_, pen_ids_ and pen_counts_ (the penalty window of runtime/sampler.h).
  void plan(std::span<const BatchEntry> entries, const std::vector<size_t>& row_entries);

  std::vector<cuda::RowSampling> rows_;
  std::vector<int32_t> pen_ids_, pen_counts_;
  std::unordered_map<int32_t, int32_t> window_;
  DeviceBuffer<cuda::RowSampling> params_;
  PinnedBuffer<cuda::RowSampling> host_params_;
  DeviceBuffer<int32_t> penalties_;  // ids (n) then counts (n)
  PinnedBuffer<int32_t> host_penalties_;
};

}  // namespace kiln::cuda_backend
