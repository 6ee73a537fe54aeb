// nvml_usage.cpp — per-process device memory from NVML, for OOM reports.
//
// libnvidia-ml.so.1 is optional: it is dlopen'ed only when an OOM is
// reported, and any failure (library absent, symbol missing, call failing)
// yields "" so the report simply leaves the section out.  Only NVML's C ABI
// is used, declared here, so no NVML header is needed.
//
// Device mapping: NVML numbers devices by PCI order, CUDA by its own order
// restricted to CUDA_VISIBLE_DEVICES.  We map the CUDA ordinal through
// CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs); without it the ordinal is used
// as the NVML index, which is right when CUDA_DEVICE_ORDER=PCI_BUS_ID or on
// single-GPU machines.
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "format.h"
#include "process_observer.h"

namespace cachalloc::obs {

namespace {

using nvmlReturn = int;
using nvmlDevice = void*;
struct nvmlProcessInfo {  // nvmlProcessInfo_v2_t: the layout _v2 and _v3 fill (the unversioned call uses a shorter one)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr nvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

struct Nvml {
  nvmlReturn (*init)();
  nvmlReturn (*shutdown)();
  nvmlReturn (*by_index)(unsigned int, nvmlDevice*);
  nvmlReturn (*by_uuid)(const char*, nvmlDevice*);
  nvmlReturn (*processes)(nvmlDevice, unsigned int*, nvmlProcessInfo*);
};

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

bool load(void* lib, Nvml* n) {
  bool ok = bind(lib, "nvmlInit_v2", &n->init) && bind(lib, "nvmlShutdown", &n->shutdown) &&
            bind(lib, "nvmlDeviceGetHandleByIndex_v2", &n->by_index) &&
            bind(lib, "nvmlDeviceGetHandleByUUID", &n->by_uuid);
  if (!ok) return false;
  return bind(lib, "nvmlDeviceGetComputeRunningProcesses_v3", &n->processes) ||
         bind(lib, "nvmlDeviceGetComputeRunningProcesses_v2", &n->processes);
}

// The CUDA_VISIBLE_DEVICES entry for `ordinal`, or "" when unset/short.
std::string visible_entry(int ordinal) {
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr || *env == '\0') return "";
  std::string list = env;
  std::size_t start = 0;
  for (int i = 0; start <= list.size(); ++i) {
    std::size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (i == ordinal) return item;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return "";
}

bool device_handle(const Nvml& n, int ordinal, nvmlDevice* dev) {
  std::string entry = visible_entry(ordinal);
  if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) return n.by_uuid(entry.c_str(), dev) == kNvmlSuccess;
  unsigned int index = entry.empty() ? static_cast<unsigned int>(ordinal) : static_cast<unsigned int>(std::atoi(entry.c_str()));
  return n.by_index(index, dev) == kNvmlSuccess;
}

std::string usage_lines(const Nvml& n, int ordinal) {
  nvmlDevice dev = nullptr;
  if (!device_handle(n, ordinal, &dev)) return "";
  unsigned int count = 0;
  nvmlReturn rc = n.processes(dev, &count, nullptr);
  if (rc != kNvmlSuccess && rc != kNvmlInsufficientSize) return "";
  std::vector<nvmlProcessInfo> infos(count + 8);  // room for processes that start meanwhile
  count = static_cast<unsigned int>(infos.size());
  if (n.processes(dev, &count, infos.data()) != kNvmlSuccess) return "";
  std::string out;
  for (unsigned int i = 0; i < count; ++i) {
    if (infos[i].usedGpuMemory == kNvmlValueNotAvailable) {  // e.g. no permission in a container
      out += obs::format("  process {} uses an unknown amount\n", infos[i].pid);
      continue;
    }
    out += obs::format("  process {} uses {:.2f} MiB\n", infos[i].pid,
                       static_cast<double>(infos[i].usedGpuMemory) / (1024.0 * 1024.0));
  }
  return out;
}

}  // namespace

std::string nvml_process_usage(int device) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return "";
  Nvml n{};
  std::string out;
  if (load(lib, &n) && n.init() == kNvmlSuccess) {
    out = usage_lines(n, device);
    n.shutdown();
  }
  dlclose(lib);
  return out;
}

}  // namespace cachalloc::obs
