// A stand-in for NVIDIA's driver library (libcuda.so.1) with the calls a Python standby makes
// for --standby_cuda=context (agent/python/ddprun_standby.py, _retain_primary_context), for
// tests/compat/python_standby_test.cpp on machines without a GPU. Each call appends a line to
// the file named by FAKE_CUDA_LOG: "<call> pid=<pid> visible=<CUDA_VISIBLE_DEVICES or -> ...".
// The process sees as many devices as CUDA_VISIBLE_DEVICES lists, else FAKE_CUDA_DEVICES (2);
// FAKE_CUDA_INIT_ERROR=N makes cuInit fail with N; FAKE_CUDA_RETAIN_MS=N makes a context take N
// ms to make (logged as "making-context" when it begins); FAKE_CUDA_COMPUTE_MODE=N puts every
// device in compute mode N (0, the default). Like the real driver, a context leaves a thread behind
// (waiting for the GPU's events there; here, for nothing). The library's teardown at exit() waits
// for a context still being made, as a driver's can for a call still inside it: a process that must
// leave while one is uses _exit().
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kNotInitialized = 3;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;

bool initialized = false;
std::mutex making;  ///< held while a context is being made

/// Run by exit(), not by _exit().
__attribute__((destructor)) void teardown() { const std::lock_guard<std::mutex> wait(making); }

std::string visible() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? "-" : v;
}

void log(const std::string& call, const std::string& detail = "") {
  const char* path = std::getenv("FAKE_CUDA_LOG");
  if (path == nullptr) return;
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s pid=%d visible=%s%s%s\n", call.c_str(), static_cast<int>(::getpid()),
                 visible().c_str(), detail.empty() ? "" : " ", detail.c_str());
    std::fclose(f);
  }
}

int device_count() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    if (*v == '\0') return 0;
    int n = 1;
    for (const char* c = v; *c != '\0'; ++c) n += *c == ',';
    return n;
  }
  const char* n = std::getenv("FAKE_CUDA_DEVICES");
  return n == nullptr ? 2 : std::atoi(n);
}

}  // namespace

extern "C" {

int cuInit(unsigned int flags) {
  log("cuInit");
  if (flags != 0) return kInvalidValue;
  if (const char* e = std::getenv("FAKE_CUDA_INIT_ERROR"); e != nullptr) return std::atoi(e);
  initialized = true;
  return kSuccess;
}

int cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  *count = device_count();
  return kSuccess;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!initialized) return kNotInitialized;
  if (ordinal < 0 || ordinal >= device_count()) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  constexpr int kComputeMode = 20;
  if (!initialized) return kNotInitialized;
  if (device < 0 || device >= device_count()) return kInvalidDevice;
  if (attribute != kComputeMode) return kInvalidValue;
  const char* mode = std::getenv("FAKE_CUDA_COMPUTE_MODE");
  *value = mode == nullptr ? 0 : std::atoi(mode);
  return kSuccess;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
  if (!initialized) return kNotInitialized;
  if (device < 0 || device >= device_count()) return kInvalidDevice;
  static int contexts[64];
  *context = &contexts[device % 64];
  if (const char* ms = std::getenv("FAKE_CUDA_RETAIN_MS"); ms != nullptr) {
    const std::lock_guard<std::mutex> busy(making);
    log("making-context", "device=" + std::to_string(device));
    ::usleep(static_cast<useconds_t>(std::atoi(ms)) * 1000);
  }
  std::thread([] {
    for (;;) ::pause();
  }).detach();
  log("cuDevicePrimaryCtxRetain", "device=" + std::to_string(device));
  return kSuccess;
}

int cuGetErrorName(int error, const char** name) {
  switch (error) {
    case kInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      return kSuccess;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      return kSuccess;
    case kNoDevice:
      *name = "CUDA_ERROR_NO_DEVICE";
      return kSuccess;
    case kInvalidDevice:
      *name = "CUDA_ERROR_INVALID_DEVICE";
      return kSuccess;
    default:
      *name = nullptr;
      return kInvalidValue;
  }
}

}  // extern "C"
