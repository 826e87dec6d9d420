#include "backend/cuda/device_sampler.h"

#include <algorithm>

#include "runtime/sampler.h"

namespace kiln::cuda_backend {

void DeviceSampler::plan(std::span<const BatchEntry> entries, const std::vector<size_t>& row_entries) {
  rows_.assign(row_entries.size(), cuda::RowSampling{});
  pen_ids_.clear();
  pen_counts_.clear();
  for (size_t r = 0; r < row_entries.size(); ++r) {
    const BatchEntry& b = entries[row_entries[r]];
    cuda::RowSampling& p = rows_[r];
    p.temperature = 0.0f;  // argmax
    if (!b.sampling) continue;
    const SamplingParams& s = *b.sampling;
    p.temperature = s.temperature, p.top_k = s.top_k, p.top_p = s.top_p, p.min_p = s.min_p;
    p.repetition_penalty = s.repetition_penalty, p.presence_penalty = s.presence_penalty;
    p.frequency_penalty = s.frequency_penalty, p.seed = s.seed, p.counter = b.draw;
    p.pen_begin = int32_t(pen_ids_.size());
    if (has_penalties(s)) {  // sample_rows skips ids outside the vocabulary, as Sampler does
      penalty_window(s, b.history, window_);
      for (auto [id, count] : window_) pen_ids_.push_back(id), pen_counts_.push_back(count);
    }
    p.pen_end = int32_t(pen_ids_.size());
  }
}

void DeviceSampler::draw(CudaBackend::Impl& m, float* logits, int64_t vocab, std::span<const BatchEntry> entries,
                         const std::vector<size_t>& row_entries, int32_t* ids) {
  plan(entries, row_entries);
  const size_t R = rows_.size(), n = pen_ids_.size();
  if (params_.size() < R) {
    params_ = DeviceBuffer<cuda::RowSampling>();
    params_ = DeviceBuffer<cuda::RowSampling>(size_t(pow2_at_least(int64_t(R))));
    host_params_.grow(params_.size());
  }
  if (penalties_.size() < std::max<size_t>(2 * n, 1)) {
    penalties_ = DeviceBuffer<int32_t>();
    penalties_ = DeviceBuffer<int32_t>(size_t(pow2_at_least(int64_t(std::max<size_t>(2 * n, 1024)))));
    host_penalties_.grow(penalties_.size());
  }
  // The pinned copies are safe to refill next step: the step ends with a stream synchronize.
  std::copy(rows_.begin(), rows_.end(), host_params_.data());
  std::copy(pen_ids_.begin(), pen_ids_.end(), host_penalties_.data());
  std::copy(pen_counts_.begin(), pen_counts_.end(), host_penalties_.data() + n);
  KILN_CUDA_CHECK(cudaMemcpyAsync(params_.data(), host_params_.data(), R * sizeof(cuda::RowSampling),
                                  cudaMemcpyHostToDevice, m.s()));
  if (n > 0)
    KILN_CUDA_CHECK(cudaMemcpyAsync(penalties_.data(), host_penalties_.data(), 2 * n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, m.s()));
  m.op("sample", profile::Cost{double(R) * double(vocab) * 4, 0}, [&] {
    cuda::sample_rows(logits, int64_t(R), vocab, params_.data(), penalties_.data(), penalties_.data() + n, ids, m.s());
  });
}

}  // namespace kiln::cuda_backend
