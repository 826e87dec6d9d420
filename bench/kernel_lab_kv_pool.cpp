// `kernel_lab --kv-pool`: the batched paged decode over a pool laid out as the engine's
// (CudaKvPool: one allocation, per layer K then V, each (blocks + 1, 16, kv_dim)), to find why the
// engine's 2048-row step spends ~605 us a layer in attention where `--attention-batch` measures
// ~435 us for the same shape (session 14). The lab's batched bench times one pool, its blocks
// shuffled, called again and again; the engine walks 32 layers' pools a step, its blocks (after a
// fresh start) consecutive per sequence. The variants separate the two: one layer's region or the
// 32 layers' regions in turn, and consecutive or shuffled block ids. Each variant is validated by
// its layer 31 giving layer 0's output bit for bit (every layer holds the same random values).
// Session 16 found neither mattered (437-442 us at b=2048 L=192): the gap was partial 64-position
// tiles, which the slice kernel, the default here since, removed (performance/attention.md).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "kernel_lab.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/random_fill.h"

namespace kiln::lab {

using namespace kiln::cuda;

void bench_decode_kv_pool(double copy_gbs) {
  const int heads = 32, kv_heads = 8, d = 128, layers = 32;
  const int64_t kv_dim = int64_t(kv_heads) * d, block = 16;
  for (auto [batch, len] : {std::pair<int64_t, int64_t>{2048, 192}, {2048, 128}, {64, 512}}) {
    const int64_t per_seq = (len + block - 1) / block, blocks = batch * per_seq;
    const int64_t layer_elems = (blocks + 1) * block * kv_dim;  // one layer's K (or V)
    DeviceBuffer<bf16> pool(size_t(2 * layers * layer_elems));
    // Every layer's K and V get the same values (seed by K / V only), so any layer's output is
    // layer 0's; filled per layer in pieces of ~1 GB (the fill's count is an int64).
    for (int l = 0; l < layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        fill_random_bf16(pool.data() + (2 * l + kv) * layer_elems, layer_elems, 13, uint64_t(kv), 0, 1.0f, nullptr);
    std::vector<int32_t> consecutive(static_cast<size_t>(blocks));
    std::iota(consecutive.begin(), consecutive.end(), 0);
    std::vector<int32_t> shuffled = consecutive;
    std::mt19937 rng(17);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    DeviceBuffer<int32_t> t_consecutive(consecutive), t_shuffled(shuffled);
    DeviceBuffer<bf16> q(size_t(batch * heads * d)), out(q.size()), out_ref(q.size());
    fill_random_bf16(q.data(), int64_t(q.size()), 13, 7, 0, 1.0f, nullptr);
    std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(len));
    DeviceBuffer<int32_t> dlen(lens);
    const int64_t cap = 4096;
    DeviceBuffer<float> ws(size_t(decode_workspace_floats(batch, heads, d, cap)));
    auto wsv = decode_workspace(ws.data(), batch, heads, d, cap);
    auto layout = [&](int l, const DeviceBuffer<int32_t>& table) {
      bf16* k = pool.data() + 2 * int64_t(l) * layer_elems;
      KvLayout kv{k, k + layer_elems, 0, kv_dim, d};
      kv.block_table = table.data();
      kv.bt_stride = per_seq;
      kv.block_shift = 4;
      return kv;
    };
    const double bytes = 2.0 * batch * len * kv_dim * 2, flops = 4.0 * batch * len * heads * d;
    char shape[64];
    std::snprintf(shape, sizeof shape, "pool decode b=%lld L=%lld", (long long)batch, (long long)len);
    struct Variant {
      const char* label;
      bool all_layers, shuffle;
    };
    for (const Variant& var : {Variant{"1 layer consecutive", false, false}, Variant{"32 layers consecutive", true, false},
                               Variant{"1 layer shuffled", false, true}, Variant{"32 layers shuffled", true, true}}) {
      const DeviceBuffer<int32_t>& table = var.shuffle ? t_shuffled : t_consecutive;
      attention_decode(q.data(), layout(0, table), dlen.data(), cap, out_ref.data(), wsv, batch, heads, kv_heads, d,
                       nullptr);
      out.poison();
      attention_decode(q.data(), layout(layers - 1, table), dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads,
                       d, nullptr);
      cuda_synchronize();
      const double err = rel_error(to_float(out), to_float(out_ref));
      if (!(err == 0)) std::printf("VALIDATION FAILED: %s %s: layer 31 differs from layer 0 (%.3e)\n", shape, var.label, err);
      const double ms = time_ms([&](int i) {
        const int l = var.all_layers ? i % layers : 0;
        attention_decode(q.data(), layout(l, table), dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d,
                         nullptr);
      });
      record("attention", shape, var.label, ms, bytes, flops, copy_gbs, err);
      if (var.all_layers) {  // the 32 layers back to back, per call: as a step's attention calls follow each other
        const double seq_ms = time_ms([&](int) {
          for (int l = 0; l < layers; ++l)
            attention_decode(q.data(), layout(l, table), dlen.data(), cap, out.data(), wsv, batch, heads, kv_heads, d,
                             nullptr);
        }, 10, 2) / layers;
        record("attention", shape, var.shuffle ? "32 in sequence shuffled" : "32 in sequence consecutive", seq_ms,
               bytes, flops, copy_gbs, err);
      }
    }
  }
}

}  // namespace kiln::lab
