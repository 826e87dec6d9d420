// When a batch-1 decode step folds the RMSNorms between its GEMVs into them (session 12,
// gemv_fused.h: NormProduce / NormApply: o and down write the next norm's z and tile partials,
// gate/up and the next layer's qkv scale their products; only layer 0's input norm and the final
// norm stay kernels), and when the folded o + norm GEMV lets gate/up launch (cuda::NextLaunch).
// Decided by the cache's capacity, which is fixed for a captured step (a single sequence's
// capacity, a pool's table width): graph-safe.
#pragma once

#include <cstdint>

#include "core/env.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemv_fused.h"

namespace kiln::cuda_backend {

struct NormFoldRule {
  // The model's GEMVs take the fold (the fused qkv GEMV, o / down weights the fused GEMVs take in
  // every layer; KILN_NORM_FOLD=0 or CudaBackendOptions::norm_fold turn it off).
  bool on = false;
  // int8 / int4 o and down in every layer: the fold runs at caches of at most kDecodeSplit
  // positions too (bf16 ones stay unfolded there: session 46 measured them level, -0.3%).
  bool short_caches = false;

  // Over kDecodeSplit positions (the decode attention ends with its combine kernel, P > 1) always:
  // it gains 2-4% there (session 45, -d 512). At most kDecodeSplit positions (the one-block
  // attention, P = 1) with short_caches, o + norm releasing gate/up at its exit (o_next): session
  // 46 (H100, 5 rounds) tg128 int4 + head +1.3%, int8 + head +1.05% at 64 positions, int4 +0.6% /
  // int8 level at 128-256. (Sessions 12 and 18 measured the short fold 1-24% slower with the
  // release after the wait, session 45 7% for int4: down's last block ~10 µs late;
  // docs/performance/decode-step.md.) KILN_NORM_FOLD_MIN=N folds from caches of more than N
  // positions instead (experiments: 0 folds every step, 256 the rule before session 46).
  bool folds(int64_t max_kv_len) const {
    static const int min_set = env_int("KILN_NORM_FOLD_MIN", -1);
    const int64_t min_positions = min_set >= 0 ? min_set : short_caches ? 0 : cuda::kDecodeSplit;
    return on && max_kv_len > min_positions;
  }

  // The folded o + norm GEMV releases gate/up at its exit where the one-block attention runs before
  // it (at most kDecodeSplit positions), else right after its wait. Session 46 (H100, tg128 int4 +
  // head at 64 positions): released after its wait the short folded step ran 7% slower than the
  // unfolded one, at its exit 1.3% faster; over 256 positions the exit cost int4 3.2%.
  // KILN_FOLD_O_AT_EXIT=0 / 1 picks one everywhere (the same-binary comparison). The step's other
  // fused GEMVs (qkv, gate/up, the folded down) always release after their waits: held to their
  // exits they measured level to 7.8% slower at 64 and 512 positions (session 47, decode-step.md).
  cuda::NextLaunch o_next(int64_t max_kv_len) const {
    static const int set = env_int_of("KILN_FOLD_O_AT_EXIT", -1, {-1, 0, 1});
    const bool at_exit = set >= 0 ? set == 1 : max_kv_len <= cuda::kDecodeSplit;
    return at_exit ? cuda::NextLaunch::at_exit : cuda::NextLaunch::after_wait;
  }
};

}  // namespace kiln::cuda_backend
