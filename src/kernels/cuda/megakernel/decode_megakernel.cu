// The decode megakernel (decode_megakernel.h says why and what): its consumer warps, the kernel and
// the launcher. The plan both roles walk is megakernel_plan.cuh's, the producer
// megakernel_produce.cuh's, the synchronization megakernel_sync.cuh's, the tile products
// megakernel_dot.cuh's, the attention megakernel_attention.cuh's, the trace's summary
// megakernel_trace.cu's.
#include "kernels/cuda/megakernel/decode_megakernel.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/env.h"
#include "kernels/cuda/device_attributes.h"
#include "kernels/cuda/epilogue.cuh"
#include "kernels/cuda/gemv_epilogues.cuh"
#include "kernels/cuda/gemv_reduce.cuh"
#include "kernels/cuda/megakernel/megakernel_attention.cuh"
#include "kernels/cuda/megakernel/megakernel_dot.cuh"
#include "kernels/cuda/megakernel/megakernel_plan.cuh"
#include "kernels/cuda/megakernel/megakernel_produce.cuh"
#include "kernels/cuda/megakernel/megakernel_sync.cuh"

namespace kiln::cuda {
namespace {

using namespace mk;

// ---- the consumer warps ----

struct Ctx {
  const Params& p;
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  unsigned char* xs;  // staged x (K x 2 bytes), then one float sum per super-chunk
  float* red;         // (2, 8 warps, 16 rows): the tiles' partials, double-buffered
  float* norm_s;      // the phase's RMSNorm scale
  int* flag;
  int warp, lane;
  uint64_t* trace;    // this block's trace words, or null
  uint32_t slot = 0, parity = 0;  // the next ring item's slot and its `full` phase parity
  int buf = 0;
  uint64_t cyc[5] = {};  // thread 0's cycles in this phase (traced only): ring wait, products, release, tile barrier, epilogue

  // Waits for phase (l, ph) of every block (l = -1: the prologue), then starts phase (nl, nph).
  __device__ void wait(int l, int ph, int nl, int nph) {
    if (threadIdx.x == 0) phase_wait(p.st.sync + (l < 0 ? 0 : phase_index(l, ph)), gridDim.x);
    consumers_sync(kConsumers);
    if (trace && threadIdx.x == 0) trace[2 + (nl * kPhases + nph) * kPhaseWords] = global_ns();
    for (uint64_t& v : cyc) v = 0;
  }
  // This block's share of phase (l, ph) is written (l = -1: the prologue).
  __device__ void arrive(int l, int ph) {
    consumers_sync(kConsumers);
    if (threadIdx.x != 0) return;
    if (trace) {
      const int64_t at = l < 0 ? 1 : 2 + (l * kPhases + ph) * kPhaseWords + 1;
      trace[at] = global_ns();
      if (l >= 0)
        for (int i = 0; i < 5; ++i) trace[at + 1 + i] = cyc[i];
    }
    phase_arrive(p.st.sync + (l < 0 ? 0 : phase_index(l, ph)));
  }
  __device__ void next_slot() {
    if (++slot == uint32_t(p.slots)) {
      slot = 0;
      parity ^= 1;
    }
  }
  // Waits until the ring item in slot s (the fill of `full` phase parity par) has landed.
  __device__ void wait_full(uint32_t s, uint32_t par) {
    const bool timed = trace && threadIdx.x == 0;
    const uint64_t t0 = timed ? clock64() : 0;
    mbar_wait_warp(&full[s], par);
    if (timed) cyc[0] += clock64() - t0;
  }
};

// x (K bf16 values that other blocks wrote) into the staging area in the format's operand form, with
// one sum per super-chunk (int8 / int4: the min' term); with `partials` (a NormProduce's, K / 16 of
// them) also the norm scale s = rsqrt(mean(x_new^2) + eps).
template <QuantFormat F>
__device__ void stage_x(Ctx& c, const bf16* x, int64_t K, const float* partials) {
  const int pieces = int(K / 8);
  constexpr int CPU = kSuperK<F> / 8;  // pieces per super-chunk
  float* xsum = reinterpret_cast<float*>(c.xs + 2 * K);
  for (int b0 = c.warp * 32; b0 < pieces; b0 += kConsumers) {  // warp-uniform
    const int i = b0 + c.lane;
    uint4 v = i < pieces ? ld_cg16(x + 8 * int64_t(i)) : make_uint4(0u, 0u, 0u, 0u);
    float f[8];
    unpack8(v, f);
    if constexpr (F == QuantFormat::int8) v = f16_over16_piece(f);  // fp16(x / 16); its sums from the rounded values
    if (i < pieces) *reinterpret_cast<uint4*>(c.xs + 16 * i) = v;
    if constexpr (F != QuantFormat::none) {
      float s = ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
#pragma unroll
      for (int o = 1; o < CPU; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (c.lane % CPU == 0 && i < pieces) xsum[i / CPU] = s;
    }
  }
  if (partials && c.warp == kConsumerWarps - 1) {
    const float s = norm_scale(NormApply{partials, int(K / 16), c.p.m.eps}, c.lane, int(K));
    if (c.lane == 0) *c.norm_s = s;
  }
  consumers_sync(kConsumers);
}

// One matrix's phase: this block's tiles, their chunks from the ring, then per tile the 8 warps'
// partials meet in `red` and one warp runs epi(lo0, hi0, r, sum) on all its lanes (lane l: row
// r = l % 16 of the tile; lanes 16..31 repeat 0..15 so the epilogues' shuffles see a whole warp)
// while the others go on to the next tile. The finishing warp rotates with the tile (every warp
// releases every slot, so a warp that finished every tile would hold the ring back by its
// epilogues), and prefetches what its epilogue reads (epi.prefetch) when the tile starts. (Both came
// in run 6 together with other changes: not measured on their own.)
template <QuantFormat F, class Epi>
__device__ void gemv_phase(Ctx& c, const float2* scales, int l, int mi, const Epi& epi) {
  const Dims d = dims_of(c.p.m, mi);
  const int64_t row_bytes = row_bytes_of<F>(d.cols);
  const int chunks = int((row_bytes + kSlotRowBytes - 1) / kSlotRowBytes);
  const int n_sc = int(row_bytes / 64);
  const TileRange tr = tiles_of(d.rows / 16, l, mi);
  const int g = c.lane / 4, t = c.lane % 4;
  const uint32_t ring = smem_addr(c.ring), xbase = smem_addr(c.xs);
  const float* xsum = reinterpret_cast<const float*>(c.xs + 2 * d.cols);
  const bool timed = c.trace && threadIdx.x == 0;
  for (int tile = tr.t0; tile < tr.t0 + tr.n; ++tile) {
    int64_t lo0, hi0;
    runs_of(c.p.m, mi, tile, lo0, hi0);
    const int finisher = (tile - tr.t0) % kConsumerWarps;
    if (c.warp == finisher) epi.prefetch(lo0, hi0, c.lane % 16);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float2 s_lo = make_float2(0.0f, 0.0f), s_hi = s_lo;
    if constexpr (F == QuantFormat::int8) {  // per channel: one {scale, min'} per row
      s_lo = __ldg(scales + lo0 + g);
      s_hi = __ldg(scales + hi0 + g);
    }
    for (int ch = 0; ch < chunks; ++ch) {
      const uint32_t slot = c.slot;
      c.wait_full(slot, c.parity);
      const uint32_t base = ring + slot * uint32_t(kSlotBytes<F>);
      const uint64_t t0 = timed ? clock64() : 0;
#pragma unroll
      for (int j = 0; j < kWarpSuperChunks; ++j) {
        const int in_slot = kWarpSuperChunks * c.warp + j, sc = ch * kSlotSuperChunks + in_slot;
        if (sc < n_sc && c.p.probe != 1) {
          const uint32_t a_lo = base + uint32_t(g * kSlotRowStride + 64 * in_slot + 16 * t);
          if constexpr (F == QuantFormat::int4) {
            const uint32_t s0 = base + uint32_t(16 * kSlotRowStride + g * kSlotScaleStride + 8 * in_slot);
            s_lo = lds64f(s0);
            s_hi = lds64f(s0 + 8 * kSlotScaleStride);
          }
          const float xs = F == QuantFormat::none ? 0.0f : xsum[sc];
          superchunk<F>(acc, a_lo, a_lo + 8 * kSlotRowStride, xbase + uint32_t(2 * (sc * kSuperK<F> + 8 * t)), xs,
                        s_lo, s_hi);
        }
      }
      if (timed) c.cyc[1] += clock64() - t0;
      const uint64_t t1 = timed ? clock64() : 0;
      __syncwarp();
      if (c.lane == 0) mbar_arrive(&c.empty[slot]);
      c.next_slot();
      if (timed) c.cyc[2] += clock64() - t1;
    }
    float* rb = c.red + c.buf * (kConsumerWarps * 16);
    const uint64_t t2 = timed ? clock64() : 0;
    if (t == 0) {
      rb[c.warp * 16 + g] = acc[0] * kResultScale<F>;
      rb[c.warp * 16 + g + 8] = acc[2] * kResultScale<F>;
    }
    consumers_sync(kConsumers);
    const uint64_t t3 = timed ? clock64() : 0;
    if (timed) c.cyc[3] += t3 - t2;
    if (c.warp == finisher) {
      const int r = c.lane % 16;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) sum += rb[w * 16 + r];
      epi(lo0, hi0, r, sum);
      if (timed) c.cyc[4] += clock64() - t3;
    }
    c.buf ^= 1;  // the next tile's partials go to the other buffer: the finisher may still read this one
  }
}

// qkv: the products scaled by the attention norm's s, the bias added, bf16-rounded as the fused
// GEMV rounds them, then RopeKvEpi's RoPE and stores (q, this position's K/V).
struct QkvEpi {
  RopeKvEpi rope;
  float s;
  __device__ __forceinline__ void prefetch(int64_t lo0, int64_t hi0, int r) const {
    const RopeKvTarget& o = rope.o;
    if (r == 0 && rope.bias) {
      prefetch_l1(rope.bias + lo0);
      prefetch_l1(rope.bias + hi0);
    }
    const int64_t pos = o.position[0], half = o.rot_dim / 2;
    if (o.cos_sin && pos < o.cos_sin_positions && r < (half * 8 + 127) / 128)  // the position's (cos, sin) row
      prefetch_l1(o.cos_sin + pos * half + 16 * r);
  }
  __device__ __forceinline__ void operator()(int64_t lo0, int64_t hi0, int r, float sum) const {
    const int64_t n = tile_row(lo0, hi0, r);
    const float start = rope.bias ? __bfloat162float(rope.bias[n]) : 0.0f;
    rope.emit(n, round_bf16(start + s * sum), threadIdx.x % 32 < 16);
  }
};

// gate/up: the products scaled by the FFN norm's s, bf16-rounded, then SwiGluEpi's silu(gate) * up.
struct GateUpEpi {
  SwiGluEpi swiglu;
  float s;
  __device__ __forceinline__ void prefetch(int64_t, int64_t, int) const {}
  __device__ __forceinline__ void operator()(int64_t lo0, int64_t, int r, float sum) const {
    swiglu.emit(lo0, r, round_bf16(s * sum), threadIdx.x % 32 < 16);
  }
};

// o and down: y (the fp32 residual) += the product, then (z set) the next RMSNorm's product
// z = bf16(y o w) and the tile's sum of y^2 (gemv_fused.h's NormProduce, AddNormRows' arithmetic).
struct AddNormEpi {
  float* y;
  const bf16* w;  // null: no norm product (the last layer's down)
  bf16* z;
  float* part;
  __device__ __forceinline__ void prefetch(int64_t lo0, int64_t, int r) const {
    if (r == 0) {
      prefetch_l2(y + lo0);  // 64 bytes: the tile's residual rows, read at L2
      if (w) prefetch_l1(w + lo0);
    }
  }
  __device__ __forceinline__ void operator()(int64_t lo0, int64_t, int r, float sum) const {
    const int lane = int(threadIdx.x % 32);
    const int64_t n = lo0 + r;
    const float x = __ldcg(y + n) + sum;
    if (lane < 16) y[n] = x;
    if (!w) return;
    if (lane < 16) z[n] = __float2bfloat16(x * __bfloat162float(w[n]));
    float sq = x * x;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if (lane == 0) part[lo0 / 16] = sq;
  }
};

template <QuantFormat F>
__device__ void consume(Ctx& c) {
  const MegakernelModel& m = c.p.m;
  const MegakernelStep& st = c.p.st;
  const int G = int(gridDim.x);
  const int64_t H = m.hidden, q_dim = int64_t(m.n_heads) * m.head_dim, kv_dim = int64_t(m.n_kv_heads) * m.head_dim;
  const int pos = st.position[0];

  // Layer 0's norm product from the embedded token: 16 rows a warp.
  for (int64_t tile = int64_t(blockIdx.x) + int64_t(c.warp) * G; tile < H / 16; tile += int64_t(kConsumerWarps) * G) {
    const int64_t n = 16 * tile + c.lane % 16;
    const float x = __ldcg(st.x + n);
    if (c.lane < 16) st.z_attn[n] = __float2bfloat16(x * __bfloat162float(m.layers[0].attn_norm[n]));
    float sq = x * x;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
    if (c.lane == 0) st.part_attn[tile] = sq;
  }
  c.arrive(-1, 0);

  for (int l = 0; l < m.n_layers; ++l) {
    const MegakernelLayer& L = m.layers[l];
    // qkv: the attention norm's scale, RoPE, q out and this position's K/V into the cache.
    c.wait(l - 1, l == 0 ? 0 : kPhDown, l, kPhQkv);
    AttentionArgs a;
    a.q = st.q;
    a.k = st.k + l * st.kv_layer_stride;
    a.v = st.v + l * st.kv_layer_stride;
    a.out = st.attn;
    a.ws = st.attn_ws;
    a.head_done = st.sync + head_done_index(m.n_layers, l, m.n_kv_heads);
    a.len = pos + 1;
    a.n_heads = m.n_heads;
    a.n_kv_heads = m.n_kv_heads;
    a.scale_log2 = 1.4426950408889634f / sqrtf(float(m.head_dim));
    attention_prefetch(a);  // the cache rows this block will attend over, into L2 under the qkv stream
    stage_x<F>(c, st.z_attn, H, st.part_attn);
    {
      RopeKvTarget o = rope_shape_of(m);
      o.position = st.position;
      o.inv_freq = st.inv_freq;
      o.cos_sin = st.cos_sin;
      o.cos_sin_positions = st.cos_sin_positions;
      o.q_out = st.q;
      o.kv.k = st.k + l * st.kv_layer_stride;
      o.kv.v = st.v + l * st.kv_layer_stride;
      o.kv.pos_stride = kv_dim;
      o.kv.head_dim = m.head_dim;
      gemv_phase<F>(c, L.scales[kQkv], l, kQkv, QkvEpi{RopeKvEpi{L.b_qkv, o}, *c.norm_s});
    }
    c.arrive(l, kPhQkv);

    c.wait(l, kPhQkv, l, kPhAttn);
    if (m.n_heads <= 4 * m.n_kv_heads)
      attention_phase<4>(a, reinterpret_cast<float*>(c.xs), c.flag);
    else
      attention_phase<8>(a, reinterpret_cast<float*>(c.xs), c.flag);
    c.arrive(l, kPhAttn);

    // o: the residual add and the FFN norm's product.
    c.wait(l, kPhAttn, l, kPhO);
    stage_x<F>(c, st.attn, q_dim, nullptr);
    gemv_phase<F>(c, L.scales[kO], l, kO, AddNormEpi{st.x, L.ffn_norm, st.z_ffn, st.part_ffn});
    c.arrive(l, kPhO);

    // gate/up: the FFN norm's scale, SwiGLU.
    c.wait(l, kPhO, l, kPhGateUp);
    stage_x<F>(c, st.z_ffn, H, st.part_ffn);
    gemv_phase<F>(c, L.scales[kGateUp], l, kGateUp, GateUpEpi{SwiGluEpi{st.h, m.inter}, *c.norm_s});
    c.arrive(l, kPhGateUp);

    // down: the residual add and the next layer's attention norm product.
    c.wait(l, kPhGateUp, l, kPhDown);
    stage_x<F>(c, st.h, m.inter, nullptr);
    const bool last = l + 1 == m.n_layers;
    gemv_phase<F>(c, L.scales[kDown], l, kDown,
                  AddNormEpi{st.x, last ? nullptr : m.layers[l + 1].attn_norm, st.z_attn, st.part_attn});
    c.arrive(l, kPhDown);
  }
}

template <QuantFormat F>
__global__ void __launch_bounds__(kThreads, 1) decode_megakernel_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  unsigned char* xs = ring + size_t(p.slots) * kSlotBytes<F>;
  float* red = reinterpret_cast<float*>(xs + p.x_bytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(red + 2 * kConsumerWarps * 16);
  uint64_t* empty = full + p.slots;
  float* norm_s = reinterpret_cast<float*>(empty + p.slots);
  int* flag = reinterpret_cast<int*>(norm_s + 1);
  if (threadIdx.x == 0) {
    for (int i = 0; i < p.slots; ++i) {
      mbar_init(&full[i], p.tma ? 1 : 32);    // TMA: the arrive.expect_tx; cp.async: one per producer lane
      mbar_init(&empty[i], kConsumerWarps);   // one per consumer warp
    }
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    produce<F>(p, ring, full, empty, int(threadIdx.x - kConsumers) / 32);
    return;
  }
  uint64_t* trace = p.st.trace ? p.st.trace + int64_t(blockIdx.x) * trace_block_words(p.m.n_layers) : nullptr;
  if (trace && threadIdx.x == 0) {
    trace[0] = global_ns();
    trace[trace_clock_offset(p.m.n_layers)] = clock64();
  }
  Ctx c{p, ring, full, empty, xs, red, norm_s, flag, int(threadIdx.x / 32), int(threadIdx.x % 32), trace};
  consume<F>(c);
  if (trace && threadIdx.x == 0) {
    trace[trace_clock_offset(p.m.n_layers) + 1] = clock64();
    trace[trace_clock_offset(p.m.n_layers) + 2] = global_ns();
  }
}

// ---- host ----

int group_of(const MegakernelModel& m) { return m.n_kv_heads > 0 ? m.n_heads / m.n_kv_heads : 0; }

int64_t k_multiple(QuantFormat f) {  // the K a row's chunks need: whole super-chunks; int4 scale rows of 16 bytes
  return f == QuantFormat::int4 ? 256 : f == QuantFormat::int8 ? 64 : 32;
}

size_t slot_bytes(QuantFormat f) {
  return f == QuantFormat::int4 ? size_t(kSlotBytes<QuantFormat::int4>) : size_t(kSlotBytes<QuantFormat::none>);
}

int max_dynamic_smem() {
  static const int v = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return v;
}

// The shared-memory layout: x staging (the largest K's operand and sums, or the attention's
// scratch), 1 KB of tile partials, the mbarriers and two scalars; the rest is ring.
struct Layout {
  int slots = 0;
  uint32_t x_bytes = 0;
  size_t smem = 0;
};
Layout layout_of(const MegakernelModel& m) {
  Layout lay;
  const int64_t q_dim = int64_t(m.n_heads) * m.head_dim;
  const int64_t kmax = std::max({m.hidden, q_dim, m.inter});
  const int64_t x_need = std::max<int64_t>(2 * kmax + kmax / 32 * 4, int64_t(attention_scratch_floats(group_of(m))) * 4);
  lay.x_bytes = uint32_t((x_need + 127) / 128 * 128);
  const size_t fixed = lay.x_bytes + 2 * kConsumerWarps * 16 * 4 + 16;
  const size_t per_slot = slot_bytes(m.format) + 16;  // + its two mbarriers
  const size_t budget = size_t(max_dynamic_smem());
  // KILN_MEGAKERNEL_SLOTS=N: at most N slots (the ring-depth experiments of megakernel.md).
  static const int slot_cap = std::clamp(env_int("KILN_MEGAKERNEL_SLOTS", kMaxSlots), 1, kMaxSlots);
  lay.slots = budget > fixed ? int(std::min<size_t>(size_t(slot_cap), (budget - fixed) / per_slot)) : 0;
  lay.smem = size_t(lay.slots) * per_slot + fixed;
  return lay;
}

// The kernel of format F with its dynamic shared-memory limit raised (once).
template <QuantFormat F>
auto configured_kernel() {
  auto kernel = decode_megakernel_kernel<F>;
  static const bool configured = [&] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic_smem()));
    return true;
  }();
  (void)configured;
  return kernel;
}

// "" when a block of the kernel for m fits a SM, else what does not fit (a cooperative launch of
// one block per SM needs one to).
template <QuantFormat F>
std::string fits_sm(size_t smem) {
  auto kernel = configured_kernel<F>();
  int blocks = 0;
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem));
  if (blocks >= 1) return "";
  cudaFuncAttributes fa{};
  KILN_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  return "a block does not fit a SM (" + std::to_string(fa.numRegs) + " registers x " + std::to_string(kThreads) +
         " threads, " + std::to_string(smem) + " + " + std::to_string(fa.sharedSizeBytes) +
         " bytes of shared memory, at most " + std::to_string(fa.maxThreadsPerBlock) + " threads)";
}

std::string fits_sm(QuantFormat f, size_t smem) {
  if (f == QuantFormat::int4) return fits_sm<QuantFormat::int4>(smem);
  if (f == QuantFormat::int8) return fits_sm<QuantFormat::int8>(smem);
  return fits_sm<QuantFormat::none>(smem);
}

template <QuantFormat F>
void launch(const Params& p, size_t smem, cudaStream_t stream) {
  auto kernel = configured_kernel<F>();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every block resident: the phase waits need it
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(device_sm_count()));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
}

}  // namespace

std::string megakernel_unsupported(const MegakernelModel& m) {
  int dev = 0, major = 0, coop = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return "no CUDA device";
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  if (major < 9) return "needs compute capability 9.0 (sm_90)";
  if (!coop) return "the device has no cooperative launch";
  if (m.format != QuantFormat::none && m.format != QuantFormat::int8 && m.format != QuantFormat::int4)
    return "weights are not bf16, int8 or int4";
  if (m.n_layers < 1 || !m.layers) return "no layers";
  if (m.head_dim != kAttnD) return "head_dim is not 128";
  if (m.n_kv_heads < 1 || m.n_heads % m.n_kv_heads != 0 || group_of(m) > kAttnMaxGroup)
    return "more than 8 query heads per KV head";
  if (m.rot_dim % 16 != 0 || m.rot_dim > m.head_dim) return "the rotary dims are not a multiple of 16";
  if (m.hidden % 16 != 0 || m.inter % 8 != 0) return "rows are not whole 16-row tiles";
  const int64_t q_dim = int64_t(m.n_heads) * m.head_dim;
  for (int64_t k : {m.hidden, q_dim, m.inter})
    if (k % k_multiple(m.format) != 0) return "an input width is not a whole number of weight chunks";
  const Layout lay = layout_of(m);
  if (lay.slots < 3) return "too little shared memory for the ring";
  return fits_sm(m.format, lay.smem);
}

int64_t megakernel_workspace_floats(const MegakernelModel& m) {
  return int64_t(device_sm_count()) * group_of(m) * (kAttnD + 2);
}

int64_t megakernel_sync_words(const MegakernelModel& m) { return head_done_index(m.n_layers, m.n_layers, m.n_kv_heads); }

void decode_megakernel(const MegakernelModel& m, const MegakernelStep& step, cudaStream_t stream) {
  const Layout lay = layout_of(m);
  KILN_CUDA_REQUIRE(lay.slots >= 3, "decode_megakernel: the model does not fit (megakernel_unsupported)");
  KILN_CUDA_CHECK(cudaMemsetAsync(step.sync, 0, size_t(megakernel_sync_words(m)) * 4, stream));
  static const bool tma = env_int("KILN_MEGAKERNEL_TMA", 0) != 0;
  static const int probe = env_int("KILN_MEGAKERNEL_PROBE", 0);
  const Params p{m, step, lay.slots, lay.x_bytes, tma, probe};
  if (m.format == QuantFormat::int4)
    launch<QuantFormat::int4>(p, lay.smem, stream);
  else if (m.format == QuantFormat::int8)
    launch<QuantFormat::int8>(p, lay.smem, stream);
  else
    launch<QuantFormat::none>(p, lay.smem, stream);
}

}  // namespace kiln::cuda
