// kiln logits: the model's logits at every position of a token sequence, printed as top-k
// lists or saved as a float32 .npy of shape (tokens, vocab). The hook for golden tests.
#include <cstdio>
#include <numeric>

#include <fmt/core.h>

#include "commands.h"
#include "common.h"
#include "core/check.h"

namespace kiln::cli {
namespace {

struct LogitsOptions {
  ModelOptions m{"", "cpu", 0, ""};  // the CPU reference by default: this command feeds tests
  std::string prompt, tokens, npy;
  int32_t top = 5;
};

// NumPy .npy v1.0: magic, header length, a Python dict literal padded to 64 bytes, raw data.
void write_npy(const std::string& path, const std::vector<float>& data, size_t rows, size_t cols) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  FILE* f = std::fopen(path.c_str(), "wb");
  KILN_CHECK(f, io, "cannot write '{}'", path);
  uint16_t len = uint16_t(header.size());
  std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  std::fwrite(&len, 2, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  size_t written = std::fwrite(data.data(), 4, data.size(), f);
  bool ok = std::fclose(f) == 0 && written == data.size();
  KILN_CHECK(ok, io, "short write to '{}'", path);
}

void run(const LogitsOptions& o) {
  ThreadPool pool(o.m.threads);
  LoadedModel model = load_with_progress(resolve_model_path(o.m.model), pool);
  std::vector<int32_t> ids;
  if (o.tokens.empty()) {
    const Tokenizer& tokenizer = require_tokenizer(model);  // --tokens works without one
    ids = tokenizer.encode(o.prompt, tokenizer.add_bos_default(), true);
  } else {
    ids = parse_token_ids(o.tokens, "--tokens");
  }
  KILN_CHECK(!ids.empty(), invalid_argument, "no tokens: pass --tokens or -p");
  auto backend = make_backend(o.m, model, pool);
  auto seq = backend->new_sequence(int64_t(ids.size()));
  std::vector<float> logits;
  backend->forward(*seq, ids, true, logits);
  size_t vocab = size_t(backend->config().vocab_size);
  if (!o.npy.empty()) {
    write_npy(o.npy, logits, ids.size(), vocab);
    fmt::print(stderr, "kiln: wrote ({}, {}) logits to {}\n", ids.size(), vocab, o.npy);
    return;
  }
  std::vector<int32_t> order(vocab);
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = logits.data() + t * vocab;
    std::iota(order.begin(), order.end(), 0);
    size_t k = std::min(vocab, size_t(std::max(o.top, 1)));
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(k), order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    fmt::print("{}\t{}", t, ids[t]);
    for (size_t i = 0; i < k; ++i) fmt::print("\t{}:{:.4f}", order[i], row[order[i]]);
    fmt::print("\n");
  }
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand("logits", "Print or save the logits at every position of a token sequence");
  add_model_options(cmd, o->m);
  cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize (special tokens are parsed)");
  cmd->add_option("--tokens", o->tokens, "Comma-separated token ids (instead of -p)");
  cmd->add_option("--npy", o->npy, "Save all logits as float32 .npy (tokens, vocab)");
  cmd->add_option("--top", o->top, "Top entries printed per position")->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
