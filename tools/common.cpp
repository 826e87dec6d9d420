#include "common.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <iterator>

#include <fmt/core.h>

#include "backend/cpu/cpu_backend.h"
#include "core/check.h"
#include "model/random_weights.h"
#ifdef KILN_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "kernels/cuda/quant/qmatmul.h"
#endif

namespace kiln::cli {

static constexpr const char* kDefaultModel = "SmolLM2-135M-Instruct.Q4_1.gguf";

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("-m,--model", o.model,
                  "Model: a .gguf file or a Hugging Face directory (default: the fetched SmolLM2-135M-Instruct)");
  cmd->add_option("--device", o.device, "cpu, cuda or auto (cuda when a GPU is visible)")->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd->add_option("--ubatch", o.ubatch,
                  "CUDA: prompt tokens per forward pass of one sequence (longer prompts run in chunks; larger "
                  "chunks feed the GEMMs bigger M at the cost of activation memory)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
}

void add_kv_cache_option(CLI::App* cmd, ModelOptions& o) {
  cmd->add_option("--kv-cache", o.kv_cache,
                  "KV cache format: bf16, int8 or fp8 (int8/fp8: one byte a value and one scale per token and KV "
                  "head, about half the bf16 bytes on CUDA; default: the backend's own, fp32 on the CPU, bf16 on CUDA)");
}

void apply_kv_cache_option(Backend& backend, const ModelOptions& o) {
  if (o.kv_cache.empty()) return;
  KvCacheFormat f = parse_kv_cache_format(o.kv_cache);
  KILN_CHECK(f != KvCacheFormat::native, invalid_argument, "--kv-cache must be bf16, int8 or fp8, got '{}'", o.kv_cache);
  if (f == KvCacheFormat::bf16 && backend.name() == "cuda") f = KvCacheFormat::native;  // CUDA caches are bf16
  backend.set_kv_cache_format(f);
  fmt::print(stderr, "kiln: KV cache {} on {}\n", o.kv_cache, backend.name());
}

std::string resolve_model_path(const std::string& arg) {
  namespace fs = std::filesystem;
  if (!arg.empty()) return arg;
  std::vector<fs::path> candidates;
  if (const char* dir = std::getenv("KILN_MODEL_DIR")) candidates.push_back(fs::path(dir) / kDefaultModel);
  candidates.push_back(fs::path("models") / kDefaultModel);
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // build/tools/kiln -> <repo>/models
    candidates.push_back(exe.parent_path() / ".." / ".." / "models" / kDefaultModel);
    candidates.push_back(exe.parent_path() / ".." / "models" / kDefaultModel);
  }
  for (const auto& c : candidates)
    if (fs::exists(c)) return fs::weakly_canonical(c).string();
  KILN_FAIL(io, "no -m/--model given and the default model {} was not found; run scripts/fetch_model.sh first",
            kDefaultModel);
}

LoadedModel load_with_progress(const std::string& path, ThreadPool& pool) {
  auto t0 = std::chrono::steady_clock::now();
  fmt::print(stderr, "kiln: loading {} ...\n", path);
  LoadedModel m = load_model(path, pool);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = m.config;
  fmt::print(stderr, "kiln: {} ({}), {} layers, hidden {}, heads {}/{}, vocab {}, {:.1f}M params, loaded in {:.2f} s\n",
             c.name.empty() ? "model" : c.name, c.architecture, c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads,
             c.vocab_size, double(c.n_params()) / 1e6, s);
  return m;
}

#ifdef KILN_HAVE_CUDA
static CudaBackendOptions cuda_options(const ModelOptions& o) {
  CudaBackendOptions c;
  c.max_chunk = o.ubatch;
  return c;
}
#endif

std::unique_ptr<Backend> make_backend(const ModelOptions& options, LoadedModel& model, ThreadPool& pool) {
  const std::string& device = options.device;
  KILN_CHECK(device == "cpu" || device == "cuda" || device == "auto", invalid_argument,
             "--device must be cpu, cuda or auto, got '{}'", device);
#ifdef KILN_HAVE_CUDA
  bool gpu = cuda::cuda_device_count() > 0;
  KILN_CHECK(gpu || device != "cuda", unsupported, "--device cuda: no CUDA device is visible");
  if (gpu && device != "cpu") {
    auto backend = std::make_unique<CudaBackend>(model.config, model.weights, cuda_options(options));
    model.weights = {};  // the GPU holds them now (bf16); an 8B model's fp32 copy is 32 GB of RAM
    return backend;
  }
#else
  KILN_CHECK(device != "cuda", unsupported, "this build of kiln has no CUDA backend");
#endif
  return std::make_unique<CpuBackend>(model.config, std::move(model.weights), pool);
}

BenchTarget open_bench_target(const ModelOptions& o, const std::string& random_shape, ThreadPool& pool,
                              const std::string& random_quant, const std::string& head_quant) {
  BenchTarget t;
  KILN_CHECK(random_quant.empty() || !random_shape.empty(), invalid_argument, "--quant goes with --random");
  KILN_CHECK(head_quant.empty() || !random_shape.empty(), invalid_argument, "--quant-head goes with --random");
  if (!random_shape.empty()) {
    ModelConfig c = preset_config(random_shape);
    auto format_of = [](const std::string& option, const std::string& name) {
      const QuantFormat f = name == "int8"   ? QuantFormat::int8
                            : name == "int4" ? QuantFormat::int4
                            : name == "fp8"  ? QuantFormat::fp8
                                             : QuantFormat::none;
      KILN_CHECK(f != QuantFormat::none || name == "bf16", invalid_argument,
                 "{} must be bf16, int8, int4 or fp8, got '{}'", option, name);
      return f;
    };
    const std::string qname = random_quant.empty() ? "bf16" : random_quant;
    const QuantFormat quant = format_of("--quant", qname);
    const QuantFormat head = format_of("--quant-head", head_quant.empty() ? "bf16" : head_quant);
    t.label = random_shape + " (random " + qname + (head != QuantFormat::none ? ", head " + head_quant : "") + ")";
#ifdef KILN_HAVE_CUDA
    KILN_CHECK(o.device != "cpu", invalid_argument, "--random runs on the GPU only");
    KILN_CHECK(cuda::cuda_device_count() > 0, unsupported, "--random needs a CUDA device");
    auto b = CudaBackend::random(c, 1234, 0.02f, cuda_options(o), quant, head);
    // Bytes a weight costs (data + scales) as random_weight lays the formats out: int4 in groups
    // of 128, int8 and fp8 per channel.
    auto bytes_per_weight = [&](QuantFormat f) {
      return cuda::qweight_bytes_per_weight(f, c.hidden_size, f == QuantFormat::int4 ? 128 : c.hidden_size);
    };
    if (quant != QuantFormat::none) t.proj_weight_bytes = bytes_per_weight(quant);
    if (head != QuantFormat::none) t.head_weight_bytes = bytes_per_weight(head);
    t.weight_bytes = double(b->weight_bytes());
    t.backend = std::move(b);
#else
    KILN_FAIL(unsupported, "--random needs the CUDA backend, which this build lacks");
#endif
    return t;
  }
  t.model.emplace(load_with_progress(resolve_model_path(o.model), pool));
  t.label = t.model->config.name;
  t.backend = make_backend(o, *t.model, pool);
  t.weight_bytes = double(t.model->config.n_params()) * (t.backend->name() == "cuda" ? 2.0 : 4.0);
  return t;
}

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string choose_chat_template(const std::string& override_arg, const std::string& model_template) {
  if (override_arg.empty()) {
    KILN_CHECK(!model_template.empty(), invalid_argument,
               "this model has no chat template; pass one with --chat-template FILE");
    return model_template;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(override_arg, ec)) return override_arg;  // the template text itself
  return read_text_file(override_arg, "chat template");
}

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::string item;
  auto finish_item = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used > 0 && used == item.size() && v >= 0 && v <= INT32_MAX, invalid_argument,
               "{} expects non-negative token ids separated by commas or spaces, got '{}'", what, item);
    ids.push_back(int32_t(v));
    item.clear();
  };
  std::string_view body = text;
  while (!body.empty() && std::isspace(uint8_t(body.front()))) body.remove_prefix(1);
  while (!body.empty() && std::isspace(uint8_t(body.back()))) body.remove_suffix(1);
  if (body.size() >= 2 && body.front() == '[' && body.back() == ']') body = body.substr(1, body.size() - 2);
  for (char c : body) {
    if (c == ',' || std::isspace(uint8_t(c))) {
      finish_item();
    } else {
      item.push_back(c);
    }
  }
  finish_item();
  return ids;
}

}  // namespace kiln::cli
