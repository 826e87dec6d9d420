// The CUDA backend's private state, shared by its translation units:
//   cuda_backend.cpp:    weights, construction, the single-sequence forward (KvSequence) and its graph;
//   cuda_batch.cpp:      the paged KV pool and forward_batch (continuous batching) and its graphs;
//   cuda_megakernel.cpp: the single-sequence decode step as one kernel (opt-in).
// The first two enqueue the same layer sequence through Impl::enqueue_layers / enqueue_head; they
// differ only in where K/V go and how attention reads them (the `attend` step).
#pragma once

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cupti_kernel_timer.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_weight.h"
#include "backend/cuda/norm_fold_rule.h"
#include "core/check.h"
#include "core/env.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_o_fused.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemv_fused.h"
#include "kernels/cuda/kv_quant.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/megakernel/decode_megakernel.h"
#include "kernels/cuda/quant/qmatmul.h"
#include "kernels/cuda/stream_hold.h"
#include "profile/cost_model.h"

namespace kiln {

struct CudaBackend::Impl {
  using bf16 = cuda::bf16;
  using OutMode = cuda::OutMode;
  template <typename T>
  using DeviceBuffer = cuda::DeviceBuffer<T>;

  ModelConfig c;
  CudaBackendOptions opt;
  cuda::Stream stream;
  DeviceBuffer<bf16> embed, final_norm;
  cuda::DeviceWeight lm_head;  // empty when tied to the embedding
  // int8/int4 products with M > kQGemvSliceRows multiply a bf16 copy of W made here (qmatmul.h):
  // sized for the largest such matrix when the weights are uploaded (empty without int8/int4).
  DeviceBuffer<bf16> qscratch;
  std::vector<cuda_backend::DeviceLayer> layers;
  DeviceBuffer<float> inv_freq;  // (rot_dim / 2), llama3 scaling applied on the host
  // RoPE's (cos, sin) per (position, pair) for the model's context (rope_table_fill); later
  // positions are computed in the kernels.
  DeviceBuffer<float2> rope_table;
  int64_t rope_positions = 0;
  // The fused qkv GEMV's staging for a quantized cache (cuda::KvQuantStage): a token's K and V
  // values, then each KV head's amax and tile count (zeroed once; each launch leaves them zero).
  DeviceBuffer<float> kv_q8_values;
  DeviceBuffer<uint32_t> kv_q8_sync;

  // The single-sequence path's activations for max_chunk tokens (never reallocated: captured
  // graphs hold these addresses); `act.ints` = tokens (C) | positions (C) | kv_len (1).
  cuda_backend::Activations act;
  cuda_backend::PinnedBuffer<int32_t> host_ints;  // staging of act.ints
  cuda_backend::PinnedBuffer<float> host_logits;  // (vocab): the decode graph's output

  bool profiling = false;
  // How launches are timed when profiling: CUPTI's kernel records where libcupti loads (nothing
  // added between kernels), else CUDA events around each launch (~2 us of GPU time each; the
  // fallback, and KILN_PROFILE_TIMER=events for comparison).
  cuda::CuptiKernelTimer* cupti = nullptr;
  std::string timer_note;  // which timer, and why not CUPTI
  static constexpr int64_t kProfileHoldMicroseconds = 8000;  // longer than queuing a decode step
  struct Pending {
    std::string name;
    double bytes, flops;
    cudaEvent_t a, b;  // unused with CUPTI
  };
  std::vector<Pending> pending;
  std::vector<cudaEvent_t> event_pool;
  size_t events_used = 0;
  std::map<std::string, KernelStat> stats;
  std::vector<profile::TraceEvent> last_trace;  // the last profiled step's kernels (CUPTI only)

  Impl(ModelConfig config, CudaBackendOptions o) : c(std::move(config)), opt(o) {}
  ~Impl() {
    for (cudaEvent_t e : event_pool) cudaEventDestroy(e);
  }

  int64_t qkv_dim() const { return c.q_dim() + 2 * c.kv_dim(); }
  cuda::QWeight output_weight() const {
    if (!lm_head.empty()) return lm_head.view();
    return {QuantFormat::none, c.vocab_size, c.hidden_size, c.hidden_size, embed.data(), nullptr};
  }
  // Widest input of an fp8 product (its activation scratch per row), 0 without fp8 weights.
  int64_t act_quant_cols() const {
    int64_t cols = 0;
    for_each_weight([&](const cuda::DeviceWeight& w) {
      if (w.format == QuantFormat::fp8) cols = std::max(cols, w.cols);
    });
    return cols;
  }
  // f(w) for every projection weight (lm_head and each layer's four).
  template <class F>
  void for_each_weight(F&& f) const {
    f(lm_head);
    for (const cuda_backend::DeviceLayer& d : layers) {
      f(d.w_qkv);
      f(d.wo);
      f(d.w_gu);
      f(d.w_down);
    }
  }
  // After the weights are in place, before any graph: qscratch for the int8/int4 matrices, and the
  // single-sequence activations again with room for fp8 activations when there are fp8 weights.
  void init_quant_scratch() {
    size_qscratch();
    if (const int64_t cols = act_quant_cols()) act.allocate(c, opt.max_chunk, 2 * opt.max_chunk + 1, false, cols);
  }
  void size_qscratch() {
    int64_t elems = 0;
    for_each_weight([&](const cuda::DeviceWeight& w) {
      if (w.format == QuantFormat::int8 || w.format == QuantFormat::int4) elems = std::max(elems, w.rows * w.cols);
    });
    qscratch = DeviceBuffer<bf16>(size_t(elems));
  }
  cudaStream_t s() const { return stream.get(); }

  void init_common();  // cuda_backend.cpp

  // ---- launches, timed when profiling ----
  template <class F>
  void op(const std::string& name, profile::Cost cost, F&& launch) {
    const double bytes = cost.bytes, flops = cost.flops;
    // An NVTX range per launch, so Nsight Systems timelines show kiln's op names (a few ns when
    // no tool listens). In a captured graph it marks the capture, not the replays.
    struct NvtxRange {
      explicit NvtxRange(const std::string& n) { nvtxRangePushA(n.c_str()); }
      ~NvtxRange() { nvtxRangePop(); }
    } nvtx_range(name);
    if (!profiling) return launch();
    if (cupti) {
      if (pending.empty()) cupti->start();
      pending.push_back({name, bytes, flops, nullptr, nullptr});
      cupti->begin_op(pending.size() - 1);
      launch();
      cupti->end_op();
      return;
    }
    while (event_pool.size() < events_used + 2) {  // at most two new events per launch
      cudaEvent_t e;
      KILN_CUDA_CHECK(cudaEventCreate(&e));
      event_pool.push_back(e);
    }
    // Consecutive launches share an event (this launch's start is the previous one's end): half
    // the event records, so the timing disturbs the step less.
    const bool first = pending.empty();
    cudaEvent_t a = first ? event_pool[events_used++] : pending.back().b;
    cudaEvent_t b = event_pool[events_used++];
    // First timed launch of a step: hold the GPU while the host queues the rest, so the kernels
    // run back to back (as from a graph) and the events time kernels, not launch gaps.
    if (first) {
      cuda::hold_stream(kProfileHoldMicroseconds, s());
      KILN_CUDA_CHECK(cudaEventRecord(a, s()));
    }
    launch();
    KILN_CUDA_CHECK(cudaEventRecord(b, s()));
    pending.push_back({name, bytes, flops, a, b});
  }

  void set_profiling(bool on) {
    profiling = on;
    if (!on) return;
    std::string why_not;
    const char* forced = std::getenv("KILN_PROFILE_TIMER");
    cupti = forced && std::string(forced) == "events" ? nullptr : cuda::CuptiKernelTimer::open(&why_not);
    timer_note = cupti ? "CUPTI kernel records"
                       : "CUDA events around each launch (" + (why_not.empty() ? "KILN_PROFILE_TIMER=events" : why_not) + ")";
  }

  void collect_timings() {  // after the stream is synchronized
    if (pending.empty()) return;
    std::vector<cuda::CuptiKernelTimer::OpTime> times;
    std::vector<cuda::CuptiKernelTimer::Span> spans;
    if (cupti) {
      times = cupti->stop(pending.size(), &spans);
      last_trace.clear();
      const uint64_t t0 = spans.empty() ? 0 : spans.front().start_ns;
      for (const auto& sp : spans)
        last_trace.push_back({pending[size_t(sp.op)].name, sp.kernel, double(sp.start_ns - t0) * 1e-3,
                              double(sp.end_ns - sp.start_ns) * 1e-3});
    }
    for (size_t i = 0; i < pending.size(); ++i) {
      const Pending& p = pending[i];
      float ms = 0;
      if (cupti)
        ms = float(times[i].ms);
      else
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, p.a, p.b));
      KernelStat& st = stats[p.name];
      st.name = p.name;
      st.calls += 1;
      st.total_ms += ms;
      if (cupti) st.idle_ms += times[i].idle_ms;
      st.bytes += p.bytes;
      st.flops += p.flops;
    }
    pending.clear();
    events_used = 0;
  }

  // The cost model's widths for a product with weight w (bytes a weight element costs, scales included).
  static profile::Widths weight_widths(const cuda::QWeight& w) {
    profile::Widths widths;
    widths.weight = cuda::qweight_bytes_per_weight(w.format, w.cols, w.group);
    return widths;
  }

  // The quantized products' scratch for activations `a` (their fp8 rows) and the dequantized W.
  cuda::QScratch qscratch_for(const cuda_backend::Activations& a) {
    cuda::QScratch scratch;
    scratch.w = qscratch.size() ? qscratch.data() : nullptr;
    scratch.w_elems = int64_t(qscratch.size());
    scratch.xq = a.xq;
    scratch.xs = a.xs;
    scratch.xq_bytes = a.rows * a.xq_cols;
    scratch.xs_rows = a.xq ? a.rows : 0;
    return scratch;
  }

  // y = in . W^T (+ bias) for m rows; W bf16 or quantized (cuda::qmatmul dispatches on its format).
  // a: the activations `in` / `out` belong to (their split-K and fp8 scratch).
  // xq_ready: an fp8 W's activations are already in a.xq / a.xs (norm_for wrote them).
  void linear(const char* what, const cuda_backend::Activations& a, const bf16* in, const cuda::QWeight& w,
              const bf16* bias, void* out, OutMode mode, int64_t m, bool xq_ready = false) {
    std::string name = std::string(what) + (m <= cuda::kGemvMaxRows ? ".gemv" : ".gemm");
    double out_bytes = mode == OutMode::store_bf16 ? 2 : mode == OutMode::store_f32 ? 4 : 8;  // add_f32: read + write
    const profile::Widths widths = weight_widths(w);
    cuda::QScratch scratch = qscratch_for(a);
    scratch.xq_ready = xq_ready;
    op(name, profile::linear(m, w.rows, w.cols, out_bytes, widths),
       [&] { cuda::qmatmul(in, w, bias, out, mode, m, s(), a.splitk, scratch); });
  }

  // The RMSNorm in front of projection `next`, into a.xn; for an fp8 `next` (session 11) with the
  // per-token activation quantization fused (cuda::rmsnorm_fp8: a.xq / a.xs, the bytes the norm
  // then fp8_quantize_rows write; a.xn is not written) and true returned: the product then skips
  // its own quantization. KILN_FP8_NORM_QUANT=0: the two kernels (same-run comparison).
  bool norm_for(const cuda_backend::Activations& a, const DeviceBuffer<bf16>& weight, const cuda::QWeight& next,
                int64_t n) {
    const int64_t H = c.hidden_size;
    if (n == 1 && (decode_probe() & kProbeSkipNorms)) return false;
    static const bool fuse = env_switch_on("KILN_FP8_NORM_QUANT");
    if (fuse && next.format == QuantFormat::fp8 && a.xq && a.xq_cols >= H && cuda::rmsnorm_fp8_fusable(H)) {
      profile::Cost cost = profile::rmsnorm(n, H);
      cost.bytes += -2.0 * double(n * H) + double(n * H) + 4.0 * double(n);  // out: e4m3 + a scale a row, not bf16
      op("rmsnorm+quant", cost, [&] {
        KILN_CHECK(cuda::rmsnorm_fp8(a.x, weight.data(), nullptr, a.xq, a.xs, n, H, c.rms_eps, s()), internal,
                   "rmsnorm_fp8 refused a row it takes");
      });
      return true;
    }
    op("rmsnorm", profile::rmsnorm(n, H), [&] { cuda::rmsnorm(a.x, nullptr, weight.data(), a.xn, n, H, c.rms_eps, s()); });
    return false;
  }

  // KILN_DECODE_PROBE (a bit mask; timing bounds only, the logits are WRONG): a one-token step
  // leaves out its attention (1), its layers' RMSNorm kernels (2) or its o GEMV (4), so tg128 says
  // what a step would gain if that kernel and its boundaries cost nothing (the upper bound of a
  // fusion that removes them; docs/performance/decode-boundaries.md, session 29). The weights' speed does
  // not depend on the values the skipped kernels would have written. Two bits leave the kernels and
  // time the step's host tail instead (session 40): 8 makes forward_last copy the logits on into a
  // vector as forward() does (the 40-60 µs a token forward_last saves on the H200's host), 16 skips
  // the decode graph's device-to-host copy of them (the caller reads stale logits; 0-0.8% of tg128).
  static constexpr int kProbeSkipAttention = 1, kProbeSkipNorms = 2, kProbeSkipO = 4;
  static constexpr int kProbeCopyLogits = 8, kProbeSkipReadback = 16;
  static int decode_probe() {
    static const int probe = [] {
      const int p = env_int("KILN_DECODE_PROBE", 0);
      if (p) std::fprintf(stderr, "KILN_DECODE_PROBE=%d: a timing probe (bits 1, 2, 4, 16: wrong logits)\n", p);
      return p;
    }();
    return probe;
  }

  // A batch-1 decode step runs each layer as 7 kernels instead of 9, RoPE (with the K/V write) and
  // SwiGLU folded into the qkv and gate/up GEMVs (gemv_fused.h; qmatmul.h for int8 / int4 weights).
  // Needs bf16, int8 or int4 projections (fp8 has no fused form) and a shape the pairing takes;
  // KILN_FUSED_DECODE=0 (or the option) turns it off, for comparison: the results are the same bits
  // (the RMSNorm fold below aside, which changes them).
  // Decided once, when the weights are in place (both constructors call decide_fused_decode).
  bool use_fused_decode = false;
  bool fused_decode_ok() const { return use_fused_decode; }
  void decide_fused_decode() {
    use_fused_decode = opt.fused_decode && env_switch_on("KILN_FUSED_DECODE") && c.intermediate_size % 8 == 0 &&
                       c.hidden_size % 8 == 0 &&
                       cuda::gemv_rope_kv_fusable(c.rope.rot_dim, int(c.head_dim), c.hidden_size);
    auto fusable = [](const cuda::DeviceWeight& w) {
      return w.format == QuantFormat::none || cuda::qgemv_fusable(w.view());
    };
    for (const cuda_backend::DeviceLayer& d : layers)
      use_fused_decode = use_fused_decode && fusable(d.w_qkv) && fusable(d.w_gu);
    norm_fold.on = use_fused_decode && opt.norm_fold && env_switch_on("KILN_NORM_FOLD") && c.hidden_size % 16 == 0;
    norm_fold.short_caches = true;
    for (const cuda_backend::DeviceLayer& d : layers) {
      norm_fold.on = norm_fold.on && fusable(d.wo) && fusable(d.w_down);
      norm_fold.short_caches = norm_fold.short_caches && d.wo.format != QuantFormat::none &&
                               d.w_down.format != QuantFormat::none;
    }
  }
  // The RMSNorms folded into the fused decode GEMVs, and where (norm_fold_rule.h); any layer's o or
  // down that the fused GEMVs cannot take (e.g. x too large to stage in shared memory) turns it off
  // for the whole model.
  cuda_backend::NormFoldRule norm_fold;
  // The batch-1 attention and o projection as one kernel (cuda::attention_o_fused, session 29)
  // where it applies: int4 o weights in groups of 128 in every layer, a single sequence's bf16
  // cache of at most 256 positions. KILN_ATTN_O_FUSED=1 turns it on: off by default, measured
  // slower than the separate kernels (H100, tg128 int4: -5.2% in session 29, -1.4% in session 30;
  // docs/performance/decode-boundaries.md); its workspace is allocated here, its counters zeroed once.
  // It runs only in unfolded steps (cuda_backend.cpp's attend): since session 46 int8 / int4 models
  // fold at every cache size, so with it on they need KILN_NORM_FOLD=0 (or KILN_NORM_FOLD_MIN=256).
  bool use_attn_o = false;
  DeviceBuffer<float> attn_o_partials;
  DeviceBuffer<uint32_t> attn_o_counters;
  void decide_attn_o() {
    use_attn_o = use_fused_decode && env_int("KILN_ATTN_O_FUSED", 0) == 1;
    for (const cuda_backend::DeviceLayer& d : layers)
      use_attn_o = use_attn_o && d.wo.format == QuantFormat::int4 && d.wo.group == 128;
    if (!use_attn_o) return;
    attn_o_partials = DeviceBuffer<float>(size_t(cuda::attention_o_partial_floats(int(c.n_kv_heads), c.hidden_size)));
    attn_o_counters = DeviceBuffer<uint32_t>(size_t(cuda::attention_o_counters(c.hidden_size)));
    KILN_CUDA_CHECK(cudaMemset(attn_o_counters.data(), 0, attn_o_counters.size() * sizeof(uint32_t)));
  }
  // Whether layer l's attention and o projection over `kv` (a single sequence of capacity max_kv_len)
  // run fused.
  bool attn_o_for(int64_t l, const cuda::KvLayout& kv, int64_t max_kv_len) const {
    return use_attn_o && cuda::attention_o_fusable(layers[size_t(l)].wo.view(), int(c.n_heads), int(c.n_kv_heads),
                                                   int(c.head_dim), kv, max_kv_len);
  }

  // Where a projection that applies RoPE itself (the fused qkv GEMV of one token, the qkv GEMM's
  // epilogue, cuda::gemm_rope_kv, of n) puts K/V: the tokens' positions and, for a paged pool, their
  // slots (device ints), and each layer's cache (contiguous, or the pool).
  struct RopedRows {
    const int32_t* positions = nullptr;
    const int32_t* slots = nullptr;
    std::function<cuda::KvLayout(int64_t layer)> kv_of;
  };
  // The fused decode GEMVs of one token (set: the layers run fused); rows: where its K/V go.
  struct FusedDecode {
    RopedRows rows;
    // false: only the gate/up GEMV is fused, the qkv GEMV is plain and attend(l) does RoPE and the
    // K/V write. A quantized cache took that path until session 37 (a vector's scale needs the
    // amax of a head the fused qkv GEMV spreads over head_dim / 16 blocks); now the head's last
    // block encodes it (cuda::KvQuantStage), unless KILN_FUSED_QKV_QUANT=0 (fused_decode_for).
    bool qkv = true;
    // The RMSNorms folded into the GEMVs (needs qkv), and when the folded o + norm GEMV lets
    // gate/up launch: as NormFoldRule decides.
    bool fold_norms = false;
    cuda::NextLaunch o_next = cuda::NextLaunch::after_wait;
  };
  // A batch-1 decode step's fused GEMVs writing K/V to `rows`, over a cache of max_kv_len positions:
  // the qkv GEMV fused with RoPE and the K/V write always for a bf16 cache, for an 8-bit one unless
  // KILN_FUSED_QKV_QUANT=0 (the same-binary comparison: the plain qkv GEMV and a quantizing rope_qkv
  // launch, the same bits); the folded norms (NormFoldRule) with bf16 caches only, the only ones
  // they were measured and tested with.
  FusedDecode fused_decode_for(const RopedRows& rows, bool quantized_cache, int64_t max_kv_len) const {
    static const bool quantized_qkv = env_switch_on("KILN_FUSED_QKV_QUANT");
    return {rows, !quantized_cache || quantized_qkv, !quantized_cache && norm_fold.folds(max_kv_len),
            norm_fold.o_next(max_kv_len)};
  }

  // Layer l's RoPE target for those rows: q into a.q, K/V into rows.kv_of(l).
  cuda::RopeKvTarget rope_target(const cuda_backend::Activations& a, const RopedRows& rows, int64_t l) const {
    return {rows.positions, rows.slots, inv_freq.data(), rope_table.data(), rope_positions, c.rope.rot_dim,
            c.rope.style == RopeStyle::interleaved, int(c.n_heads), int(c.n_kv_heads), int(c.head_dim), a.q,
            rows.kv_of(l), {kv_q8_values.data(), kv_q8_sync.data()}};
  }

  // The qkv product of n tokens with RoPE and the K/V write in its epilogue, where the GEMM takes it
  // (bf16 weights, Hopper, the shapes of gemm_rope_kv_ok); false where it does not (nothing enqueued).
  bool enqueue_qkv_rope(const cuda_backend::Activations& a, const cuda_backend::DeviceLayer& L, int64_t l,
                        const RopedRows& rows, int64_t n) {
    if (L.w_qkv.format != QuantFormat::none) return false;
    const int64_t H = c.hidden_size;
    const cuda::RopeKvTarget target = rope_target(a, rows, l);
    if (!cuda::gemm_rope_kv_ok(a.xn, L.w_qkv.bf16_data(), n, H, target)) return false;
    const bf16* bias = L.b_qkv.size() ? L.b_qkv.data() : nullptr;
    // The GEMM's weight and x bytes and FLOPs, and rope_qkv's writes (its qkv read never happens).
    profile::Cost cost = profile::linear(n, qkv_dim(), H, 0, weight_widths(L.w_qkv.view()));
    const profile::Cost rope = profile::rope_qkv(n, c, kv_widths(target.kv.quantized()));
    cost += profile::Cost{rope.bytes - 2.0 * double(n) * double(qkv_dim()), rope.flops};
    op("qkv+rope.gemm", cost, [&] {
      KILN_CHECK(cuda::gemm_rope_kv(a.xn, L.w_qkv.bf16_data(), bias, target, n, H, s()), internal,
                 "the qkv GEMM with RoPE refused operands it accepted");
    });
    return true;
  }

  // The embedding of n tokens (device ids) and every layer, in `a`. attend(l, roped) runs between
  // the qkv projection and the o projection: unless roped, it rotates q/k of a.qkv by position,
  // writes K/V into the cache; then it leaves the attention output in a.attn. With `fused` (n = 1),
  // the qkv GEMV has done the rotation and the K/V write already; with `roped_rows`, the qkv GEMM
  // has, where it could (roped = true). attend returns true when it has run the o projection too
  // (the fused attention + o kernel), false otherwise.
  template <class Attend>
  void enqueue_layers(const cuda_backend::Activations& a, const int32_t* tokens, int64_t n, Attend&& attend,
                      const FusedDecode* fused = nullptr, const RopedRows* roped_rows = nullptr) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    op("embed", profile::embed(n, H), [&] { cuda::embed_gather(embed.data(), tokens, a.x, n, H, s()); });
    const bool fold = fused && fused->qkv && fused->fold_norms;
    const cuda::NormApply folded{a.norm_sumsq, int(H / 16), c.rms_eps};
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const cuda_backend::DeviceLayer& L = layers[size_t(l)];
      const bf16* b_qkv = L.b_qkv.size() ? L.b_qkv.data() : nullptr;
      // With the fold, the previous layer's down GEMV left this norm's z in a.xn.
      const bool qkv_folded = fold && l > 0;
      const bool qkv_in_ready = qkv_folded ? false : norm_for(a, L.attn_norm, L.w_qkv.view(), n);
      bool roped = false;
      if (fused && fused->qkv) {
        const cuda::RopeKvTarget target = rope_target(a, fused->rows, l);
        profile::Cost cost = profile::linear(1, qkv_dim(), H, 2, weight_widths(L.w_qkv.view()));
        cost += profile::rope_qkv(1, c, kv_widths(target.kv.quantized()));  // an 8-bit cache: 1 byte a K/V value
        op("qkv+rope.gemv", cost, [&] {
          const cuda::NormApply norm = qkv_folded ? folded : cuda::NormApply{};
          if (L.w_qkv.format == QuantFormat::none)
            cuda::gemv_rope_kv(a.xn, L.w_qkv.bf16_data(), b_qkv, target, H, s(), norm);
          else
            cuda::qgemv_rope_kv(a.xn, L.w_qkv.view(), b_qkv, target, s(), norm);
        });
      } else {
        roped = roped_rows && enqueue_qkv_rope(a, L, l, *roped_rows, n);
        if (!roped) linear("qkv", a, a.xn, L.w_qkv.view(), b_qkv, a.qkv, OutMode::store_bf16, n, qkv_in_ready);
      }
      const bool o_done = attend(l, roped);
      if (!o_done && fold)
        linear_add_norm("o", a, a.attn, L.wo, L.ffn_norm, fused->o_next);
      else if (!o_done && !(n == 1 && (decode_probe() & kProbeSkipO)))
        linear("o", a, a.attn, L.wo.view(), nullptr, a.x, OutMode::add_f32, n);
      cuda::QScratch gu_scratch = qscratch_for(a);
      gu_scratch.xq_ready = fold ? false : norm_for(a, L.ffn_norm, L.w_gu.view(), n);
      if (fused) {
        profile::Cost cost = profile::linear(1, 2 * I, H, 2, weight_widths(L.w_gu.view()));
        cost += profile::silu_mul(1, I);
        op("gate_up+silu.gemv", cost, [&] {
          const cuda::NormApply norm = fold ? folded : cuda::NormApply{};
          if (L.w_gu.format == QuantFormat::none)
            cuda::gemv_swiglu(a.xn, L.w_gu.bf16_data(), a.h, I, H, s(), norm);
          else
            cuda::qgemv_swiglu(a.xn, L.w_gu.view(), a.h, I, s(), norm);
        });
      } else if (L.w_gu.format == QuantFormat::none && cuda::gemm_swiglu_ok(a.xn, L.w_gu.bf16_data(), a.h, n, I, H)) {
        // Prefill and batched decode on Hopper: SwiGLU in the gate/up GEMM's epilogue (the same
        // bits; the (n, 2I) gate|up rows never go through memory). Output bytes: h, n x I bf16,
        // i.e. 1 byte per column of the (n, 2I) product.
        op("gate_up+silu.gemm", profile::linear(n, 2 * I, H, 1), [&] {
          KILN_CHECK(cuda::gemm_swiglu(a.xn, L.w_gu.bf16_data(), a.h, n, I, H, s()), internal,
                     "the fused gate/up GEMM refused operands it accepted");
        });
      } else if (L.w_gu.format == QuantFormat::fp8 &&
                 cuda::fp8_gemm_swiglu_can_run(a.xn, L.w_gu.view(), a.h, n, I, gu_scratch)) {
        // The same with fp8 weights (session 11): the activations quantized per token (by the
        // norm, or here), then the fp8 gate/up GEMM with SwiGLU in its epilogue (the unfused fp8
        // pair's bits).
        op("gate_up+silu.gemm", profile::linear(n, 2 * I, H, 1, weight_widths(L.w_gu.view())), [&] {
          KILN_CHECK(cuda::fp8_gemm_swiglu(a.xn, L.w_gu.view(), a.h, n, I, s(), gu_scratch), internal,
                     "the fused fp8 gate/up GEMM refused operands it accepted");
        });
      } else {
        linear("gate_up", a, a.xn, L.w_gu.view(), nullptr, a.gu, OutMode::store_bf16, n, gu_scratch.xq_ready);
        op("silu_mul", profile::silu_mul(n, I), [&] { cuda::silu_mul(a.gu, a.h, n, I, s()); });
      }
      if (fold && l + 1 < c.n_layers)
        linear_add_norm("down", a, a.h, L.w_down, layers[size_t(l + 1)].attn_norm);
      else
        linear("down", a, a.h, L.w_down.view(), nullptr, a.x, OutMode::add_f32, n);
    }
  }

  // One token's o or down product added into the residual a.x, with the first half of the RMSNorm
  // `norm` after it (cuda::NormProduce: its z into a.xn, its tile partials into a.norm_sumsq).
  void linear_add_norm(const char* what, const cuda_backend::Activations& a, const bf16* in,
                       const cuda::DeviceWeight& w, const DeviceBuffer<bf16>& norm,
                       cuda::NextLaunch next = cuda::NextLaunch::after_wait) {
    const int64_t H = c.hidden_size;
    profile::Cost cost = profile::linear(1, w.rows, w.cols, 8, weight_widths(w.view()));
    cost.bytes += 2.0 * double(H) + 2.0 * double(H) + 4.0 * double(H / 16);  // norm weight, z, partials
    const cuda::NormProduce out{norm.data(), a.xn, a.norm_sumsq};
    op(std::string(what) + "+norm.gemv", cost, [&] {
      if (w.format == QuantFormat::none)
        cuda::gemv_add_norm(in, w.bf16_data(), a.x, out, w.rows, w.cols, s(), next);
      else
        cuda::qgemv_add_norm(in, w.view(), a.x, out, s(), next);
    });
  }

  // ---- the decode megakernel (kernels/cuda/megakernel/decode_megakernel.h) ----
  // When asked (CudaBackendOptions::megakernel, or KILN_MEGAKERNEL=1; KILN_MEGAKERNEL=0 overrides
  // both), a single-sequence batch-1 step with a bf16 cache runs its layers as one persistent kernel
  // where the model takes it: every projection bf16, int8 per channel or int4 in groups of 128
  // (one format), head_dim 128, an sm_90 device. Decided once, when the weights are in place;
  // megakernel_note says why not (docs/performance/megakernel.md has the same-binary comparison).
  bool use_megakernel = false;
  std::string megakernel_note;
  cuda::MegakernelModel mk_model;
  DeviceBuffer<cuda::MegakernelLayer> mk_layers;
  DeviceBuffer<float> mk_ws, mk_part_ffn;
  DeviceBuffer<bf16> mk_z_ffn;
  DeviceBuffer<uint32_t> mk_sync;
  // KILN_MEGAKERNEL_TRACE=1: every step records where its time went (megakernel_trace_summary).
  DeviceBuffer<uint64_t> mk_trace;

  void decide_megakernel();  // cuda_megakernel.cpp
  // The megakernel's step over the single-sequence cache `kv` (layer 0's K and V, layers
  // kv_layer_stride elements apart): the embedded token in a.x, the last layer's residual left there.
  void enqueue_megakernel(const cuda_backend::Activations& a, const int32_t* position, bf16* k, bf16* v,
                          int64_t kv_layer_stride, int64_t past);  // cuda_megakernel.cpp

  // ---- the quantized KV cache (--kv-cache int8|fp8, kv_quant.h) ----
  // How caches made from now on store K/V (set from Backend::kv_cache_format by new_sequence and
  // new_kv_pool).
  static cuda::KvQuant kv_quant_of(KvCacheFormat f) {
    return f == KvCacheFormat::int8 ? cuda::KvQuant::int8 : f == KvCacheFormat::fp8 ? cuda::KvQuant::fp8 : cuda::KvQuant::none;
  }
  // The cost model's K/V bytes per value: 2 (bf16), or 1 + the scale's 4 bytes per head_dim values.
  profile::Widths kv_widths(bool quantized) const {
    profile::Widths w;
    if (quantized) w.kv = 1.0 + 4.0 / double(c.head_dim);
    return w;
  }
  // Prefill over a quantized cache: positions 0 .. end - 1 of sequence `seq` of kv (a block-table
  // row when paged) dequantized into kv_scratch, as the contiguous bf16 layout attention_prefill
  // reads (its wgmma version included). Prefill attention is compute-bound, so one more pass over
  // the cached positions costs little (PERFORMANCE.md, session 5); the scratch holds one sequence
  // of one layer (or, in a batched step, the compact copy of all its prefill chunks: cuda_batch.cpp)
  // and is reused layer after layer (stream order). Never called inside a graph capture.
  DeviceBuffer<bf16> kv_scratch;  // (2, positions, kv_dim): K then V
  // kv_scratch holding at least 2 x positions x kv_dim values (grown to a power of two >= 2048
  // positions; the stream is synchronized first, as the old scratch may still be read).
  bf16* kv_scratch_for(int64_t positions);                                           // cuda_backend.cpp
  cuda::KvLayout dequantized(const cuda::KvLayout& kv, int64_t seq, int64_t end);   // cuda_backend.cpp
  // The cost model's bytes of dequantizing `positions` cached positions: 1 byte a value read and 2
  // written, K and V, and their scales (dequantized, and the batched steps' kv_dequantize_rows).
  profile::Cost kv_dequantize_cost(int64_t positions) const {
    return profile::Cost{double(positions * c.kv_dim()) * 2 * (1 + 2) + double(positions * c.n_kv_heads) * 2 * 4, 0};
  }

  // The greedy head (session 34): lm_head and the argmax in one GEMM whose epilogue keeps each row's
  // best column (matmul.h's gemm_argmax), no logits. head_argmax_ok: where it runs (a bf16 head, the
  // rows and shapes gemm_argmax takes). parts: cuda::gemm_argmax_parts(rows, vocab) pairs of scratch.
  struct GreedyHead {
    float2* parts;
    int32_t* ids;  // (rows) out
  };
  bool head_argmax_ok(const cuda_backend::Activations& a, int64_t n_out) const {
    const cuda::QWeight w = output_weight();
    return w.format == QuantFormat::none &&
           cuda::gemm_argmax_ok(a.xn, static_cast<const bf16*>(w.data), n_out, w.rows, w.cols);
  }

  // Final norm and lm_head of n_out residual rows starting at x_rows: a.logits (n_out, vocab), or
  // with `greedy` (where head_argmax_ok) only each row's id.
  void enqueue_head(const cuda_backend::Activations& a, float* x_rows, int64_t n_out,
                    const GreedyHead* greedy = nullptr) {
    const int64_t H = c.hidden_size;
    op("rmsnorm", profile::rmsnorm(n_out, H),
       [&] { cuda::rmsnorm(x_rows, nullptr, final_norm.data(), a.xn, n_out, H, c.rms_eps, s()); });
    const cuda::QWeight w = output_weight();
    if (!greedy) {
      linear("lm_head", a, a.xn, w, nullptr, a.logits, OutMode::store_f32, n_out);
      return;
    }
    // Out: one 8-byte pair a row per 256 columns; the ids' reduction is in the same op.
    op("lm_head+argmax.gemm", profile::linear(n_out, w.rows, w.cols, 8.0 / double(cuda::kGemmArgmaxTileCols), {}),
       [&] {
         KILN_CHECK(cuda::gemm_argmax(a.xn, static_cast<const bf16*>(w.data), greedy->parts, greedy->ids, n_out, w.rows,
                                      w.cols, s()),
                    internal, "gemm_argmax refused rows it takes");
       });
  }
};

}  // namespace kiln
