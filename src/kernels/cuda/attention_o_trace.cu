// KILN_ATTN_O_TRACE=1: the fused attention + o kernel's per-block records (attention_o_trace.h).
#include "kernels/cuda/attention_o_trace.h"

#include <cstdio>
#include <vector>

#include "core/env.h"

namespace kiln::cuda {
namespace {

using T = AttnOTrace;

bool trace_on() {
  static const bool on = env_int("KILN_ATTN_O_TRACE", 0) == 1;
  return on;
}

}  // namespace

void attention_o_trace_prepare() {
  if (trace_on()) block_trace_ring<T>().prepare();
}

uint64_t* attention_o_trace_next_slot() { return trace_on() ? block_trace_ring<T>().next_slot() : nullptr; }

std::string attention_o_trace_report() {
  if (!trace_on()) return "";
  int used = 0;
  const std::vector<uint64_t> h = block_trace_ring<T>().snapshot(&used);
  const double ghz = block_trace_ghz(h, T::kWords);
  if (used == 0 || ghz <= 0) return "";
  const auto med = block_trace_median;
  auto at_ns = [&](const uint64_t* r, int word) { return block_trace_ns(r, word, ghz); };
  std::vector<double> lead, first_tile, attention, product, exchange, blocks_n;
  BlockTraceSpread spread;
  for (int slot = 0; slot < used; ++slot) {
    std::vector<double> waits, exits;
    for (int b = 0; b < T::kBlocks; ++b) {
      const uint64_t* r = block_trace_record<T>(h, slot, b);
      if (r[kTraceExit] == 0 || r[T::kAfterWait] == 0 || r[T::kFirstTile] == 0 || r[T::kProduct] == 0) continue;
      waits.push_back(at_ns(r, T::kAfterWait));
      exits.push_back(double(r[kTraceExitNs]));
      lead.push_back((at_ns(r, T::kAfterWait) - double(r[kTraceEntryNs])) / 1000.0);
      first_tile.push_back((at_ns(r, T::kFirstTile) - at_ns(r, T::kAfterWait)) / 1000.0);
      attention.push_back((at_ns(r, T::kMerged) - at_ns(r, T::kFirstTile)) / 1000.0);
      product.push_back((at_ns(r, T::kProduct) - at_ns(r, T::kMerged)) / 1000.0);
      exchange.push_back((double(r[kTraceExitNs]) - at_ns(r, T::kProduct)) / 1000.0);
    }
    if (waits.empty()) continue;
    spread.add(waits, exits);
    blocks_n.push_back(double(waits.size()));
  }
  const int launches = int(blocks_n.size());
  if (launches == 0) return "";
  char head[200];
  std::snprintf(head, sizeof head,
                "attention + o trace (KILN_ATTN_O_TRACE): %d launches of %.0f blocks, SM clock %.2f GHz; medians, us:\n",
                launches, med(blocks_n), ghz);
  std::string text = head;
  block_trace_line(text, "a block resident before its wait returned", {med(lead)});
  block_trace_line(text, "the launch's wait returns, last - first", {med(spread.waits)});
  block_trace_line(text, "q and its first tile in shared memory after it", {med(first_tile)});
  block_trace_line(text, "then the attention (tiles, merge, x sums)", {med(attention)});
  block_trace_line(text, "then the product with its o weights", {med(product)});
  block_trace_line(text, "then the partials' exchange to its exit", {med(exchange)});
  block_trace_line(text, "exits after the first wait return: 50 / 90 / 100%",
                   {med(spread.exit50), med(spread.exit90), med(spread.exit_last)});
  return text;
}

}  // namespace kiln::cuda
