// Where a key or value vector lives in the cache: the one place that knows the KV addressing.
// Every kernel goes through KvLayout::offset (or offset_as<kPaged> in templated hot loops).
//
// Two forms, told apart by `block_table` (uniform over a launch):
//
//  * contiguous (block_table == nullptr): each sequence's cache is contiguous per layer,
//    (capacity, n_kv_heads, head_dim) for K and the same for V, and a batch of sequences is
//    `seq_stride` elements apart (KvSequence; batched decode in the kernel lab).
//
//  * paged (block_table != nullptr): the layer's K and V are each a pool of slots,
//        k, v: (num_blocks + 1, block_size, n_kv_heads, head_dim) bf16
//    i.e. slot s = block * block_size + offset is the row s * pos_stride (pos_stride =
//    n_kv_heads * head_dim). The last block (id num_blocks) is scratch: padded entries of a
//    CUDA-graph batch point at it and write there, so they never touch a real sequence's blocks.
//        block_table: (batch, bt_stride) int32, device memory; row `seq` lists the blocks of
//                     sequence `seq`: position p lives in block block_table[seq * bt_stride +
//                     p / block_size], offset p % block_size.
//    block_size = 1 << block_shift (a power of two). seq_stride is unused.
//    Block ids are trusted here: the host (Backend::forward_batch) validates them.
//
// Quantized caches (quant != KvQuant::none, `--kv-cache int8|fp8`): k and v are null; k8 / v8
// hold one byte per value (int8, or fp8 E4M3) and k_scale / v_scale one fp32 scale per (position
// or slot, kv head), value = byte * scale. Both are head-major: the vector of (position, kv head)
// is number
//    contiguous: i = seq * scale_seq_stride + kv_head * scale_head_stride + pos
//    paged:      i = kv_head * scale_head_stride + slot
// its scale is k_scale[i] and its bytes k8[i * head_dim ..] (quant_index_as). So one head's
// consecutive positions are consecutive in memory (a paged block of 16 positions: 16 x head_dim
// bytes in one run), and a decode warp's 16 rows are one 2 KB run instead of 16 runs of 128 bytes
// 1 KB apart. (Measured: the same decode times as the position-major order of the bf16 cache --
// the kernel is not limited by its access pattern, PERFORMANCE.md session 5 -- kept because it
// makes bytes and scales one index.) pos_stride and seq_stride are unused in this form.
// Only the kernels of kv_quant.h and attention_decode_q8 read or write this form; the bf16
// kernels take k == nullptr as a misuse and the backend never hands them a quantized layout.
#pragma once

#include "kernels/cuda/common.h"

namespace kiln::cuda {

enum class KvQuant : uint8_t { none, int8, fp8 };  // fp8 = E4M3, amax scaled to 448

struct KvLayout {
  bf16* k = nullptr;         // this layer's keys of sequence 0 (contiguous) or slot 0 (paged)
  bf16* v = nullptr;         // this layer's values, same
  int64_t seq_stride = 0;    // contiguous: elements from one sequence's cache to the next
  int64_t pos_stride = 0;    // elements from one position (slot) to the next (= n_kv_heads * head_dim)
  int head_dim = 0;
  // Paged form only (block_table == nullptr: contiguous).
  const int32_t* block_table = nullptr;  // (batch, bt_stride) device int32
  int64_t bt_stride = 0;                 // entries per block-table row
  int block_shift = 0;                   // log2(block_size)

  // Quantized form only (see above).
  KvQuant quant = KvQuant::none;
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  int64_t scale_seq_stride = 0;   // contiguous: floats from one sequence's scales to the next
  int64_t scale_head_stride = 0;  // floats from one kv head's scales to the next

  KILN_HD bool paged() const { return block_table != nullptr; }
  KILN_HD bool quantized() const { return quant != KvQuant::none; }

  // Element offset of (sequence, position, kv head) from k (or v) in the given form; hot loops
  // pick the form at compile time so the contiguous path keeps its exact code.
  template <bool kPaged>
  KILN_HD int64_t offset_as(int seq, int64_t pos, int kv_head) const {
    if constexpr (kPaged) {
      const int64_t block = block_table[int64_t(seq) * bt_stride + (pos >> block_shift)];
      const int64_t slot = (block << block_shift) | (pos & ((int64_t(1) << block_shift) - 1));
      return slot * pos_stride + int64_t(kv_head) * head_dim;
    } else {
      return int64_t(seq) * seq_stride + pos * pos_stride + int64_t(kv_head) * head_dim;
    }
  }
  KILN_HD int64_t offset(int seq, int64_t pos, int kv_head) const {
    return paged() ? offset_as<true>(seq, pos, kv_head) : offset_as<false>(seq, pos, kv_head);
  }
  // Element offset of a slot (paged) for a kv head: where the slot-mapped K/V write goes.
  KILN_HD int64_t slot_offset(int64_t slot, int kv_head) const { return slot * pos_stride + int64_t(kv_head) * head_dim; }
  // Vector number of (sequence, position, kv head) in the quantized form: its scale's index, and
  // its bytes' offset divided by head_dim.
  template <bool kPaged>
  KILN_HD int64_t quant_index_as(int seq, int64_t pos, int kv_head) const {
    if constexpr (kPaged) {
      const int64_t block = block_table[int64_t(seq) * bt_stride + (pos >> block_shift)];
      return int64_t(kv_head) * scale_head_stride + ((block << block_shift) | (pos & ((int64_t(1) << block_shift) - 1)));
    } else {
      return int64_t(seq) * scale_seq_stride + int64_t(kv_head) * scale_head_stride + pos;
    }
  }
  KILN_HD int64_t slot_quant_index(int64_t slot, int kv_head) const { return int64_t(kv_head) * scale_head_stride + slot; }
};

// The paged view of sequence row `row` of a block table: the same pool, the table advanced by row
// rows (a prefill entry is "sequence 0" of its own view).
KILN_HD KvLayout kv_row_view(KvLayout kv, int64_t row) {
  if (kv.block_table) kv.block_table += row * kv.bt_stride;
  return kv;
}

}  // namespace kiln::cuda
