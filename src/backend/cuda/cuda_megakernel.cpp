// The CUDA backend's decode megakernel (kernels/cuda/megakernel/decode_megakernel.h): deciding once
// whether the model takes it, and enqueuing a single-sequence decode step through it.
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/env.h"

namespace kiln {

void CudaBackend::Impl::decide_megakernel() {
  use_megakernel = false;
  const int forced = env_int("KILN_MEGAKERNEL", -1);
  if (forced == 0 || (!opt.megakernel && forced != 1)) {
    megakernel_note = "off (CudaBackendOptions::megakernel, KILN_MEGAKERNEL=1 turns it on)";
    return;
  }
  if (layers.empty()) {
    megakernel_note = "no layers";
    return;
  }
  const QuantFormat f = layers[0].w_qkv.format;
  std::vector<cuda::MegakernelLayer> table;
  for (const cuda_backend::DeviceLayer& d : layers) {
    cuda::MegakernelLayer t;
    const cuda::DeviceWeight* ws[4] = {&d.w_qkv, &d.wo, &d.w_gu, &d.w_down};
    for (int i = 0; i < 4; ++i) {
      const cuda::DeviceWeight& w = *ws[i];
      const bool group_ok = f == QuantFormat::none || (f == QuantFormat::int8 && w.group == w.cols) ||
                            (f == QuantFormat::int4 && w.group == 128);
      if (w.format != f || !group_ok) {
        megakernel_note = "the projections are not all bf16, int8 per channel or int4 in groups of 128";
        return;
      }
      t.w[i] = w.data.data();
      t.scales[i] = w.scales.size() ? reinterpret_cast<const float2*>(w.scales.data()) : nullptr;
    }
    t.attn_norm = d.attn_norm.data();
    t.ffn_norm = d.ffn_norm.data();
    t.b_qkv = d.b_qkv.size() ? d.b_qkv.data() : nullptr;
    table.push_back(t);
  }
  cuda::MegakernelModel mm;
  mm.format = f;
  mm.n_layers = int(c.n_layers);
  mm.hidden = c.hidden_size;
  mm.inter = c.intermediate_size;
  mm.n_heads = int(c.n_heads);
  mm.n_kv_heads = int(c.n_kv_heads);
  mm.head_dim = int(c.head_dim);
  mm.rot_dim = c.rope.rot_dim;
  mm.interleaved = c.rope.style == RopeStyle::interleaved;
  mm.eps = c.rms_eps;
  mk_layers = DeviceBuffer<cuda::MegakernelLayer>(std::span<const cuda::MegakernelLayer>(table));
  mm.layers = mk_layers.data();
  megakernel_note = cuda::megakernel_unsupported(mm);
  if (!megakernel_note.empty()) return;
  mk_model = mm;
  mk_ws = DeviceBuffer<float>(size_t(cuda::megakernel_workspace_floats(mm)));
  mk_sync = DeviceBuffer<uint32_t>(size_t(cuda::megakernel_sync_words(mm)));
  mk_z_ffn = DeviceBuffer<bf16>(size_t(c.hidden_size));
  mk_part_ffn = DeviceBuffer<float>(size_t(c.hidden_size / 16));
  if (env_int("KILN_MEGAKERNEL_TRACE", 0) != 0)
    mk_trace = DeviceBuffer<uint64_t>(size_t(cuda::megakernel_trace_words(mm)));
  use_megakernel = true;
}

void CudaBackend::Impl::enqueue_megakernel(const cuda_backend::Activations& a, const int32_t* position, bf16* k,
                                           bf16* v, int64_t kv_layer_stride, int64_t past) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  profile::Cost cost;
  for (const cuda_backend::DeviceLayer& L : layers) {
    cost += profile::linear(1, qkv_dim(), H, 2, weight_widths(L.w_qkv.view()));
    cost += profile::rope_qkv(1, c);
    cost += profile::attention(1, past, c, kv_widths(false));
    cost += profile::linear(1, H, c.q_dim(), 8, weight_widths(L.wo.view()));
    cost += profile::linear(1, 2 * I, H, 2, weight_widths(L.w_gu.view()));
    cost += profile::silu_mul(1, I);
    cost += profile::linear(1, H, I, 8, weight_widths(L.w_down.view()));
  }
  cuda::MegakernelStep st;
  st.position = position;
  st.k = k;
  st.v = v;
  st.kv_layer_stride = kv_layer_stride;
  st.inv_freq = inv_freq.data();
  st.cos_sin = rope_table.data();
  st.cos_sin_positions = rope_positions;
  st.x = a.x;
  st.z_attn = a.xn;
  st.z_ffn = mk_z_ffn.data();
  st.part_attn = a.norm_sumsq;
  st.part_ffn = mk_part_ffn.data();
  st.q = a.q;
  st.attn = a.attn;
  st.h = a.h;
  st.attn_ws = mk_ws.data();
  st.sync = mk_sync.data();
  st.trace = mk_trace.size() ? mk_trace.data() : nullptr;
  op("decode.megakernel", cost, [&] { cuda::decode_megakernel(mk_model, st, s()); });
}

bool CudaBackend::uses_megakernel() const { return impl_->use_megakernel; }
std::string CudaBackend::megakernel_note() const { return impl_->megakernel_note; }

std::string CudaBackend::megakernel_trace_report() const {
  const Impl& m = *impl_;
  if (!m.use_megakernel || !m.mk_trace.size()) return "";
  KILN_CUDA_CHECK(cudaStreamSynchronize(m.s()));
  const std::vector<uint64_t> t = m.mk_trace.to_host();
  return cuda::megakernel_trace_summary(m.mk_model, t.data());
}

}  // namespace kiln
