// The kernel lab's paged K/V pools (kernel_lab_attention.cpp, kernel_lab_overlap.cpp): the block
// layout the continuous-batching engine reads, its blocks in shuffled order, and its 8-bit copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/kv_layout.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/random_fill.h"

namespace kiln::lab {

using cuda::bf16;
using cuda::DeviceBuffer;
using cuda::KvLayout;
using cuda::fill_random_bf16;
using cuda::KvQuant;

// A paged K/V pool for `batch` sequences of `len` positions in 16-token blocks, the blocks in shuffled
// order (what the continuous-batching engine reads): random K / V (fill seed), the block table
// (shuffle seed) on the host and the device, and the layout over them.
struct ShuffledPagedKv {
  static constexpr int64_t kBlock = 16, kBlockShift = 4;
  static_assert(int64_t(1) << kBlockShift == kBlock);
  int64_t per_seq, num_blocks;
  DeviceBuffer<bf16> k, v;
  std::vector<int32_t> table;
  DeviceBuffer<int32_t> dtable;
  KvLayout layout;
  ShuffledPagedKv(int64_t batch, int64_t len, int64_t kv_dim, int d, uint64_t fill_seed, unsigned shuffle_seed)
      : per_seq((len + kBlock - 1) / kBlock),
        num_blocks(batch * per_seq),
        k(size_t((num_blocks + 1) * kBlock * kv_dim)),
        v(k.size()),
        table(shuffled_ids(num_blocks, shuffle_seed)),
        dtable(table),
        layout{k.data(), v.data(), 0, kv_dim, d} {
    fill_random_bf16(k.data(), int64_t(k.size()), fill_seed, 0, 0, 1.0f, nullptr);
    fill_random_bf16(v.data(), int64_t(v.size()), fill_seed, 1, 0, 1.0f, nullptr);
    layout.block_table = dtable.data();
    layout.bt_stride = per_seq;
    layout.block_shift = kBlockShift;
  }

 private:
  static std::vector<int32_t> shuffled_ids(int64_t n, unsigned seed) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(i);
    std::mt19937 rng(seed);
    std::shuffle(t.begin(), t.end(), rng);
    return t;
  }
};

// The 8-bit copy of a ShuffledPagedKv pool (kv_layout.h's paged quantized form: bytes and scales
// head-major over the pool's slots), quantized as the engine's K/V write does (kv_quantize on the
// pool seen as one contiguous sequence of all its slots: the same index).
struct QuantizedPagedKv {
  DeviceBuffer<uint8_t> k8, v8;
  DeviceBuffer<float> scales;
  KvLayout layout;
  QuantizedPagedKv(const ShuffledPagedKv& pool, KvQuant f, int kv_heads, int d) {
    const KvLayout& src = pool.layout;
    const int64_t slots = (pool.num_blocks + 1) * ShuffledPagedKv::kBlock;
    k8 = DeviceBuffer<uint8_t>(size_t(slots * kv_heads * d));
    v8 = DeviceBuffer<uint8_t>(k8.size());
    scales = DeviceBuffer<float>(size_t(2 * slots * kv_heads));
    layout = KvLayout{nullptr, nullptr, 0, int64_t(kv_heads) * d, d};
    layout.quant = f;
    layout.k8 = k8.data();
    layout.v8 = v8.data();
    layout.k_scale = scales.data();
    layout.v_scale = scales.data() + slots * kv_heads;
    layout.scale_head_stride = slots;
    cuda::kv_quantize(src.k, 1, slots, kv_heads, layout, false, nullptr);
    cuda::kv_quantize(src.v, 1, slots, kv_heads, layout, true, nullptr);
    layout.block_table = src.block_table;
    layout.bt_stride = src.bt_stride;
    layout.block_shift = src.block_shift;
  }
};

}  // namespace kiln::lab
