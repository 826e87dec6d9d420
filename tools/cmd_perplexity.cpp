// kiln perplexity -m MODEL -f TEXT [-c N_CTX] [--chunks N] [--save-logits FILE | --kl-base FILE]:
// perplexity as llama-perplexity computes it, and the KL divergence of this model's next-token
// distribution from a base model's.
//
// The text is tokenized whole (with BOS when the model adds one) and cut into non-overlapping
// windows of n_ctx tokens; each window is a fresh sequence whose first token becomes BOS when the
// model adds one, and only the second half is scored (positions n_ctx/2 .. n_ctx-2 predict the
// next token), so every scored token sees at least n_ctx/2 tokens of context. --save-logits stores
// the scored tokens' log-probabilities (quant/kl_divergence.h; ~98 KB a token for a 49k
// vocabulary); a later run with --kl-base reads them and reports mean and p99 KL and how often the
// top-1 token agrees.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "core/check.h"
#include "quant/kl_divergence.h"

namespace kiln::cli {
namespace {

struct PerplexityOptions {
  ModelOptions m{"", "cpu", 0, ""};
  std::string file, save_logits, kl_base, json;
  int32_t ctx = 512, chunks = -1;
};

// The base-logits file: a header naming the run, the tokens of every window, then one
// LogProbRecord per scored token, window by window.
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'L', 'B', '1'};
struct Header {
  char magic[8];
  uint32_t vocab, n_ctx, n_chunks, first;
};

class LogitsFile {
 public:
  static LogitsFile create(const std::string& path, const Header& h, const std::vector<int32_t>& tokens) {
    LogitsFile f(std::fopen(path.c_str(), "wb"), path);
    KILN_CHECK(f.f_, io, "cannot create '{}'", path);
    f.write(&h, sizeof h);
    f.write(tokens.data(), tokens.size() * 4);
    return f;
  }
  static LogitsFile open(const std::string& path, Header& h, std::vector<int32_t>& tokens) {
    LogitsFile f(std::fopen(path.c_str(), "rb"), path);
    KILN_CHECK(f.f_, io, "cannot read --kl-base '{}'", path);
    f.read(&h, sizeof h);
    KILN_CHECK(std::equal(kMagic, kMagic + 8, h.magic), invalid_argument,
               "'{}' is not a file written by kiln perplexity --save-logits", path);
    KILN_CHECK(h.n_chunks > 0 && h.n_ctx >= 2 && h.n_ctx <= (1u << 24), invalid_argument, "'{}': corrupt header", path);
    tokens.resize(size_t(h.n_chunks) * h.n_ctx);
    f.read(tokens.data(), tokens.size() * 4);
    return f;
  }
  LogitsFile(LogitsFile&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) { o.f_ = nullptr; }
  ~LogitsFile() {
    if (f_) std::fclose(f_);
  }
  void write(const void* p, size_t n) {
    KILN_CHECK(std::fwrite(p, 1, n, f_) == n, io, "writing '{}' failed (disk full?)", path_);
  }
  void read(void* p, size_t n) {
    KILN_CHECK(std::fread(p, 1, n, f_) == n, invalid_argument, "'{}' is truncated", path_);
  }
  void close() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    KILN_CHECK(ok, io, "closing '{}' failed", path_);
  }

 private:
  LogitsFile(FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  FILE* f_;
  std::string path_;
};

void run(const PerplexityOptions& o) {
  using clock = std::chrono::steady_clock;
  KILN_CHECK(o.save_logits.empty() || o.kl_base.empty(), invalid_argument,
             "--save-logits and --kl-base exclude each other (save from the base model, compare the others)");
  KILN_CHECK(o.ctx >= 4, invalid_argument, "-c/--ctx-size must be at least 4, got {}", o.ctx);
  KILN_CHECK(!o.file.empty(), invalid_argument, "no text: pass -f FILE");
  const std::string text = read_text_file(o.file, "text");

  ThreadPool pool(o.m.threads);
  LoadedModel model = load_with_progress(resolve_model_path(o.m.model), pool);
  const Tokenizer& tokenizer = require_tokenizer(model);
  KILN_CHECK(o.ctx <= model.config.context_length, invalid_argument, "-c {} exceeds the model's context of {}", o.ctx,
             model.config.context_length);
  const bool add_bos = tokenizer.add_bos_default();
  auto t_tok = clock::now();
  std::vector<int32_t> tokens = tokenizer.encode(text, add_bos, false);
  fmt::print(stderr, "kiln perplexity: tokenized {} bytes into {} tokens in {:.1f} s\n", text.size(), tokens.size(),
             std::chrono::duration<double>(clock::now() - t_tok).count());
  const int64_t n_ctx = o.ctx;
  KILN_CHECK(int64_t(tokens.size()) >= 2 * n_ctx, invalid_argument,
             "'{}' has {} tokens; perplexity needs at least 2 * n_ctx = {} (use a longer text or a smaller -c)", o.file,
             tokens.size(), 2 * n_ctx);
  const int64_t n_chunk_max = int64_t(tokens.size()) / n_ctx;
  const int64_t n_chunk = o.chunks < 0 ? n_chunk_max : std::min<int64_t>(o.chunks, n_chunk_max);
  KILN_CHECK(n_chunk > 0, invalid_argument, "--chunks must be positive, got {}", o.chunks);
  const int64_t first = n_ctx / 2, n_scored = n_ctx - 1 - first;
  const size_t vocab = size_t(model.config.vocab_size);

  auto backend = make_backend(o.m, model, pool);
  apply_kv_cache_option(*backend, o.m);

  const std::vector<int32_t> used(tokens.begin(), tokens.begin() + n_chunk * n_ctx);
  Header header{};
  std::copy(kMagic, kMagic + 8, header.magic);
  header.vocab = uint32_t(vocab);
  header.n_ctx = uint32_t(n_ctx);
  header.n_chunks = uint32_t(n_chunk);
  header.first = uint32_t(first);
  std::optional<LogitsFile> save, base;
  if (!o.save_logits.empty()) save.emplace(LogitsFile::create(o.save_logits, header, used));
  if (!o.kl_base.empty()) {
    Header h;
    std::vector<int32_t> base_tokens;
    base.emplace(LogitsFile::open(o.kl_base, h, base_tokens));
    KILN_CHECK(h.vocab == header.vocab && h.n_ctx == header.n_ctx && h.first == header.first, invalid_argument,
               "--kl-base '{}' was written with vocab {} and -c {}; this run has vocab {} and -c {}", o.kl_base,
               h.vocab, h.n_ctx, header.vocab, header.n_ctx);
    KILN_CHECK(h.n_chunks >= header.n_chunks && std::equal(used.begin(), used.end(), base_tokens.begin()),
               invalid_argument, "--kl-base '{}' was computed on other tokens (another text, tokenizer or --chunks)",
               o.kl_base);
  }
  fmt::print(stderr, "kiln perplexity: {} chunks of {} tokens, scoring the last {} of each ({} tokens), backend {}\n",
             n_chunk, n_ctx, n_scored, n_chunk * n_scored, backend->name());

  double nll = 0, nll2 = 0;
  int64_t count = 0, same_top1 = 0;
  std::vector<float> kls;
  std::vector<float> logits;
  std::vector<double> lp;
  std::vector<uint8_t> record(quant::LogProbRecord::bytes(vocab));
  auto t0 = clock::now();
  for (int64_t c = 0; c < n_chunk; ++c) {
    std::vector<int32_t> window(used.begin() + c * n_ctx, used.begin() + (c + 1) * n_ctx);
    if (add_bos) window[0] = tokenizer.bos_id();
    auto seq = backend->new_sequence(n_ctx);
    backend->forward(*seq, std::span<const int32_t>(window.data(), size_t(first)), false, logits);
    backend->forward(*seq, std::span<const int32_t>(window.data() + first, size_t(n_ctx - first)), true, logits);
    double chunk_nll = 0;
    for (int64_t j = 0; j < n_scored; ++j) {
      quant::log_softmax(std::span<const float>(logits.data() + size_t(j) * vocab, vocab), lp);
      const double v = -lp[size_t(window[size_t(first + j + 1)])];
      nll += v;
      nll2 += v * v;
      chunk_nll += v;
      ++count;
      if (save) {
        quant::LogProbRecord::encode(lp).write_to(record.data());
        save->write(record.data(), record.size());
      }
      if (base) {
        base->read(record.data(), record.size());
        const quant::TokenComparison cmp = quant::compare(quant::LogProbRecord::read_from(record.data(), vocab), lp);
        kls.push_back(float(cmp.kl));
        same_top1 += cmp.same_top1;
      }
    }
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    fmt::print(stderr, "[{:4}/{:4}] ppl {:9.4f} (chunk {:9.4f}){}  {:6.1f} s, {:6.1f} tok/s\n", c + 1, n_chunk,
               std::exp(nll / double(count)), std::exp(chunk_nll / double(n_scored)),
               kls.empty() ? std::string()
                           : fmt::format(", mean KL {:.6f}, same top-1 {:.3f}%",
                                         std::accumulate(kls.begin(), kls.end(), 0.0) / double(kls.size()),
                                         100.0 * double(same_top1) / double(kls.size())),
               s, double((c + 1) * n_ctx) / s);
  }
  if (save) save->close();
  const double mean = nll / double(count), ppl = std::exp(mean);
  const double var = nll2 / double(count) - mean * mean;
  const double ppl_err = var > 0 ? ppl * std::sqrt(var / double(count - 1)) : 0;
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", ppl, ppl_err);
  nlohmann::json j = {{"model", model.path},       {"text", o.file},           {"n_ctx", n_ctx},
                      {"chunks", n_chunk},         {"scored_tokens", count},   {"ppl", ppl},
                      {"ppl_err", ppl_err},        {"kv_cache", o.m.kv_cache.empty() ? "default" : o.m.kv_cache},
                      {"backend", backend->name()}, {"seconds", seconds},
                      {"tokens_per_s", double(n_chunk * n_ctx) / seconds}};
  if (!kls.empty()) {
    std::vector<float> sorted = kls;
    std::sort(sorted.begin(), sorted.end());
    const double kl_mean = std::accumulate(kls.begin(), kls.end(), 0.0) / double(kls.size());
    const double p99 = sorted[std::min(sorted.size() - 1, size_t(0.99 * double(sorted.size())))];
    const double top1 = double(same_top1) / double(kls.size());
    fmt::print("KL divergence from {}: mean {:.6f}, p99 {:.6f}, max {:.6f}; same top-1 {:.3f}%\n", o.kl_base, kl_mean,
               p99, double(sorted.back()), 100 * top1);
    j["kl_base"] = o.kl_base;
    j["kl_mean"] = kl_mean;
    j["kl_p99"] = p99;
    j["kl_max"] = sorted.back();
    j["same_top1"] = top1;
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    KILN_CHECK(out.good(), io, "cannot write '{}'", o.json);
    out << j.dump(2) << "\n";
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text (llama-perplexity's method) and KL vs a base model");
  add_model_options(cmd, o->m);
  add_kv_cache_option(cmd, o->m);
  cmd->add_option("-f,--file", o->file, "The text to score")->required();
  cmd->add_option("-c,--ctx-size", o->ctx, "Window in tokens (the second half of each is scored)")->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "Score only the first N windows (-1: all)")->capture_default_str();
  cmd->add_option("--save-logits", o->save_logits, "Store the scored tokens' log-probs for a later --kl-base");
  cmd->add_option("--kl-base", o->kl_base, "Compare with log-probs stored by --save-logits (KL, same top-1)");
  cmd->add_option("--json", o->json, "Write the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace kiln::cli
