#include "backend/cuda/sm_partition.h"

#include <cuda.h>

#include <string>
#include <type_traits>

#include "backend/cuda/driver_entry_point.h"

namespace kiln::cuda {

// The driver entry points green contexts need (driver_entry_point.h): CUDA 12.4's, and 12.5's
// stream constructor.
struct SmSplit::Driver {
  decltype(&cuDeviceGetDevResource) get_resource = nullptr;
  decltype(&cuDevSmResourceSplitByCount) split = nullptr;
  decltype(&cuDevResourceGenerateDesc) describe = nullptr;
  decltype(&cuGreenCtxCreate) create = nullptr;
  decltype(&cuGreenCtxStreamCreate) stream_create = nullptr;
  decltype(&cuGreenCtxDestroy) destroy = nullptr;
  decltype(&cuStreamDestroy) stream_destroy = nullptr;
  bool ok = false;
  const char* missing = nullptr;  // the first entry point the driver did not give

  static const Driver& get() {
    static const Driver d = [] {
      Driver r;
      auto load = [&r](const char* name, auto& fn, unsigned version = 12040) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(driver_entry_point(name, version));
        if (!fn) r.missing = name;
        return fn != nullptr;
      };
      r.ok = load("cuDeviceGetDevResource", r.get_resource) && load("cuDevSmResourceSplitByCount", r.split) &&
             load("cuDevResourceGenerateDesc", r.describe) && load("cuGreenCtxCreate", r.create) &&
             load("cuGreenCtxStreamCreate", r.stream_create, 12050) && load("cuGreenCtxDestroy", r.destroy) &&
             load("cuStreamDestroy", r.stream_destroy);
      return r;
    }();
    return d;
  }
};

SmSplit::SmSplit(int first_sms) {
  const Driver& d = Driver::get();
  if (!d.ok) {
    why_ = std::string("the driver has no ") + d.missing + " (green contexts need CUDA 12.4, their streams 12.5)";
    return;
  }
  cudaFree(nullptr);  // the primary context first: each green context retains it
  int ordinal = 0;
  cudaGetDevice(&ordinal);
  const CUdevice dev = ordinal;
  CUdevResource all{}, first{}, rest{};
  unsigned groups = 1;
  auto fail = [&](const char* step, CUresult r) {
    why_ = std::string(step) + " failed (CUresult " + std::to_string(int(r)) + ")";
    return false;
  };
  auto make = [&](CUdevResource& res, CUgreenCtx& ctx, cudaStream_t& stream, const char* what) {
    CUdevResourceDesc desc{};
    CUgreenCtx g = nullptr;
    CUstream s = nullptr;
    if (CUresult r = d.describe(&desc, &res, 1); r != CUDA_SUCCESS) return fail(what, r);
    if (CUresult r = d.create(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM); r != CUDA_SUCCESS) return fail(what, r);
    ctx = g;
    if (CUresult r = d.stream_create(&s, g, CU_STREAM_NON_BLOCKING, 0); r != CUDA_SUCCESS) return fail(what, r);
    stream = s;  // CUstream and cudaStream_t are one type
    return true;
  };
  if (CUresult r = d.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS) {
    fail("cuDeviceGetDevResource", r);
    return;
  }
  if (CUresult r = d.split(&first, &groups, &all, &rest, 0, unsigned(first_sms)); r != CUDA_SUCCESS) {
    fail("cuDevSmResourceSplitByCount", r);
    return;
  }
  if (groups != 1) {
    why_ = "the GPU has too few SMs for a partition of " + std::to_string(first_sms);
    return;
  }
  first_sms_ = int(first.sm.smCount);
  rest_sms_ = int(rest.sm.smCount);
  ok_ = make(first, first_ctx_, first_stream_, "the first partition") &&
        make(rest, rest_ctx_, rest_stream_, "the second partition");
}

SmSplit::~SmSplit() {
  const Driver& d = Driver::get();
  if (!d.ok) return;
  if (first_stream_) d.stream_destroy(first_stream_);
  if (rest_stream_) d.stream_destroy(rest_stream_);
  if (first_ctx_) d.destroy(first_ctx_);
  if (rest_ctx_) d.destroy(rest_ctx_);
}

}  // namespace kiln::cuda
