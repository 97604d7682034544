// libnibble-kernel-trace.so: a CUDA injection library that records every kernel's GPU start and end
// (CUPTI concurrent-kernel activity: kernels that overlap under programmatic dependent launch keep
// their own times, CUDA graph nodes included) and writes them at exit as CSV, one kernel a line:
//   "Start (ns)","Duration (ns)","Device","Name"
// the columns tools/summarize_kernel_timeline.py reads. Used where Nsight Systems is not installed:
//   CUDA_INJECTION64_PATH=build/libnibble-kernel-trace.so NIBBLE_KERNEL_TRACE=trace.csv nibble ...
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
  uint64_t start, end;
  uint32_t device;
  std::string name;
};

std::mutex g_mutex;
std::vector<Kernel> g_kernels;
constexpr size_t kBufferBytes = 8u << 20;

void report(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "nibble-kernel-trace: %s: %s\n", what, text != nullptr ? text : "unknown error");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Kernel> kernels;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    kernels.push_back({k->start, k->end, k->deviceId, demangled(k->name)});
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_kernels.insert(g_kernels.end(), kernels.begin(), kernels.end());
}

std::string csv_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_trace() {
  report(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  const char* path = std::getenv("NIBBLE_KERNEL_TRACE");
  FILE* f = std::fopen(path != nullptr && *path != '\0' ? path : "kernel_trace.csv", "w");
  if (f == nullptr) {
    std::perror("nibble-kernel-trace: cannot write the trace");
    return;
  }
  const std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(f, "\"Start (ns)\",\"Duration (ns)\",\"Device\",\"Name\"\n");
  for (const Kernel& k : g_kernels)
    std::fprintf(f, "%llu,%llu,%u,%s\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end - k.start), k.device, csv_quoted(k.name).c_str());
  std::fclose(f);
  std::fprintf(stderr, "nibble-kernel-trace: %zu kernels\n", g_kernels.size());
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  report(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  report(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel records");
  std::atexit(write_trace);
  return 1;
}
