#include "backend/cuda/cupti_kernel_timer.h"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "core/check.h"

namespace kiln::cuda {

struct CuptiKernelTimer::Api {
  void* lib = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push_id = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop_id = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

namespace {

// What the buffer callbacks collected since start(). CUPTI calls them from its own thread as well
// as from inside cuptiActivityFlushAll, hence the mutex.
struct Collected {
  std::mutex mu;
  std::unordered_map<uint32_t, uint64_t> external_of;  // CUPTI correlation id -> kiln op + 1
  struct Kernel {
    uint32_t correlation;
    uint64_t start, end;
    std::string name;  // copied: CUPTI owns the record's string
  };
  std::vector<Kernel> kernels;
  size_t dropped = 0;
};
Collected g_collected;
CuptiKernelTimer::Api* g_api = nullptr;

constexpr size_t kBufferBytes = size_t(8) << 20;
constexpr CUpti_ExternalCorrelationKind kKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                                         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_collected.mu);
    CUpti_Activity* record = nullptr;
    while (g_api && g_api->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
        auto* r = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (r->externalKind == kKind) g_collected.external_of[r->correlationId] = r->externalId;
      } else if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        // start, end and correlationId sit at the same offsets in every CUpti_ActivityKernelN.
        auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_collected.kernels.push_back({k->correlationId, k->start, k->end, k->name ? k->name : ""});
      }
    }
  }
  std::free(buffer);
}

template <class F>
void load(void* lib, const char* symbol, F& out, std::string* why_not) {
  out = reinterpret_cast<F>(dlsym(lib, symbol));
  if (!out && why_not->empty()) *why_not = std::string("libcupti has no ") + symbol;
}

}  // namespace

CuptiKernelTimer::CuptiKernelTimer(std::unique_ptr<Api> api) : api_(std::move(api)) {}

CuptiKernelTimer* CuptiKernelTimer::open(std::string* why_not) {
  static std::unique_ptr<CuptiKernelTimer> timer;
  static std::string failure;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto api = std::make_unique<Api>();
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      if ((api->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!api->lib) {
      failure = std::string("libcupti could not be loaded (") + dlerror() +
                "); put the CUDA toolkit's lib64 on LD_LIBRARY_PATH";
    } else {
      load(api->lib, "cuptiActivityEnable", api->enable, &failure);
      load(api->lib, "cuptiActivityDisable", api->disable, &failure);
      load(api->lib, "cuptiActivityRegisterCallbacks", api->register_callbacks, &failure);
      load(api->lib, "cuptiActivityFlushAll", api->flush_all, &failure);
      load(api->lib, "cuptiActivityGetNextRecord", api->next_record, &failure);
      load(api->lib, "cuptiActivityPushExternalCorrelationId", api->push_id, &failure);
      load(api->lib, "cuptiActivityPopExternalCorrelationId", api->pop_id, &failure);
      load(api->lib, "cuptiGetResultString", api->result_string, &failure);
    }
    if (failure.empty()) {
      CUptiResult r = api->register_callbacks(buffer_requested, buffer_completed);
      if (r != CUPTI_SUCCESS) {
        const char* text = "?";
        api->result_string(r, &text);
        failure = std::string("cuptiActivityRegisterCallbacks failed: ") + text;
      }
    }
    if (failure.empty()) {
      g_api = api.get();
      timer.reset(new CuptiKernelTimer(std::move(api)));
    }
  }
  if (!timer && why_not) *why_not = failure;
  return timer.get();
}

static void check_cupti(const CuptiKernelTimer::Api& api, CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = "?";
  api.result_string(r, &text);
  KILN_FAIL(internal, "CUPTI {} failed: {}", what, text);
}

void CuptiKernelTimer::start() {
  {
    std::lock_guard<std::mutex> lock(g_collected.mu);
    g_collected.external_of.clear();
    g_collected.kernels.clear();
  }
  unmatched_ = 0;
  for (CUpti_ActivityKind k : kKinds) check_cupti(*api_, api_->enable(k), "activity enable");
}

void CuptiKernelTimer::begin_op(uint64_t op) { check_cupti(*api_, api_->push_id(kKind, op + 1), "push id"); }

void CuptiKernelTimer::end_op() { check_cupti(*api_, api_->pop_id(kKind, nullptr), "pop id"); }

std::vector<CuptiKernelTimer::OpTime> CuptiKernelTimer::stop(size_t n_ops, std::vector<Span>* spans) {
  check_cupti(*api_, api_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  for (CUpti_ActivityKind k : kKinds) check_cupti(*api_, api_->disable(k), "activity disable");
  std::vector<OpTime> times(n_ops);
  std::lock_guard<std::mutex> lock(g_collected.mu);
  // Kernels in start order. A kernel is charged from the end of everything before it to its own
  // end: its run time plus the idle gap before it (OpTime). With programmatic dependent launch a
  // kernel starts while its predecessor still runs and waits in griddepcontrol; charging from the
  // predecessor's end keeps that overlap from being counted twice.
  std::vector<Collected::Kernel>& ks = g_collected.kernels;
  std::sort(ks.begin(), ks.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  uint64_t busy_until = ks.empty() ? 0 : ks.front().start;
  for (const Collected::Kernel& k : ks) {
    const uint64_t from = std::min(busy_until, k.end);
    const double ms = double(k.end - from) * 1e-6;
    const double idle = k.start > busy_until ? double(k.start - busy_until) * 1e-6 : 0.0;
    busy_until = std::max(busy_until, k.end);
    auto it = g_collected.external_of.find(k.correlation);
    if (it == g_collected.external_of.end() || it->second == 0 || it->second > n_ops) {
      ++unmatched_;
      continue;
    }
    if (spans) spans->push_back({it->second - 1, k.name, k.start, k.end});
    OpTime& t = times[size_t(it->second - 1)];
    t.ms += ms;
    t.idle_ms += idle;
    t.kernels += 1;
  }
  g_collected.external_of.clear();
  g_collected.kernels.clear();
  return times;
}

}  // namespace kiln::cuda
