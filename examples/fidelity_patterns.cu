// fidelity_patterns.cu — checks that the driver calls which describe an
// allocation (cuMemGetAddressRange, cuPointerGetAttribute(s),
// cudaPointerGetAttributes, CUDA IPC), device resets and peer access answer
// for each cudaMalloc'd buffer as they do without an allocator in between.
// Built twice (static cudart and -cudart shared, linked against libcuda for
// the driver calls) and run with and without libcachalloc.so preloaded: the
// program must pass both ways, so it checks the driver's semantics.  Every
// check verifies data on the device (kernels) or by copies, never only
// return codes.
//
//   fidelity_patterns [PATTERN...]     no argument: every pattern
//
// Patterns:
//   range_memset       ~20 small buffers; cuMemGetAddressRange of an interior
//                      pointer, then cuMemsetD8 of the whole reported range
//                      (what numba does) must not touch any other buffer;
//                      RANGE_START_ADDR/RANGE_SIZE/BUFFER_ID per buffer
//   attributes_freed   a freed (perhaps cached) pointer answers every pointer
//                      attribute 1..21 like memory CUDA never saw
//   ipc_shim_importer  CUDA IPC of 6 buffers to a child process that keeps
//   ipc_bare_importer  LD_PRELOAD, or runs without it ("ipc" names both)
//   expandable_ipc     cudaIpcGetMemHandle either fails or hands out a handle
//                      that opens to exactly the buffer (meant for
//                      CACHALLOC_CONF=expandable_segments:true)
//   reset              cudaDeviceReset and cuCtxDestroy, then allocate again
//   peer               kernels on one GPU reading/writing the other's buffers
//                      (needs 2 GPUs with peer access; else "peer: SKIP")
//
// Prints detail lines, then `<pattern>: PASS`, `<pattern>: FAIL <why>` or
// `<pattern>: SKIP (<why>)` per pattern and finally `fidelity_patterns: PASS`
// (exit 0) or `fidelity_patterns: FAIL (...)` (exit 1).  Exit 77 when no GPU
// can be used, 2 for an unknown pattern name.
//
// --sanitizer-safe (verify_kernels.cuh; tests/gpu/run_sanitizer.sh) leaves
// out the calls that fail on purpose, which compute-sanitizer counts as
// errors (and which cachalloc answers itself for its own blocks, so that
// the bare and shim counts would differ): attributes_freed is skipped,
// range_memset does not ask for the range just past a buffer's end, ipc
// exports base pointers only and frees nothing while the child has it open,
// reset creates its own contexts with explicit (empty) parameters.
#include <cuda.h>
#include <cuda_runtime.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "verify_kernels.cuh"

extern char** environ;

namespace {

constexpr std::size_t KiB = 1024, MiB = KiB * KiB;

// --- failure bookkeeping: per pattern, the first reason is kept for the
// pattern's status line ---
int g_failures = 0;
std::string g_first_failure;
std::string g_skip;  // set by a pattern that cannot run here: its line says SKIP

__attribute__((format(printf, 1, 2))) void fail(const char* fmt, ...) {
  char msg[512];
  std::va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_failures++ == 0) g_first_failure = msg;
  std::printf("    FAIL: %s\n", msg);
}

__attribute__((format(printf, 1, 2))) void note(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("    ", stdout);
  std::vprintf(fmt, ap);
  std::fputc('\n', stdout);
  va_end(ap);
}

const char* drv_name(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "CUDA_ERROR_?";
  return s;
}

bool ok_rt(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return true;
  fail("line %d: %s -> %s", line, what, cudaGetErrorName(e));
  cudaGetLastError();
  return false;
}
bool ok_drv(CUresult r, const char* what, int line) {
  if (r == CUDA_SUCCESS) return true;
  fail("line %d: %s -> %s", line, what, drv_name(r));
  return false;
}
#define CK(call) ok_rt((call), #call, __LINE__)
#define CKD(call) ok_drv((call), #call, __LINE__)

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
char* at(void* p, std::size_t off) { return static_cast<char*>(p) + off; }

// --- byte contents: a constant byte, or a per-byte hash of a seed, so odd
// sizes are covered to the last byte ---
struct Content {
  bool constant;
  std::uint32_t seed;  // the byte itself when constant
};
Content constant_byte(unsigned b) { return {true, b & 0xffu}; }
Content pattern(std::uint32_t seed) { return {false, seed}; }

__host__ __device__ inline unsigned char byte_at(bool constant, std::uint32_t seed, std::uint64_t i) {
  return constant ? static_cast<unsigned char>(seed) : static_cast<unsigned char>(examples::pattern_word(seed, i) >> 8);
}

__global__ void fill_bytes_kernel(unsigned char* p, std::uint64_t n, bool constant, std::uint32_t seed) {
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = byte_at(constant, seed, i);
}

// out[0]: bytes that differ; out[1]: the lowest differing index.
__global__ void check_bytes_kernel(const unsigned char* p, std::uint64_t n, bool constant, std::uint32_t seed,
                                   unsigned long long* out) {
  unsigned long long bad = 0, first = ~0ull;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    if (p[i] != byte_at(constant, seed, i)) {
      if (!bad) first = i;
      ++bad;
    }
  if (bad) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
}

// Result slots live in mapped, portable pinned host memory: reading them does
// not depend on the allocator under test, and kernels on any GPU can write
// them.  A device reset frees them, so the reset pattern calls init() again.
struct Slots {
  unsigned long long* base = nullptr;
  int next = 0;
  static constexpr int kPairs = 4096;
  bool init() {
    base = nullptr;
    next = 0;
    return CK(cudaHostAlloc(&base, 2 * kPairs * sizeof(*base), cudaHostAllocMapped | cudaHostAllocPortable));
  }
  unsigned long long* take() {
    unsigned long long* s = &base[2 * (next++ % kPairs)];
    s[0] = 0;
    s[1] = ~0ull;
    return s;
  }
};
Slots g_slots;

void fill(void* p, std::size_t n, Content c, cudaStream_t s = 0) {
  if (n) fill_bytes_kernel<<<examples::grid_for(n), 256, 0, s>>>(static_cast<unsigned char*>(p), n, c.constant, c.seed);
}

// Checks on the current device and waits for it; returns the mismatches
// (a failure is reported with `what`).
__attribute__((format(printf, 4, 5))) unsigned long long verify(const void* p, std::size_t n, Content c,
                                                                  const char* what, ...) {
  if (!n) return 0;
  unsigned long long* slot = g_slots.take();
  check_bytes_kernel<<<examples::grid_for(n), 256>>>(static_cast<const unsigned char*>(p), n, c.constant, c.seed, slot);
  char label[256];
  std::va_list ap;
  va_start(ap, what);
  std::vsnprintf(label, sizeof label, what, ap);
  va_end(ap);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fail("%s: check kernel -> %s", label, cudaGetErrorName(e));
    return n;
  }
  if (slot[0]) fail("%s: %llu of %zu bytes differ, first at byte %llu", label, slot[0], n, slot[1]);
  return slot[0];
}

// The same check through a copy to the host.
unsigned long long verify_by_copy(const void* p, std::size_t n, Content c, const char* label) {
  std::vector<unsigned char> h(n);
  if (!CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost))) return n;
  unsigned long long bad = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (h[i] != byte_at(c.constant, c.seed, i)) {
      if (!bad) first = i;
      ++bad;
    }
  if (bad) fail("%s (copied to the host): %llu of %zu bytes differ, first at byte %llu", label, bad, n, first);
  return bad;
}

bool sync_ok(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return true;
  fail("%s: %s", what, cudaGetErrorName(e));
  return false;
}

struct Buf {
  void* p = nullptr;
  std::size_t n = 0;
  Content c{true, 0};
};

void check_disjoint(std::vector<Buf> bufs, const char* what) {
  std::sort(bufs.begin(), bufs.end(), [](const Buf& a, const Buf& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < bufs.size(); ++i)
    if (at(bufs[i - 1].p, bufs[i - 1].n) > bufs[i].p)
      fail("%s: live buffers overlap: %p+%zu and %p", what, bufs[i - 1].p, bufs[i - 1].n, bufs[i].p);
}

// =====================================================================
// range_memset
// =====================================================================
void pattern_range_memset() {
  const std::size_t sizes[] = {1,     3,     17,    255,    257,    511,    1000,   1023,   4095,       4097,
                               10001, 65537, 99999, 131071, 200003, 262145, 300 * KiB, 7, 33333, 150001};
  constexpr int kN = sizeof sizes / sizeof sizes[0];
  std::vector<Buf> bufs;
  for (int i = 0; i < kN; ++i) {
    Buf b;
    b.n = sizes[i];
    b.c = constant_byte(0x10 + 11 * i);  // 0x10 .. 0xe1, all distinct
    if (!CK(cudaMalloc(&b.p, b.n))) continue;
    fill(b.p, b.n, b.c);
    bufs.push_back(b);
  }
  if (!sync_ok("range_memset: fill")) return;
  check_disjoint(bufs, "range_memset");
  for (const Buf& b : bufs) verify(b.p, b.n, b.c, "buffer of %zu bytes after its fill", b.n);

  // Every buffer: the range around an interior pointer and the last byte.
  int ranges_ok = 0;
  std::vector<unsigned long long> ids(bufs.size(), 0);
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    const Buf& b = bufs[i];
    for (std::size_t off : {b.n / 2, b.n - 1}) {
      CUdeviceptr base = 0;
      std::size_t size = 0;
      CUresult r = cuMemGetAddressRange(&base, &size, dptr(at(b.p, off)));
      if (r != CUDA_SUCCESS) {
        fail("cuMemGetAddressRange(buffer of %zu + %zu) -> %s", b.n, off, drv_name(r));
        continue;
      }
      if (base != dptr(b.p) || size != b.n)
        fail("cuMemGetAddressRange(buffer of %zu + %zu) = (buffer %+lld, %zu bytes), expected (buffer +0, %zu)",
             b.n, off, static_cast<long long>(base - dptr(b.p)), size, b.n);
      else
        ++ranges_ok;
      CUdeviceptr start = 0;
      std::size_t rsize = 0;
      if (CKD(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr(at(b.p, off)))) &&
          start != dptr(b.p))
        fail("RANGE_START_ADDR(buffer of %zu + %zu) = buffer %+lld", b.n, off,
             static_cast<long long>(start - dptr(b.p)));
      if (CKD(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr(at(b.p, off)))) && rsize != b.n)
        fail("RANGE_SIZE(buffer of %zu + %zu) = %zu", b.n, off, rsize);
    }
    // Just past the requested size (in the alignment padding: no size here
    // is a multiple of 256) belongs to no allocation.
    if (b.n % 256 != 0 && !examples::sanitizer_safe()) {  // CUDA_ERROR_NOT_FOUND on purpose
      CUdeviceptr base = 0;
      std::size_t size = 0;
      const CUresult r = cuMemGetAddressRange(&base, &size, dptr(at(b.p, b.n)));
      if (r != CUDA_ERROR_NOT_FOUND)
        fail("cuMemGetAddressRange(buffer of %zu + %zu, just past its end) -> %s (buffer %+lld, %zu bytes), "
             "expected CUDA_ERROR_NOT_FOUND",
             b.n, b.n, drv_name(r), static_cast<long long>(base - dptr(b.p)), size);
    }
    CKD(cuPointerGetAttribute(&ids[i], CU_POINTER_ATTRIBUTE_BUFFER_ID, dptr(b.p)));
    // The plural call must agree with the singular ones.
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    CUdeviceptr start = 0;
    std::size_t rsize = 0;
    unsigned long long id = 0;
    unsigned int type = 0;
    int ordinal = -1;
    void* data[] = {&start, &rsize, &id, &type, &ordinal};
    if (CKD(cuPointerGetAttributes(5, attrs, data, dptr(at(b.p, b.n / 2)))) &&
        (start != dptr(b.p) || rsize != b.n || id != ids[i] || type != CU_MEMORYTYPE_DEVICE || ordinal != 0))
      fail("cuPointerGetAttributes(buffer of %zu + %zu): start %+lld size %zu id %llu (singular %llu) type %u "
           "device %d",
           b.n, b.n / 2, static_cast<long long>(start - dptr(b.p)), rsize, id, ids[i], type, ordinal);
  }
  std::set<unsigned long long> distinct(ids.begin(), ids.end());
  if (distinct.size() != ids.size() || distinct.count(0))
    fail("BUFFER_ID: %zu distinct nonzero ids for %zu live buffers", distinct.size() - distinct.count(0), ids.size());

  // numba's way: memset the whole range the driver reports for a pointer.
  std::vector<bool> memset_done(bufs.size(), false);
  for (std::size_t i = 1; i < bufs.size(); i += 4) {
    Buf& b = bufs[i];
    CUdeviceptr base = 0;
    std::size_t size = 0;
    if (!CKD(cuMemGetAddressRange(&base, &size, dptr(at(b.p, b.n / 2))))) continue;
    const unsigned char byte = static_cast<unsigned char>(0xf0 + i / 4);  // not among the fills
    if (!CKD(cuMemsetD8(base, byte, size))) continue;
    b.c = constant_byte(byte);
    memset_done[i] = true;
  }
  if (!sync_ok("range_memset: cuMemsetD8")) return;
  int memsets = 0;
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    const Buf& b = bufs[i];
    if (memset_done[i]) ++memsets;
    verify(b.p, b.n, b.c, "buffer %zu (%zu bytes, %s) after cuMemsetD8 of reported ranges", i, b.n,
           memset_done[i] ? "memset through its range" : "a neighbour, never memset");
  }
  verify_by_copy(bufs[1].p, bufs[1].n, bufs[1].c, "first memset buffer");
  verify_by_copy(bufs[2].p, bufs[2].n, bufs[2].c, "a buffer next to it");

  // A buffer freed and allocated again at the same address gets a new id.
  int reused = 0;
  for (std::size_t i = 0; i < bufs.size() && reused < 3; i += 3) {
    Buf& b = bufs[i];
    const unsigned long long old_id = ids[i];
    void* old_p = b.p;
    if (!CK(cudaFree(b.p))) continue;
    if (!CK(cudaMalloc(&b.p, b.n))) {
      b.p = nullptr;
      continue;
    }
    b.c = constant_byte(0x10 + 11 * i);
    fill(b.p, b.n, b.c);
    unsigned long long id = 0;
    if (!CKD(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dptr(b.p)))) continue;
    ids[i] = id;
    if (b.p == old_p) {
      ++reused;
      if (id == old_id) fail("BUFFER_ID %llu survived cudaFree + cudaMalloc at the same address %p", id, b.p);
    }
    for (std::size_t j = 0; j < bufs.size(); ++j)
      if (j != i && ids[j] == id) fail("BUFFER_ID %llu of a new buffer equals that of live buffer %zu", id, j);
  }
  if (sync_ok("range_memset: refill"))
    for (const Buf& b : bufs)
      if (b.p) verify(b.p, b.n, b.c, "buffer of %zu bytes at the end", b.n);
  for (const Buf& b : bufs)
    if (b.p) CK(cudaFree(b.p));
  note("%zu buffers of 1 B .. 300 KiB: %d ranges exact, %d ranges memset, %d same-address reallocations%s",
       bufs.size(), ranges_ok, memsets, reused, reused ? "" : " (address never reused: BUFFER_ID renewal unchecked)");
}

// =====================================================================
// attributes_freed
// =====================================================================
unsigned char g_host_array[8192];  // certainly not CUDA memory

const char* attr_name(int a) {
  static const char* names[] = {"?",           "CONTEXT",          "MEMORY_TYPE",      "DEVICE_POINTER",
                                "HOST_POINTER", "P2P_TOKENS",       "SYNC_MEMOPS",      "BUFFER_ID",
                                "IS_MANAGED",   "DEVICE_ORDINAL",   "IS_LEGACY_CUDA_IPC_CAPABLE",
                                "RANGE_START_ADDR", "RANGE_SIZE",   "MAPPED",           "ALLOWED_HANDLE_TYPES",
                                "IS_GPU_DIRECT_RDMA_CAPABLE", "ACCESS_FLAGS", "MEMPOOL_HANDLE", "MAPPING_SIZE",
                                "MAPPING_BASE_ADDR", "MEMORY_BLOCK_ID", "IS_HW_DECOMPRESS_CAPABLE"};
  return a >= 1 && a <= 21 ? names[a] : "?";
}

struct AttrAnswer {
  CUresult single_rc;
  CUresult multi_rc;
  unsigned char value[64];  // the plural call's answer; a pointer equal to the query marked
};

AttrAnswer query_attr(CUdeviceptr ptr, int attr) {
  AttrAnswer a{};
  alignas(16) unsigned char scratch[64] = {};
  a.single_rc = cuPointerGetAttribute(scratch, static_cast<CUpointer_attribute>(attr), ptr);
  CUpointer_attribute one = static_cast<CUpointer_attribute>(attr);
  void* data[1] = {a.value};
  a.multi_rc = cuPointerGetAttributes(1, &one, data, ptr);
  // Pointer-valued attributes may echo the queried address: compare that
  // fact, not the address itself.
  if (attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER || attr == CU_POINTER_ATTRIBUTE_HOST_POINTER ||
      attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attr == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR) {
    std::uint64_t v;
    std::memcpy(&v, a.value, sizeof v);
    if (v == ptr && v != 0) {
      v = 0x5e1f5e1f5e1f5e1full;  // "the queried address"
      std::memcpy(a.value, &v, sizeof v);
    }
  }
  return a;
}

std::string hex_prefix(const unsigned char* v, int n) {
  std::string s;
  char b[4];
  for (int i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", v[i]);
    s += b;
  }
  return s;
}

bool same_answer(const AttrAnswer& a, const AttrAnswer& b) {
  return a.multi_rc == b.multi_rc && std::memcmp(a.value, b.value, sizeof a.value) == 0;
}

// Compares every attribute for `freed` with the answers for a static host
// array and, when there is one, for device address space whose (VMM)
// allocation was unmapped and freed: memory the driver has certainly
// forgotten.  Matching either is right (the two agree unless the system
// lets the GPU reach pageable host memory, HMM/ATS, and says so); counts
// the attributes where the two references differ in *ref_differ.
int compare_attributes(CUdeviceptr freed, CUdeviceptr host, CUdeviceptr vmm, const char* what, int* ref_differ) {
  int differ = 0;
  for (int attr = 1; attr <= 21; ++attr) {
    const AttrAnswer f = query_attr(freed, attr), h = query_attr(host, attr);
    const AttrAnswer v = vmm ? query_attr(vmm, attr) : h;
    if (h.single_rc != v.single_rc || !same_answer(h, v)) ++*ref_differ;
    if (f.single_rc != h.single_rc && f.single_rc != v.single_rc) {
      ++differ;
      fail("%s: cuPointerGetAttribute(%s) -> %s; static host array -> %s, freed VMM range -> %s", what,
           attr_name(attr), drv_name(f.single_rc), drv_name(h.single_rc), vmm ? drv_name(v.single_rc) : "-");
    }
    if (!same_answer(f, h) && !same_answer(f, v)) {
      ++differ;
      fail("%s: cuPointerGetAttributes(%s) -> %s value %s; static host array -> %s value %s, freed VMM range -> "
           "%s value %s",
           what, attr_name(attr), drv_name(f.multi_rc), hex_prefix(f.value, 16).c_str(), drv_name(h.multi_rc),
           hex_prefix(h.value, 16).c_str(), vmm ? drv_name(v.multi_rc) : "-",
           vmm ? hex_prefix(v.value, 16).c_str() : "-");
    }
  }
  return differ;
}

// Device address space that held memory and no longer does: a VMM range
// reserved, backed, mapped, written, then unmapped, released and freed.
// cachalloc does not manage the program's own cuMem* mappings, so the
// driver answers for it in both runs.  0 when VMM is unavailable.
CUdeviceptr forgotten_device_range(std::size_t want) {
  CUdevice dev = 0;
  int vmm = 0;
  if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) != CUDA_SUCCESS || !vmm)
    return 0;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  std::size_t gran = 0;
  if (!CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))) return 0;
  const std::size_t span = (want + gran - 1) / gran * gran;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  if (!CKD(cuMemAddressReserve(&va, span, 0, 0, 0))) return 0;
  bool mapped = false;
  if (CKD(cuMemCreate(&h, span, &prop, 0))) {
    mapped = CKD(cuMemMap(va, span, 0, h, 0));
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (mapped && CKD(cuMemSetAccess(va, span, &access, 1)) && CKD(cuMemsetD8(va, 0x3c, span)))
      verify(reinterpret_cast<void*>(va), span, constant_byte(0x3c), "VMM reference range while mapped");
    if (mapped) CKD(cuMemUnmap(va, span));
    CKD(cuMemRelease(h));
  }
  CKD(cuMemAddressFree(va, span));
  return mapped ? va : 0;
}

void pattern_attributes_freed() {
  if (examples::sanitizer_safe()) {  // every query of a freed or host pointer fails on purpose
    g_skip = "--sanitizer-safe: queries freed and host pointers on purpose";
    return;
  }
  // A small freed block between two live neighbours (under cachalloc its
  // segment certainly stays mapped), and a large freed buffer.
  Buf left{nullptr, 1000, pattern(0xa1)}, victim{nullptr, 1500, pattern(0xa2)}, right{nullptr, 1000, pattern(0xa3)},
      large{nullptr, 3 * MiB + 4, pattern(0xa4)};
  for (Buf* b : {&left, &victim, &right, &large}) {
    if (!CK(cudaMalloc(&b->p, b->n))) return;
    fill(b->p, b->n, b->c);
  }
  if (!sync_ok("attributes_freed: fill")) return;
  for (Buf* b : {&left, &victim, &right, &large}) verify(b->p, b->n, b->c, "buffer of %zu bytes before the free", b->n);

  // A live pointer first.
  cudaPointerAttributes live{};
  if (CK(cudaPointerGetAttributes(&live, left.p)) &&
      (live.type != cudaMemoryTypeDevice || live.device != 0 || live.devicePointer != left.p))
    fail("cudaPointerGetAttributes(live buffer) = type %d device %d devicePointer %p (buffer %p)",
         static_cast<int>(live.type), live.device, live.devicePointer, left.p);
  if (CK(cudaPointerGetAttributes(&live, at(large.p, 12345))) &&
      (live.type != cudaMemoryTypeDevice || live.device != 0))
    fail("cudaPointerGetAttributes(interior of a live buffer) = type %d device %d", static_cast<int>(live.type),
         live.device);

  void* const victim_p = victim.p;
  void* const large_p = large.p;
  // The second reference, made before the frees so that nothing is
  // allocated between the frees and the queries.
  const CUdeviceptr vmm = forgotten_device_range(4 * MiB);
  CK(cudaFree(victim.p));
  CK(cudaFree(large.p));
  victim.p = large.p = nullptr;
  int differ = 0, ref_differ = 0;
  auto vmm_at = [vmm](std::size_t off) { return vmm ? vmm + off : CUdeviceptr{0}; };
  differ += compare_attributes(dptr(victim_p), dptr(g_host_array), vmm_at(0), "freed small buffer", &ref_differ);
  differ += compare_attributes(dptr(at(victim_p, 700)), dptr(g_host_array + 700), vmm_at(700),
                               "freed small buffer + 700", &ref_differ);
  differ += compare_attributes(dptr(large_p), dptr(g_host_array + 64), vmm_at(64), "freed large buffer", &ref_differ);
  differ += compare_attributes(dptr(at(large_p, 2 * MiB + 3)), dptr(g_host_array + 4099), vmm_at(2 * MiB + 3),
                               "freed large buffer + 2 MiB", &ref_differ);

  for (void* p : {victim_p, static_cast<void*>(at(victim_p, 700)), large_p, static_cast<void*>(at(large_p, MiB))}) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    CUresult r = cuMemGetAddressRange(&base, &size, dptr(p));
    if (r != CUDA_ERROR_NOT_FOUND)
      fail("cuMemGetAddressRange(freed %p) -> %s (base %+lld, %zu bytes), expected CUDA_ERROR_NOT_FOUND", p,
           drv_name(r), static_cast<long long>(base - dptr(p)), size);
  }
  CUdeviceptr hb = 0;
  std::size_t hs = 0;
  const CUresult host_range = cuMemGetAddressRange(&hb, &hs, dptr(g_host_array));

  cudaPointerAttributes host_attr{}, vmm_attr{};
  const cudaError_t host_rc = cudaPointerGetAttributes(&host_attr, g_host_array);
  cudaGetLastError();
  cudaError_t vmm_rc = host_rc;
  vmm_attr = host_attr;
  if (vmm) {
    vmm_rc = cudaPointerGetAttributes(&vmm_attr, reinterpret_cast<void*>(vmm));
    cudaGetLastError();
  }
  for (void* p : {victim_p, large_p}) {
    cudaPointerAttributes fa{};
    const cudaError_t rc = cudaPointerGetAttributes(&fa, p);
    cudaGetLastError();
    const bool like_host = rc == host_rc && fa.device == host_attr.device;
    const bool like_vmm = rc == vmm_rc && fa.device == vmm_attr.device;
    if (fa.type != cudaMemoryTypeUnregistered || !(like_host || like_vmm))
      fail("cudaPointerGetAttributes(freed %p) -> %s type %d device %d; static host array -> %s type %d device %d; "
           "freed VMM range -> %s type %d device %d",
           p, cudaGetErrorName(rc), static_cast<int>(fa.type), fa.device, cudaGetErrorName(host_rc),
           static_cast<int>(host_attr.type), host_attr.device, cudaGetErrorName(vmm_rc),
           static_cast<int>(vmm_attr.type), vmm_attr.device);
  }

  // The neighbours are intact, and the memory serves new buffers correctly.
  Buf again{nullptr, victim.n, pattern(0xa5)}, again_large{nullptr, 3 * MiB + 4, pattern(0xa6)};
  for (Buf* b : {&again, &again_large})
    if (CK(cudaMalloc(&b->p, b->n))) fill(b->p, b->n, b->c);
  if (sync_ok("attributes_freed: refill")) {
    for (Buf* b : {&left, &right, &again, &again_large})
      if (b->p) verify(b->p, b->n, b->c, "buffer of %zu bytes after the free", b->n);
    if (again.p) verify_by_copy(again.p, again.n, again.c, "reallocated small buffer");
  }
  for (Buf* b : {&again, &again_large}) {
    if (!b->p) continue;
    CUdeviceptr start = 0;
    std::size_t size = 0;
    if (CKD(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr(at(b->p, 1)))) &&
        CKD(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr(at(b->p, 1)))) &&
        (start != dptr(b->p) || size != b->n))
      fail("reallocated buffer of %zu bytes: RANGE_START_ADDR %+lld, RANGE_SIZE %zu", b->n,
           static_cast<long long>(start - dptr(b->p)), size);
  }
  for (Buf* b : {&left, &right, &again, &again_large})
    if (b->p) CK(cudaFree(b->p));
  note("21 attributes x 4 freed pointers compared with a static host array and %s: %d differences "
       "(the two references differ in %d answers); cuMemGetAddressRange of the host array -> %s; "
       "cudaPointerGetAttributes of it -> type %d device %d",
       vmm ? "a freed VMM range" : "(no VMM: host array only)", differ, ref_differ, drv_name(host_range),
       static_cast<int>(host_attr.type), host_attr.device);
}

// =====================================================================
// IPC: the parent exports, a child spawned from /proc/self/exe imports
// =====================================================================
constexpr int kChildCmdFd = 200;  // parent -> child commands
constexpr int kChildRepFd = 201;  // child -> parent reports

std::string to_hex(const void* p, std::size_t n) {
  return hex_prefix(static_cast<const unsigned char*>(p), static_cast<int>(n));
}
bool from_hex(const std::string& s, void* out, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto* o = static_cast<unsigned char*>(out);
  for (std::size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (std::sscanf(s.c_str() + 2 * i, "%2x", &v) != 1) return false;
    o[i] = static_cast<unsigned char>(v);
  }
  return true;
}

std::uint32_t child_seed(std::uint32_t seed) { return seed ^ 0xa5a5a5a5u; }

struct Child {
  pid_t pid = -1;
  int cmd = -1;  // write end
  int rep = -1;  // read end
  std::string got;
};

// Starts `/proc/self/exe __ipc_child ROLE SPEC...`, with LD_PRELOAD kept or
// removed from the environment it passes explicitly.
bool spawn_child(Child& c, bool keep_preload, const std::vector<std::string>& args) {
  int cmd[2], rep[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0) {
    fail("pipe2: %s", std::strerror(errno));
    return false;
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (keep_preload || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env_strings.push_back(*e);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  std::vector<std::string> all = {"/proc/self/exe", "__ipc_child"};
  all.insert(all.end(), args.begin(), args.end());
  for (auto& s : all) argv.push_back(&s[0]);
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, cmd[0], kChildCmdFd);  // dup2 clears O_CLOEXEC
  posix_spawn_file_actions_adddup2(&fa, rep[1], kChildRepFd);
  std::fflush(stdout);
  const int rc = posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(cmd[0]);
  close(rep[1]);
  c.cmd = cmd[1];
  c.rep = rep[0];
  if (rc != 0) {
    fail("posix_spawn(/proc/self/exe): %s", std::strerror(rc));
    close(c.cmd);
    close(c.rep);
    c.pid = -1;
    return false;
  }
  return true;
}

// Reads the child's reports until a line starting with `tag`; returns the
// failures it counted, or -1 (reported) on timeout or early exit.
int await_report(Child& c, const char* tag, int timeout_s) {
  const std::string want = std::string(tag) + " ";
  timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    std::size_t pos = 0;
    while ((pos = c.got.find('\n')) != std::string::npos) {
      std::string line = c.got.substr(0, pos);
      c.got.erase(0, pos + 1);
      if (line.compare(0, want.size(), want) == 0) return std::atoi(line.c_str() + want.size());
    }
    timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const long left_ms = timeout_s * 1000L - ((t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L);
    if (left_ms <= 0) {
      fail("the child sent no %s report within %d s", tag, timeout_s);
      return -1;
    }
    pollfd pfd{c.rep, POLLIN, 0};
    const int n = poll(&pfd, 1, static_cast<int>(left_ms));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[512];
    const ssize_t r = read(c.rep, buf, sizeof buf);
    if (r <= 0) {
      fail("the child exited before its %s report", tag);
      return -1;
    }
    c.got.append(buf, static_cast<std::size_t>(r));
  }
}

// Closes the pipes and reaps the child (killed after `timeout_s`); returns
// its exit status, or -1.
int finish_child(Child& c, int timeout_s) {
  if (c.cmd >= 0) close(c.cmd);
  if (c.rep >= 0) close(c.rep);
  c.cmd = c.rep = -1;
  if (c.pid <= 0) return -1;
  for (int i = 0; i < timeout_s * 10; ++i) {
    int st = 0;
    const pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) {
      c.pid = -1;
      if (WIFEXITED(st)) return WEXITSTATUS(st);
      fail("the child died from signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      return -1;
    }
    if (r < 0) {
      c.pid = -1;
      return -1;
    }
    usleep(100 * 1000);
  }
  fail("the child did not exit within %d s: killed", timeout_s);
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  c.pid = -1;
  return -1;
}

struct Export {
  Buf buf;
  cudaIpcMemHandle_t handle{};
  bool exported = false;
};

std::string spec_of(const Export& e) {
  char tail[64];
  std::snprintf(tail, sizeof tail, ",%zu,%u", e.buf.n, e.buf.c.seed);
  return to_hex(&e.handle, sizeof e.handle) + tail;
}

// True when CACHALLOC_CONF asks for expandable segments, whose memory (like
// any cuMemMap'ed memory) cudaIpcGetMemHandle may refuse.
bool expandable_configured() {
  const char* conf = std::getenv("CACHALLOC_CONF");
  return conf && strcasestr(conf, "expandable_segments:true") != nullptr;
}

// Exports a buffer; `interior` asks with a pointer inside it (the handle
// must still describe the whole buffer).  A refused interior export falls
// back to the base (noted: the driver documents only base pointers).  With
// `refusal`, a refused export is recorded there instead of failing.
bool export_buffer(Export& e, std::size_t interior, std::string* refusal = nullptr) {
  cudaError_t rc = cudaIpcGetMemHandle(&e.handle, at(e.buf.p, interior));
  if (rc != cudaSuccess && interior) {
    cudaGetLastError();
    note("cudaIpcGetMemHandle(buffer of %zu + %zu) refused (%s): exporting its base instead", e.buf.n, interior,
         cudaGetErrorName(rc));
    rc = cudaIpcGetMemHandle(&e.handle, e.buf.p);
  }
  if (rc != cudaSuccess) {
    if (refusal)
      *refusal = cudaGetErrorName(rc);
    else
      fail("cudaIpcGetMemHandle(buffer of %zu) -> %s", e.buf.n, cudaGetErrorName(rc));
    cudaGetLastError();
    return false;
  }
  e.exported = true;
  return true;
}

// The ipc pattern.  Buffers (each followed by an unexported guard of the
// same size): 0 closed early by the child, 1 and 4 written by the child,
// 2 and 5 freed by the parent while the child still has them open, 3
// exported through an interior pointer.
void ipc_round(bool keep_preload) {
  const std::size_t sizes[6] = {64, 999, 4100, 100003, MiB, 3 * MiB + 12};
  const char* preload = std::getenv("LD_PRELOAD");
  note("importer: %s (LD_PRELOAD=%s in the child)", keep_preload ? "keeps LD_PRELOAD" : "without LD_PRELOAD",
       keep_preload && preload ? preload : "");
  Export ex[6];
  Buf guard[6];
  for (int i = 0; i < 6; ++i) {
    ex[i].buf = {nullptr, sizes[i], pattern(0x1000u + 17u * i + (keep_preload ? 0 : 0x100))};
    guard[i] = {nullptr, sizes[i], pattern(0x2000u + 17u * i)};
    if (!CK(cudaMalloc(&ex[i].buf.p, sizes[i])) || !CK(cudaMalloc(&guard[i].p, sizes[i]))) return;
    fill(ex[i].buf.p, sizes[i], ex[i].buf.c);
    fill(guard[i].p, sizes[i], guard[i].c);
  }
  if (!sync_ok("ipc: fill")) return;
  for (int i = 0; i < 6; ++i) verify(ex[i].buf.p, sizes[i], ex[i].buf.c, "exported buffer %d before export", i);
  // Under expandable segments an export may be refused (expandable_ipc
  // checks that case); then this round is skipped, not failed.
  const bool expandable = expandable_configured();
  std::string refusal;
  std::vector<std::string> args = {"full"};
  for (int i = 0; i < 6; ++i) {
    const std::size_t interior = i == 3 && !examples::sanitizer_safe() ? 4096 : 0;  // may be refused
    if (!export_buffer(ex[i], interior, expandable ? &refusal : nullptr)) break;
    args.push_back(spec_of(ex[i]));
  }
  if (args.size() != 7) {
    if (!refusal.empty())
      g_skip = "cudaIpcGetMemHandle refused " + refusal + " with expandable_segments:true (expandable_ipc checks that)";
    for (int i = 0; i < 6; ++i) {
      CK(cudaFree(ex[i].buf.p));
      CK(cudaFree(guard[i].p));
    }
    return;
  }
  // Two exports of live buffers are never the same handle.
  for (int i = 0; i < 6; ++i)
    for (int j = i + 1; j < 6; ++j)
      if (std::memcmp(&ex[i].handle, &ex[j].handle, sizeof ex[i].handle) == 0)
        fail("buffers %d and %d were exported with identical handles", i, j);

  Child child;
  if (!spawn_child(child, keep_preload, args)) return;
  const int child_fails = await_report(child, "END", 120);
  if (child_fails > 0) fail("the child counted %d failures while importing (see its lines)", child_fails);
  // The child wrote buffers 1 and 4, nothing else.
  ex[1].buf.c = pattern(child_seed(ex[1].buf.c.seed));
  ex[4].buf.c = pattern(child_seed(ex[4].buf.c.seed));
  if (child_fails >= 0) {
    for (int i = 0; i < 6; ++i) {
      verify(ex[i].buf.p, sizes[i], ex[i].buf.c, "exported buffer %d after the child (%s)", i,
             i == 1 || i == 4 ? "written by the child" : "not written by the child");
      verify(guard[i].p, sizes[i], guard[i].c, "unexported neighbour %d after the child", i);
    }
    verify_by_copy(ex[1].buf.p, sizes[1], ex[1].buf.c, "buffer 1 written by the child");
  }

  // Free 2 and 5 while the child keeps them open; new buffers of the same
  // sizes get new data.  The child must still read the old contents.
  std::vector<Buf> fresh;
  if (child_fails >= 0 && examples::sanitizer_safe()) {
    note("--sanitizer-safe: buffers are not freed while the child has them open");
  } else if (child_fails >= 0) {
    for (int i : {2, 5}) {
      CK(cudaFree(ex[i].buf.p));
      ex[i].buf.p = nullptr;
      for (int k = 0; k < 4; ++k) {
        Buf b{nullptr, sizes[i], pattern(0x3000u + 16u * i + k)};
        if (!CK(cudaMalloc(&b.p, b.n))) continue;
        fill(b.p, b.n, b.c);
        fresh.push_back(b);
      }
    }
    sync_ok("ipc: new buffers after the free");
    // cuda.h calls freeing exported memory before the importer closes it
    // undefined; the bare driver reuses a small sub-allocation at once
    // (measured on the H100) while cachalloc promises never to reuse an
    // exported block: checked only under cachalloc.
    const bool under_cachalloc = preload != nullptr && std::strstr(preload, "cachalloc") != nullptr;
    if (!under_cachalloc) {
      note("bare driver: reuse of freed exported memory not checked (undefined in cuda.h)");
      if (write(child.cmd, "skip\n", 5) != 5) fail("could not send the skip command to the child");
    } else {
      if (write(child.cmd, "check\n", 6) != 6) fail("could not send the check command to the child");
      const int late_fails = await_report(child, "END2", 60);
      if (late_fails > 0)
        fail("the child no longer read the old contents of buffers the parent freed (%d failures)", late_fails);
    }
  }
  const int status = finish_child(child, 30);
  if (status != 0 && status != -1) fail("the child exited with %d", status);
  for (const Buf& b : fresh) verify(b.p, b.n, b.c, "new buffer of %zu bytes after the child", b.n);
  for (int i = 0; i < 6; ++i) {
    if (ex[i].buf.p) verify(ex[i].buf.p, sizes[i], ex[i].buf.c, "exported buffer %d at the end", i);
    verify(guard[i].p, sizes[i], guard[i].c, "unexported neighbour %d at the end", i);
  }
  for (const Buf& b : fresh) CK(cudaFree(b.p));
  for (int i = 0; i < 6; ++i) {
    if (ex[i].buf.p) CK(cudaFree(ex[i].buf.p));
    CK(cudaFree(guard[i].p));
  }
  note("6 buffers of 64 B .. 3 MiB exported (one through an interior pointer); child verified, wrote 2, closed 1; "
       "2 freed by the parent while open, %zu new buffers of their sizes", fresh.size());
}

void pattern_ipc_shim_importer() { ipc_round(true); }
void pattern_ipc_bare_importer() { ipc_round(false); }

// Under expandable segments a buffer may not be exportable; if it is, both
// kinds of importer must see exactly the buffer.
void pattern_expandable_ipc() {
  const std::size_t sizes[3] = {1000, 2 * MiB + 4, 20 * MiB + 12};
  Export ex[3];
  Buf guard[3];
  for (int i = 0; i < 3; ++i) {
    ex[i].buf = {nullptr, sizes[i], pattern(0x4000u + 7u * i)};
    guard[i] = {nullptr, sizes[i], pattern(0x5000u + 7u * i)};
    if (!CK(cudaMalloc(&ex[i].buf.p, sizes[i])) || !CK(cudaMalloc(&guard[i].p, sizes[i]))) return;
    fill(ex[i].buf.p, sizes[i], ex[i].buf.c);
    fill(guard[i].p, sizes[i], guard[i].c);
  }
  if (!sync_ok("expandable_ipc: fill")) return;
  std::vector<std::string> args = {"verify"};
  int refused = 0;
  std::string refusals;
  for (int i = 0; i < 3; ++i) {
    const cudaError_t rc = cudaIpcGetMemHandle(&ex[i].handle, ex[i].buf.p);
    if (rc != cudaSuccess) {
      cudaGetLastError();
      ++refused;
      refusals += std::string(" ") + cudaGetErrorName(rc);
      continue;
    }
    ex[i].exported = true;
    args.push_back(spec_of(ex[i]));
  }
  int imported = 0;
  if (args.size() > 1) {
    for (bool keep : {true, false}) {
      Child child;
      if (!spawn_child(child, keep, args)) continue;
      const int child_fails = await_report(child, "END", 120);
      if (child_fails > 0)
        fail("the %s importer counted %d failures (see its lines)", keep ? "shim" : "bare", child_fails);
      else if (child_fails == 0)
        ++imported;
      const int status = finish_child(child, 30);
      if (status != 0 && status != -1) fail("the child exited with %d", status);
    }
  }
  for (int i = 0; i < 3; ++i) {
    verify(ex[i].buf.p, sizes[i], ex[i].buf.c, "buffer %d after the importers", i);
    verify(guard[i].p, sizes[i], guard[i].c, "unexported neighbour %d after the importers", i);
    CK(cudaFree(ex[i].buf.p));
    CK(cudaFree(guard[i].p));
  }
  note("%zu of 3 buffers exported and checked by %d importers; %d exports refused%s", args.size() - 1, imported,
       refused, refusals.c_str());
}

// The child: imports the specs, verifies, reports.  Role "full": also
// writes buffers 1 and 4, closes 0, and on "check" verifies the others
// again (2 and 5 have been freed by the parent meanwhile).  Role "verify":
// imports, verifies, closes.
int report_line(const char* tag, int failures) {
  char line[64];
  const int n = std::snprintf(line, sizeof line, "%s %d\n", tag, failures);
  return write(kChildRepFd, line, static_cast<std::size_t>(n)) == n ? 0 : -1;
}

int ipc_child(int argc, char** argv) {
  if (argc < 4) return 2;
  const bool full = std::strcmp(argv[2], "full") == 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("    child: no usable GPU\n");
    report_line("END", 1);
    return 77;
  }
  CK(cudaSetDevice(0));
  if (!g_slots.init()) {
    report_line("END", 1);
    return 1;
  }
  struct Import {
    cudaIpcMemHandle_t handle;
    std::size_t n;
    std::uint32_t seed;
    void* p = nullptr;
    Content c{false, 0};
  };
  std::vector<Import> imp;
  for (int i = 3; i < argc; ++i) {
    Import m{};
    std::string s = argv[i];
    const std::size_t c1 = s.find(','), c2 = s.find(',', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos || !from_hex(s.substr(0, c1), &m.handle, sizeof m.handle)) {
      fail("child: malformed argument %s", argv[i]);
      continue;
    }
    m.n = std::strtoull(s.c_str() + c1 + 1, nullptr, 10);
    m.seed = static_cast<std::uint32_t>(std::strtoul(s.c_str() + c2 + 1, nullptr, 10));
    m.c = pattern(m.seed);
    imp.push_back(m);
  }
  for (std::size_t i = 0; i < imp.size(); ++i) {
    Import& m = imp[i];
    if (!CK(cudaIpcOpenMemHandle(&m.p, m.handle, cudaIpcMemLazyEnablePeerAccess))) {
      m.p = nullptr;
      continue;
    }
    verify(m.p, m.n, m.c, "child: imported buffer %zu (%zu bytes)", i, m.n);
    for (std::size_t off : {std::size_t{0}, m.n / 2, m.n - 1}) {
      CUdeviceptr base = 0;
      std::size_t size = 0;
      if (CKD(cuMemGetAddressRange(&base, &size, dptr(at(m.p, off)))) && (base != dptr(m.p) || size != m.n))
        fail("child: cuMemGetAddressRange(imported buffer %zu + %zu) = (import %+lld, %zu bytes), expected "
             "(import +0, %zu)",
             i, off, static_cast<long long>(base - dptr(m.p)), size, m.n);
    }
  }
  if (full && imp.size() == 6) {
    for (int i : {1, 4})
      if (imp[i].p) {
        imp[i].c = pattern(child_seed(imp[i].seed));
        fill(imp[i].p, imp[i].n, imp[i].c);
      }
    sync_ok("child: writes");
    if (imp[0].p) CK(cudaIpcCloseMemHandle(imp[0].p));
    imp[0].p = nullptr;
    for (std::size_t i = 1; i < imp.size(); ++i)
      if (imp[i].p) verify(imp[i].p, imp[i].n, imp[i].c, "child: buffer %zu after closing buffer 0", i);
  }
  std::fflush(stdout);
  report_line("END", g_failures);
  if (full) {
    // Wait for the parent's command: verify again after its frees.
    char cmd[16] = {};
    std::size_t got = 0;
    while (got < sizeof cmd - 1) {
      const ssize_t r = read(kChildCmdFd, cmd + got, 1);
      if (r <= 0 || cmd[got] == '\n') break;
      ++got;
    }
    if (std::strncmp(cmd, "check", 5) == 0) {
      const int before = g_failures;
      for (std::size_t i = 1; i < imp.size(); ++i)
        if (imp[i].p)
          verify(imp[i].p, imp[i].n, imp[i].c, "child: buffer %zu after the parent freed 2 and 5 and allocated anew", i);
      std::fflush(stdout);
      report_line("END2", g_failures - before);
    }
  }
  for (Import& m : imp)
    if (m.p) CK(cudaIpcCloseMemHandle(m.p));
  std::fflush(stdout);
  return g_failures ? 1 : 0;
}

// =====================================================================
// reset
// =====================================================================
void pattern_reset() {
  const std::size_t sizes[] = {512, 1000, 4100, 100000, MiB, 3 * MiB + 12, 17 * MiB};
  for (int r = 0; r < 3; ++r) {
    Buf b{nullptr, MiB + 4u * r, pattern(0x6000u + r)};
    if (CK(cudaMalloc(&b.p, b.n))) {
      fill(b.p, b.n, b.c);
      if (sync_ok("reset: fill before the reset")) verify(b.p, b.n, b.c, "round %d: buffer before cudaDeviceReset", r);
      CK(cudaFree(b.p));
    }
    if (!CK(cudaDeviceReset())) return;
    if (!g_slots.init()) return;  // the reset freed the pinned result slots
    Buf a{nullptr, MiB + 4u * r, pattern(0x6100u + r)};
    if (CK(cudaMalloc(&a.p, a.n))) {
      fill(a.p, a.n, a.c);
      if (sync_ok("reset: fill after the reset")) {
        verify(a.p, a.n, a.c, "round %d: buffer after cudaDeviceReset", r);
        verify_by_copy(a.p, a.n, a.c, "buffer after cudaDeviceReset");
      }
      CK(cudaFree(a.p));
    }
  }
  // A buffer still live at the reset is gone with it; many allocations after.
  void* kept = nullptr;
  if (CK(cudaMalloc(&kept, 4 * MiB))) fill(kept, 4 * MiB, pattern(0x6200));
  sync_ok("reset: kept buffer");
  if (!CK(cudaDeviceReset())) return;
  if (!g_slots.init()) return;
  std::vector<Buf> many;
  for (int i = 0; i < 60; ++i) {
    Buf b{nullptr, sizes[i % 7] + 4u * (i / 7), pattern(0x6300u + i)};
    if (!CK(cudaMalloc(&b.p, b.n))) break;
    fill(b.p, b.n, b.c);
    many.push_back(b);
  }
  if (sync_ok("reset: many buffers after a reset with one live")) {
    check_disjoint(many, "reset");
    for (const Buf& b : many) verify(b.p, b.n, b.c, "buffer of %zu bytes after the second kind of reset", b.n);
  }
  for (const Buf& b : many) CK(cudaFree(b.p));

  // A context of the program's own, destroyed with memory cached in it,
  // then created again (often with the same handle value).
  CUdevice dev = 0;
  int ctx_rounds = 0;
  if (CKD(cuDeviceGet(&dev, 0))) {
    for (int r = 0; r < 3; ++r) {
      CUcontext ctx = nullptr;
      CUctxCreateParams params{};
      // Sanitizer-safe: the parameters spelled out first, so that no attempt
      // fails on a driver that wants them.
      CUresult cr = cuCtxCreate(&ctx, examples::sanitizer_safe() ? &params : nullptr, 0, dev);
      if (cr == CUDA_ERROR_INVALID_VALUE)  // a driver that wants the (empty) parameters spelled out (or not)
        cr = cuCtxCreate(&ctx, examples::sanitizer_safe() ? nullptr : &params, 0, dev);
      if (!ok_drv(cr, "cuCtxCreate", __LINE__)) break;
      const std::size_t n = MiB + 256u * r;
      std::vector<unsigned char> h(n), back(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = byte_at(false, 0x6400u + r, i);
      for (int k = 0; k < 3; ++k) {
        CUdeviceptr d = 0, e = 0;
        if (!CKD(cuMemAlloc(&d, n))) break;
        if (CKD(cuMemAlloc(&e, 4096)) && CKD(cuMemsetD32(e, 0x5a5a5a5au, 1024))) {
          std::vector<std::uint32_t> w(1024);
          if (CKD(cuMemcpyDtoH(w.data(), e, 4096)) &&
              std::count(w.begin(), w.end(), 0x5a5a5a5au) != static_cast<long>(w.size()))
            fail("context round %d: cuMemsetD32 of a 4 KiB buffer did not read back", r);
        }
        if (CKD(cuMemcpyHtoD(d, h.data(), n)) && CKD(cuMemcpyDtoH(back.data(), d, n)) && back != h)
          fail("context round %d: 1 MiB copied in and out came back different", r);
        if (e) CKD(cuMemFree(e));
        CKD(cuMemFree(d));
      }
      if (CKD(cuCtxDestroy(ctx))) ++ctx_rounds;
    }
  }
  CK(cudaSetDevice(0));
  Buf last{nullptr, 2 * MiB, pattern(0x6500)};
  if (CK(cudaMalloc(&last.p, last.n))) {
    fill(last.p, last.n, last.c);
    if (sync_ok("reset: after the contexts")) verify(last.p, last.n, last.c, "runtime buffer after cuCtxDestroy");
    CK(cudaFree(last.p));
  }
  note("3 x (malloc, kernel, free, cudaDeviceReset, malloc, kernel); a reset with a buffer live, then %zu "
       "buffers; %d own contexts created, used and destroyed",
       many.size(), ctx_rounds);
}

// =====================================================================
// peer
// =====================================================================
// Kernels on `from` read and write buffers of `owner`, and copies go both ways.
void peer_exchange(std::vector<Buf>& a, int owner, std::vector<Buf>& b, int other, const char* phase, std::uint32_t tag) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    Buf& x = a[i];
    // `other` reads owner's buffer, then writes a new pattern into it.
    CK(cudaSetDevice(other));
    verify(x.p, x.n, x.c, "%s: device %d reads device %d's buffer of %zu bytes", phase, other, owner, x.n);
    x.c = pattern(tag + static_cast<std::uint32_t>(i));
    fill(x.p, x.n, x.c);
    sync_ok("peer: remote write");
    CK(cudaSetDevice(owner));
    verify(x.p, x.n, x.c, "%s: device %d's write into device %d's buffer of %zu bytes", phase, other, owner, x.n);
    // A peer copy into the other device's buffer of the same size.
    Buf& y = b[i];
    CK(cudaMemcpyPeer(y.p, other, x.p, owner, x.n));
    sync_ok("peer: cudaMemcpyPeer");
    CK(cudaSetDevice(other));
    y.c = x.c;
    verify(y.p, y.n, y.c, "%s: cudaMemcpyPeer of %zu bytes from device %d to %d", phase, y.n, owner, other);
  }
}

void pattern_peer() {
  int devices = 0;
  CK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    g_skip = "1 GPU";
    return;
  }
  int can01 = 0, can10 = 0;
  CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  if (!can01 || !can10) {
    g_skip = "devices 0 and 1 cannot access each other";
    return;
  }
  // Result slots made while both devices' contexts exist, so kernels on
  // either can write them.
  CK(cudaSetDevice(1));
  CK(cudaFree(nullptr));
  CK(cudaSetDevice(0));
  if (!g_slots.init()) return;
  auto alloc_on = [](int dev, const std::vector<std::size_t>& sizes, std::uint32_t tag) {
    std::vector<Buf> v;
    CK(cudaSetDevice(dev));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Buf b{nullptr, sizes[i], pattern(tag + static_cast<std::uint32_t>(i))};
      if (!CK(cudaMalloc(&b.p, b.n))) continue;
      fill(b.p, b.n, b.c);
      v.push_back(b);
    }
    sync_ok("peer: fill");
    return v;
  };
  const std::vector<std::size_t> before_sizes = {1000, 64 * KiB + 4, 3 * MiB + 12, 24 * MiB};
  const std::vector<std::size_t> after_sizes = {512, 100003, 2 * MiB + 4, 40 * MiB, 70 * MiB};
  std::vector<Buf> a0 = alloc_on(0, before_sizes, 0x7000), a1 = alloc_on(1, before_sizes, 0x7100);
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  if (a0.size() == before_sizes.size() && a1.size() == before_sizes.size()) {
    peer_exchange(a0, 0, a1, 1, "allocated before enabling", 0x7200);
    peer_exchange(a1, 1, a0, 0, "allocated before enabling", 0x7300);
  }
  // Buffers allocated after enabling (new memory, new pages).
  std::vector<Buf> b0 = alloc_on(0, after_sizes, 0x7400), b1 = alloc_on(1, after_sizes, 0x7500);
  if (b0.size() == after_sizes.size() && b1.size() == after_sizes.size()) {
    peer_exchange(b0, 0, b1, 1, "allocated after enabling", 0x7600);
    peer_exchange(b1, 1, b0, 0, "allocated after enabling", 0x7700);
  }
  // The older buffers are still reachable from the peer.
  CK(cudaSetDevice(1));
  for (const Buf& x : a0) verify(x.p, x.n, x.c, "device 1 reads device 0's older buffer of %zu bytes again", x.n);
  CK(cudaSetDevice(0));
  for (const Buf& x : a1) verify(x.p, x.n, x.c, "device 0 reads device 1's older buffer of %zu bytes again", x.n);
  CK(cudaSetDevice(0));
  CK(cudaDeviceDisablePeerAccess(1));
  CK(cudaSetDevice(1));
  CK(cudaDeviceDisablePeerAccess(0));
  for (int dev : {0, 1}) {
    CK(cudaSetDevice(dev));
    for (const Buf& x : dev == 0 ? a0 : a1) CK(cudaFree(x.p));
    for (const Buf& x : dev == 0 ? b0 : b1) CK(cudaFree(x.p));
  }
  CK(cudaSetDevice(0));
  note("devices 0 and 1: %zu + %zu buffers per device (before / after enabling peer access), kernels and "
       "cudaMemcpyPeer both ways",
       a0.size(), b0.size());
}

// =====================================================================
struct Pattern {
  const char* name;
  void (*run)();
};
const Pattern kPatterns[] = {
    {"range_memset", pattern_range_memset},
    {"attributes_freed", pattern_attributes_freed},
    {"ipc_shim_importer", pattern_ipc_shim_importer},
    {"ipc_bare_importer", pattern_ipc_bare_importer},
    {"expandable_ipc", pattern_expandable_ipc},
    {"reset", pattern_reset},
    {"peer", pattern_peer},
};

bool selected(const char* name, int argc, char** argv) {
  if (argc < 2) return true;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0 ||
        (std::strcmp(argv[i], "ipc") == 0 && std::strncmp(name, "ipc_", 4) == 0))
      return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);  // a dead IPC child must fail a check, not kill the parent
  if (argc >= 2 && std::strcmp(argv[1], "__ipc_child") == 0) return ipc_child(argc, argv);
  examples::take_sanitizer_safe_flag(argc, argv);
  for (int i = 1; i < argc; ++i) {
    bool known = std::strcmp(argv[i], "ipc") == 0;
    for (const Pattern& p : kPatterns) known = known || std::strcmp(argv[i], p.name) == 0;
    if (!known) {
      std::printf("fidelity_patterns: unknown pattern %s (known: ipc", argv[i]);
      for (const Pattern& p : kPatterns) std::printf(" %s", p.name);
      std::printf(")\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("fidelity_patterns: SKIP (no usable GPU)\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::printf("fidelity_patterns: %s (%d GPUs), cudart %d, driver %d, CACHALLOC_CONF=%s%s\n", prop.name, devices,
              CUDART_VERSION, driver, std::getenv("CACHALLOC_CONF") ? std::getenv("CACHALLOC_CONF") : "",
              examples::sanitizer_safe() ? ", sanitizer-safe" : "");
  if (!CK(cudaSetDevice(0)) || !g_slots.init()) {
    std::printf("fidelity_patterns: FAIL (no pinned result memory)\n");
    return 1;
  }
  int failed = 0;
  std::string failed_names;
  for (const Pattern& p : kPatterns) {
    if (!selected(p.name, argc, argv)) continue;
    g_failures = 0;
    g_first_failure.clear();
    g_skip.clear();
    std::printf("  %s\n", p.name);
    p.run();
    if (g_failures) {
      ++failed;
      failed_names += std::string(" ") + p.name;
      std::printf("%s: FAIL %s%s\n", p.name, g_first_failure.c_str(),
                  g_failures > 1 ? (" (+" + std::to_string(g_failures - 1) + " more)").c_str() : "");
    } else if (!g_skip.empty()) {
      std::printf("%s: SKIP (%s)\n", p.name, g_skip.c_str());
    } else {
      std::printf("%s: PASS\n", p.name);
    }
  }
  if (failed == 0) {
    std::printf("fidelity_patterns: PASS\n");
    return 0;
  }
  std::printf("fidelity_patterns: FAIL (%d patterns failed:%s)\n", failed, failed_names.c_str());
  return 1;
}
