// simt.h: a SIMT emulator that lets g++ (C++20) compile Pagoda's `.cu` kernels for the
// host, so their logic runs in plain `cargo test` on machines with no GPU and no nvcc.
//
// How it works
//   * `pagoda_emu::launch(grid, block, dyn_smem, kernel, args...)` runs one fiber (or,
//     under the sanitizers, one std::thread) per CUDA thread of a block; the same threads
//     then run every block of the grid, one block after another (a block barrier
//     separates consecutive blocks). See `Barrier` for the two modes.
//   * `threadIdx`/`blockIdx`/`blockDim`/`gridDim` are thread_local globals (swapped per
//     fiber).
//   * `__syncthreads()` is a blocking barrier over the block's threads; `__syncwarp()` one
//     over the warp's lanes.
//   * `__shared__` expands to `static`: a function-local static array is one storage
//     shared by all emulated threads, and because blocks run serially and launches are
//     serialized (one global mutex), it is exactly per-block storage. Like on the GPU its
//     contents are garbage at block start. Dynamic shared memory: `PG_DYN_SHARED`.
//   * Warp shuffles and votes go through per-warp slots: every lane writes its value,
//     warp barrier, every lane reads its source lane's slot, warp barrier.
//   * `mma_m16n8k16<T>` (T = bf16 or f16, f32 accumulate) rebuilds A (16x16, row),
//     B (16x8, col) and C (16x8) from the 32 lanes' registers with the PTX ISA's
//     fragment layout and gives each lane the D elements that the hardware would, so a
//     kernel that puts a value in the wrong register fails on the CPU.
//   * bf16/f16 are host structs with round-to-nearest-even conversions.
//
// Limits (also in docs/gpu.md)
//   * Blocks run one after another: no inter-block concurrency, so kernels that spin on
//     another block's progress deadlock, and inter-block races are not found.
//   * Collectives (shuffles, votes, mma, __syncwarp) need the full warp: mask 0xffffffff,
//     every lane of a 32-lane warp participating (a partial last warp aborts).
//   * A thread that returns early must not be followed by a `__syncthreads()` of the
//     others (they would wait for it forever; the GPU tolerates this in practice).
//   * ldmatrix (m8n8 .x4, plain and .trans, b16) is emulated through the warp slots;
//     cp.async (common.cuh) is a synchronous copy, so a missing wait_group is not found;
//     stmatrix, wgmma, TMA, clusters are not emulated: hide them behind helpers with a
//     host fallback.
//   * Out-of-bounds accesses are not caught (a __shared__ overflow lands in other
//     statics): build the kernels with -fsanitize=address (tests/sanitizers.rs).
//   * Tensor-core rounding differs: the host sums the 16 products of an mma in f32 in
//     order; hardware may accumulate with a different order and truncation. Tests need
//     tolerances, never bit equality, for mma results.
//   * Slow: microseconds per emulated thread and per barrier (tens with OS threads);
//     keep shapes small.
//   * Memory model: the host is x86 TSO plus C++ barriers, stronger than the GPU's;
//     a missing __threadfence() is not found. Missing __syncthreads() is found by TSan.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ucontext.h>

// ---- CUDA keywords that mean nothing on the host -------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

// Per emulated thread: its coordinates (the CUDA built-ins).
inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

namespace pagoda_emu {

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "pagoda simt emulator: %s\n", what);
  std::abort();
}

// What a GPU refuses that the host would let pass: a 16-byte vector access (`uint4`
// load/store, `cp.async` of 16 bytes) at an address that is not a multiple of 16 is a
// "misaligned address" fault on the device. The emulated kernels note it here (the
// access itself still runs, on bytes) and the launcher reports it after the launch
// (`pg_emu_take_fault`: Rust's `graph::launch` turns it into an error).
// The flag is global (the emulated threads may be OS threads) and set only under the
// launch mutex; `launch` moves it to the launching thread's `tl_fault` before unlocking.
inline constexpr int kFaultMisaligned = 1;
inline std::atomic<int>& fault_flag() {
  static std::atomic<int> f{0};
  return f;
}
inline thread_local int tl_fault = 0;
inline void check_aligned16(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fault_flag().store(kFaultMisaligned);
}
// An sm_90 block may opt into at most 227 KiB of dynamic shared memory.
inline constexpr size_t kMaxDynSharedBytes = 227 * 1024;

// Two ways to run a block's threads:
//   * fibers (the default): every emulated thread is a fiber (FiberCtx) on the launching
//     OS thread, a barrier yields to the next fiber until the last one arrives. A barrier
//     then costs a few microseconds (one user-space switch per thread), where OS threads
//     on a 2-core machine cost thousands of context switches per barrier (measured with
//     perf: over 90 % of an emulated forward's time). A round in which no fiber arrives
//     anywhere or finishes is a deadlock and aborts, naming it.
//   * OS threads (`PAGODA_EMU_THREADS`, and always under -fsanitize=thread/address, which
//     need real threads and plain stacks): one std::thread per emulated thread, blocking
//     barriers; ThreadSanitizer then sees every race a missing barrier leaves.
#if !defined(PAGODA_EMU_THREADS) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define PAGODA_EMU_FIBERS 1
#endif

struct Fiber;
// The running fiber and the scheduler's context (fiber mode).
inline thread_local Fiber* tl_fiber = nullptr;
inline thread_local bool tl_progress = false;
inline void fiber_yield();

// A barrier over `n` emulated threads.
class Barrier {
 public:
  explicit Barrier(unsigned n) : n_(n) {}
  void arrive_and_wait() {
#ifdef PAGODA_EMU_FIBERS
    const uint64_t gen = gen_;
    tl_progress = true;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      return;
    }
    while (gen_ == gen) fiber_yield();
#else
    std::unique_lock<std::mutex> lk(m_);
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      lk.unlock();
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return gen_ != gen; });
#endif
  }

 private:
#ifndef PAGODA_EMU_FIBERS
  std::mutex m_;
  std::condition_variable cv_;
#endif
  const unsigned n_;
  unsigned count_ = 0;
  uint64_t gen_ = 0;
};

struct Warp {
  explicit Warp(unsigned lanes) : lanes(lanes), bar(lanes) {}
  unsigned lanes;
  Barrier bar;
  uint64_t slot[32];
  uint32_t mma_a[32][4];
  uint32_t mma_b[32][2];
  float mma_c[32][4];
};

struct Block {
  Block(unsigned threads, size_t dyn_bytes) : bar(threads), dyn(std::max<size_t>(1, (dyn_bytes + 15) / 16)) {
    for (unsigned w = 0; w * 32 < threads; ++w)
      warps.push_back(std::make_unique<Warp>(std::min(32u, threads - w * 32)));
  }
  Barrier bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<uint4> dyn;  // dynamic shared memory, 16-byte aligned, exact size (ASan sees overflows)
};

inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned tl_lane = 0;
inline thread_local unsigned tl_warp = 0;

// One launch at a time: `__shared__` statics are per kernel, not per launch.
inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

inline Warp& full_warp() {
  Warp& w = *tl_block->warps[tl_warp];
  if (w.lanes != 32) fail("warp collective in a partial warp (blockDim not a multiple of 32)");
  return w;
}

inline void* dyn_smem() { return tl_block->dyn.data(); }

#ifdef PAGODA_EMU_FIBERS
// A fiber's saved context, and the switch between two. On x86-64 the switch is eight
// instructions of our own (`pg_emu_ctx_switch`): push the callee-saved registers, swap
// stack pointers, pop. glibc's swapcontext also saves the FP environment and makes an
// rt_sigprocmask system call on every switch: measured with perf, over half of an
// emulated forward's time went there. The signal mask and the FP control words
// (MXCSR, x87) are the OS thread's and no kernel changes them, so nothing else needs
// saving. Elsewhere, ucontext.
#if defined(__x86_64__)
extern "C" void pg_emu_ctx_switch(void** save_sp, void* load_sp);
// Defined once per object file that includes this header, as a weak symbol in its own
// COMDAT group: the linker keeps one copy across every crate's emulator build.
__asm__(
    ".pushsection .text.pg_emu_ctx_switch,\"axG\",@progbits,pg_emu_ctx_switch,comdat\n"
    ".weak pg_emu_ctx_switch\n"
    ".hidden pg_emu_ctx_switch\n"
    ".type pg_emu_ctx_switch,@function\n"
    "pg_emu_ctx_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size pg_emu_ctx_switch, .-pg_emu_ctx_switch\n"
    ".popsection\n");
struct FiberCtx {
  void* sp = nullptr;
};
inline void ctx_switch(FiberCtx& save, FiberCtx& load) { pg_emu_ctx_switch(&save.sp, load.sp); }
// A new context that starts `entry` on `stack`: the six registers the switch pops (zero),
// then `entry` as the address it returns to, then a null return address for `entry`
// (which never returns), so `entry` starts with the stack as a call leaves it (rsp + 8
// a multiple of 16).
inline void ctx_make(FiberCtx& c, char* stack, size_t size, void (*entry)()) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 64);
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  sp[6] = reinterpret_cast<void*>(entry);
  sp[7] = nullptr;
  c.sp = sp;
}
#else
struct FiberCtx {
  ucontext_t uc;
};
inline void ctx_switch(FiberCtx& save, FiberCtx& load) {
  if (swapcontext(&save.uc, &load.uc) != 0) fail("swapcontext failed");
}
// Out of line: getcontext returns twice, which would make g++ warn about every local of
// the caller (-Wclobbered).
[[gnu::noinline]] inline void ctx_make(FiberCtx& c, char* stack, size_t size, void (*entry)()) {
  if (getcontext(&c.uc) != 0) fail("getcontext failed");
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

// One emulated thread as a fiber: its context, stack and CUDA built-ins (the built-ins
// are thread_local globals of the one OS thread, swapped in and out with the fiber).
struct Fiber {
  FiberCtx ctx;
  char* stack = nullptr;
  dim3 tid, bid;
  unsigned lane = 0, warp = 0;
  bool done = false;
  const std::function<void()>* body = nullptr;
};
inline thread_local FiberCtx* tl_sched = nullptr;
// Stack of one fiber: kernels keep small per-thread arrays; 256 KiB is far above them
// and costs nothing until touched.
constexpr size_t kFiberStack = 256 * 1024;

inline void fiber_yield() {
  Fiber* f = tl_fiber;
  f->bid = blockIdx;
  ctx_switch(f->ctx, *tl_sched);
}

[[noreturn]] inline void fiber_entry() {
  Fiber* f = tl_fiber;
  (*f->body)();
  f->done = true;
  tl_progress = true;
  // Back to the scheduler for good: a finished fiber is never resumed.
  ctx_switch(f->ctx, *tl_sched);
  fail("a finished fiber was resumed");
}

// Gives `f` its stack and entry point.
// Stacks are kept per OS thread and reused by every launch (allocating them per launch
// made page faults a third of an emulated forward's time).
inline void make_fiber(Fiber& f, unsigned t) {
  static thread_local std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() <= t) stacks.emplace_back(new char[kFiberStack]);
  f.stack = stacks[t].get();
  ctx_make(f.ctx, f.stack, kFiberStack, fiber_entry);
}
#endif

// Runs `kernel(args...)` over the grid. Blocks are serial; threads of a block concurrent
// (fibers or OS threads, see above); a block barrier separates consecutive blocks.
template <class K, class... A>
void launch(dim3 grid, dim3 block, size_t dyn_bytes, K kernel, A... args) {
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024) fail("block size must be 1..=1024 threads");
  if (dyn_bytes > kMaxDynSharedBytes) fail("more than 227 KiB of dynamic shared memory");
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  if (blocks == 0) return;
  std::lock_guard<std::mutex> guard(launch_mutex());
  fault_flag().store(0);
  // Runs last (after the threads), still under the mutex: this launch's fault.
  struct TakeFault {
    ~TakeFault() { tl_fault |= fault_flag().exchange(0); }
  } take_fault;
  Block state(n, dyn_bytes);
  // The body of emulated thread `t`: every block of the grid, in order.
  auto body = [&](unsigned t) {
    tl_block = &state;
    tl_lane = t % 32;
    tl_warp = t / 32;
    blockDim = block;
    gridDim = grid;
    threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
    for (uint64_t b = 0; b < blocks; ++b) {
      blockIdx = dim3(unsigned(b % grid.x), unsigned((b / grid.x) % grid.y),
                      unsigned(b / (uint64_t(grid.x) * grid.y)));
      kernel(args...);
      // The next block reuses the same `__shared__` statics.
      state.bar.arrive_and_wait();
    }
  };
#ifdef PAGODA_EMU_FIBERS
  std::vector<std::function<void()>> bodies;
  std::vector<Fiber> fibers(n);
  bodies.reserve(n);
  FiberCtx sched;
  for (unsigned t = 0; t < n; ++t) {
    bodies.emplace_back([&body, t] { body(t); });
    Fiber& f = fibers[t];
    f.body = &bodies[t];
    make_fiber(f, t);
  }
  FiberCtx* outer_sched = tl_sched;
  Fiber* outer_fiber = tl_fiber;
  tl_sched = &sched;
  for (unsigned live = n; live > 0;) {
    tl_progress = false;
    for (Fiber& f : fibers) {
      if (f.done) continue;
      tl_fiber = &f;
      // A fiber's built-ins: `body` sets them on its first run; restore them after.
      threadIdx = f.tid;
      blockIdx = f.bid;
      tl_lane = f.lane;
      tl_warp = f.warp;
      tl_block = &state;
      blockDim = block;
      gridDim = grid;
      ctx_switch(sched, f.ctx);
      f.tid = threadIdx;
      f.lane = tl_lane;
      f.warp = tl_warp;
      if (f.done) --live;
    }
    if (live > 0 && !tl_progress)
      fail("deadlock: emulated threads wait at a barrier that the others never reach "
           "(an early return before __syncthreads, or a collective in divergent code)");
  }
  tl_sched = outer_sched;
  tl_fiber = outer_fiber;
#else
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (unsigned t = 0; t < n; ++t) {
    // A thread the OS refuses would leave the others waiting at a barrier forever:
    // stop loudly instead.
    try {
      threads.emplace_back(body, t);
    } catch (const std::exception&) {
      fail("could not start an emulated CUDA thread (the OS refused a thread)");
    }
  }
  for (auto& th : threads) th.join();
#endif
}

}  // namespace pagoda_emu

#define PG_DYN_SHARED(T, name) T* name = reinterpret_cast<T*>(::pagoda_emu::dyn_smem())

inline void __syncthreads() { pagoda_emu::tl_block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) pagoda_emu::fail("__syncwarp: only the full mask is emulated");
  pagoda_emu::full_warp().bar.arrive_and_wait();
}

// ---- shuffles and votes ----------------------------------------------------------------
namespace pagoda_emu {
// Every lane publishes `v`, then reads lane `src(lane)`'s value.
template <class T, class F>
T exchange(unsigned mask, T v, F src) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  if (mask != 0xffffffffu) fail("shuffle: only the full mask is emulated");
  Warp& w = full_warp();
  std::memcpy(&w.slot[tl_lane], &v, sizeof(T));
  w.bar.arrive_and_wait();
  T r;
  std::memcpy(&r, &w.slot[src(tl_lane) & 31u], sizeof(T));
  w.bar.arrive_and_wait();
  return r;
}
}  // namespace pagoda_emu

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return pagoda_emu::exchange(mask, v, [&](unsigned lane) {
    return (lane & ~unsigned(width - 1)) + (unsigned(src) & unsigned(width - 1));
  });
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return pagoda_emu::exchange(mask, v, [&](unsigned lane) {
    unsigned s = lane ^ unsigned(lane_mask);
    // A source outside the caller's segment of `width` lanes returns the caller's own value.
    return (s & ~unsigned(width - 1)) == (lane & ~unsigned(width - 1)) ? s : lane;
  });
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return pagoda_emu::exchange(mask, v, [&](unsigned lane) {
    return (lane % unsigned(width)) + delta < unsigned(width) ? lane + delta : lane;
  });
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) pagoda_emu::fail("ballot: only the full mask is emulated");
  pagoda_emu::Warp& w = pagoda_emu::full_warp();
  w.slot[pagoda_emu::tl_lane] = pred ? 1 : 0;
  w.bar.arrive_and_wait();
  unsigned r = 0;
  for (unsigned l = 0; l < 32; ++l) r |= unsigned(w.slot[l]) << l;
  w.bar.arrive_and_wait();
  return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == 0xffffffffu; }

// ---- atomics -----------------------------------------------------------------------------
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> r(*p);
  int old = r.load();
  while (old < v && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
inline int atomicCAS(int* p, int expected, int desired) {
  std::atomic_ref<int>(*p).compare_exchange_strong(expected, desired);
  return expected;
}

// ---- math intrinsics ---------------------------------------------------------------------
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float exp2f_(float x) { return std::exp2(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Round-to-nearest products that nvcc must not contract into an FMA (the host build
// never contracts: -std=c++20 implies -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
template <class T>
T __ldg(const T* p) {
  return *p;
}

// ---- bf16 / f16 ----------------------------------------------------------------------------
// Trivial structs (so `__shared__` arrays of them need no constructor), bits in `x`.
struct __nv_bfloat16 {
  uint16_t x;
};
struct __half {
  uint16_t x;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return {uint16_t(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return std::bit_cast<float>(uint32_t(h.x) << 16); }

inline __half __float2half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};  // NaN
  if (ax >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {
    // Subnormal half: the value in units of 2^-24, rounded half-even (exact scaling).
    const float scaled = std::bit_cast<float>(ax) * 16777216.0f;
    return {uint16_t(sign | uint16_t(std::nearbyint(scaled)))};
  }
  uint32_t h = ((((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7fffffu) >> 13));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return {uint16_t(sign | h)};
}
inline float __half2float(__half h) {
  const uint32_t sign = uint32_t(h.x & 0x8000u) << 16;
  const uint32_t e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;
  if (e == 0) {
    const float v = float(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e - 15u + 127u) << 23) | (m << 13));
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return {x}; }
inline __half __ushort_as_half(unsigned short x) { return {x}; }

// ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ------
namespace pagoda_emu {

// Where element (row, col) of each operand lives, per the PTX ISA's figures for
// m16n8k16 with 16-bit A/B: groupID = lane / 4, threadID_in_group = lane % 4.
// A (16x16, row-major), 8 halves in 4 registers: a0,a1 (g, 2t..2t+1); a2,a3 (g+8, 2t..);
// a4,a5 (g, 2t+8..); a6,a7 (g+8, 2t+8..). Element i is in register i/2, half i%2
// (even i in the low 16 bits).
struct Loc {
  unsigned lane, idx;
};
constexpr Loc a_loc(unsigned row, unsigned col) {
  return {(row % 8) * 4 + (col % 8) / 2, (col & 1) + 2 * (row / 8) + 4 * (col / 8)};
}
// B (16x8, K x N, "col"): b0,b1 (k = 2t..2t+1, n = g); b2,b3 (k = 2t+8.., n = g).
constexpr Loc b_loc(unsigned k, unsigned n) { return {n * 4 + (k % 8) / 2, (k & 1) + 2 * (k / 8)}; }
// C/D (16x8, f32): c0,c1 (g, 2t..2t+1); c2,c3 (g+8, 2t..2t+1).
constexpr Loc c_loc(unsigned row, unsigned col) { return {(row % 8) * 4 + col / 2, (col & 1) + 2 * (row / 8)}; }

inline uint16_t half_of(uint32_t reg, unsigned idx) { return uint16_t(idx & 1 ? reg >> 16 : reg); }

template <class T>
float elem_to_float(uint16_t bits) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float({bits});
  else
    return __half2float({bits});
}

// D = A * B + C for the warp; each lane passes its own fragments and gets its own D.
template <class T>
void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  Warp& w = full_warp();
  const unsigned lane = tl_lane;
  for (int i = 0; i < 4; ++i) w.mma_a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) w.mma_b[lane][i] = b[i];
  for (int i = 0; i < 4; ++i) w.mma_c[lane][i] = c[i];
  w.bar.arrive_and_wait();
  float out[4];
  for (unsigned i = 0; i < 4; ++i) {
    // The (row, col) of this lane's D element i, inverted from c_loc.
    const unsigned row = lane / 4 + 8 * (i / 2), col = (lane % 4) * 2 + (i & 1);
    const Loc cl = c_loc(row, col);
    float acc = w.mma_c[cl.lane][cl.idx];
    for (unsigned k = 0; k < 16; ++k) {
      const Loc al = a_loc(row, k), bl = b_loc(k, col);
      const float av = elem_to_float<T>(half_of(w.mma_a[al.lane][al.idx / 2], al.idx));
      const float bv = elem_to_float<T>(half_of(w.mma_b[bl.lane][bl.idx / 2], bl.idx));
      acc += av * bv;  // a 16-bit x 16-bit product is exact in f32
    }
    out[i] = acc;
  }
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l names row l % 8 of matrix
// l / 8 (16 bytes); register i of lane l receives matrix i's row l / 4, elements
// 2 (l % 4) and 2 (l % 4) + 1 (plain), or column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1
// (.trans). Low 16 bits = the first element.
template <bool Trans>
void ldmatrix_x4(uint32_t r[4], const void* row) {
  Warp& w = full_warp();
  const unsigned lane = tl_lane;
  w.slot[lane] = reinterpret_cast<uint64_t>(row);
  w.bar.arrive_and_wait();
  for (unsigned i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!Trans) {
      const auto* p = reinterpret_cast<const uint16_t*>(w.slot[i * 8 + lane / 4]);
      lo = p[2 * (lane % 4)];
      hi = p[2 * (lane % 4) + 1];
    } else {
      const auto* p0 = reinterpret_cast<const uint16_t*>(w.slot[i * 8 + 2 * (lane % 4)]);
      const auto* p1 = reinterpret_cast<const uint16_t*>(w.slot[i * 8 + 2 * (lane % 4) + 1]);
      lo = p0[lane / 4];
      hi = p1[lane / 4];
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  w.bar.arrive_and_wait();
}

}  // namespace pagoda_emu

inline float __log2f(float x) { return std::log2(x); }
