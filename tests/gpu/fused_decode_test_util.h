// The fused-decode GPU tests' shared walk (kv_quant_backend_test.cpp, quant_backend_test.cpp): one
// prompt, then one-token decode steps, through a backend with the fused decode GEMVs and one without;
// every step's logits the same bits.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace kiln::gputest {

// Feeds `prompt`, then `steps` tokens (step * mul + add) % vocab, to fused.sa and plain.sb, requiring
// equal logits after each. The last step runs with `fused` profiling (graphs are bypassed while
// profiling, so the eager launches are compared too); qkv_fused says whether its fused qkv GEMV ran.
// Call through ASSERT_NO_FATAL_FAILURE: a difference ends the walk.
inline void decode_both_same_bits(CudaBackend& fused, CudaBackend& plain, KvSequence& sa, KvSequence& sb,
                                  std::span<const int32_t> prompt, int steps, int mul, int add, int64_t vocab,
                                  bool& qkv_fused) {
  std::vector<float> la, lb;
  fused.forward(sa, prompt, false, la);
  plain.forward(sb, prompt, false, lb);
  ASSERT_EQ(la, lb) << "prefill (never fused)";
  for (int step = 0; step < steps; ++step) {
    int32_t t = int32_t((int64_t(step) * mul + add) % vocab);
    if (step == steps - 1) fused.set_profiling(true);
    fused.forward(sa, std::span<const int32_t>(&t, 1), false, la);
    plain.forward(sb, std::span<const int32_t>(&t, 1), false, lb);
    ASSERT_EQ(la, lb) << "decode step " << step;
  }
  qkv_fused = false;
  for (const KernelStat& st : fused.kernel_stats()) qkv_fused |= st.name.ends_with("qkv+rope.gemv");
}

}  // namespace kiln::gputest
