// A small persistent thread pool for the CPU passes (decoder_layer.cpp includes it): the calling thread
// plus n - 1 workers that poll for work, then sleep. parallel_for(n, task) runs task(0) .. task(n-1) on
// them; set_pool_threads(n) sizes the pool (1: none, everything on the calling thread). No OpenMP: torch's
// wheel ships its own libgomp, and two OpenMP runtimes in one process fight.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

// One step of a polling loop: a pause, and every 256th time the core handed to any other thread that
// wants it (sched_yield), so polling never holds up a thread that shares the core: another process's,
// or on a loaded machine this process's own caller.
inline void poll_pause(int i) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
  if (i % 256 == 255) std::this_thread::yield();
}

// Workers keep polling for the next job this long before they sleep. A decode step's passes come
// within a few milliseconds of each other even with the Python between them (a garbage collection
// included), and a woken worker takes long to be running again (the jobs meanwhile run without it),
// so polling spans those gaps; an idle server's workers still sleep soon after its last step.
constexpr std::chrono::microseconds SPIN_BEFORE_SLEEP{10000};

// The calling thread plus threads() - 1 workers. run(n, fn, ctx) calls fn(ctx, c) once for every
// chunk c < n, on the caller and on the workers that join in while chunks are left; it returns when
// all are done. The caller never waits for a worker that has not joined (one that is asleep or
// descheduled): it takes the chunks itself, so a busy machine costs speed, never a stall.
//
// Thread i owns the i-th of threads() contiguous ranges of chunks and takes them front to back, so
// each streams one stretch of weights (what the hardware prefetchers follow); one that is done takes
// what is left of the others' ranges from their backs.
//
// state_ packs the job's generation (upper 32 bits), CLOSED (set once the caller has run out of
// chunks: no worker joins after it) and the number of workers that joined. A worker joins by a
// compare-and-swap on the whole word, so it never joins a job that is closed or gone.
class Pool {
 public:
  explicit Pool(int threads) : threads_(threads), ranges_(new Range[threads]) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~Pool() {
    stopping_.store(true);
    state_.store(((state_.load() >> 32) + 1) << 32 | CLOSED);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      wakeup_.notify_all();
    }
    for (std::thread& t : workers_) t.join();
  }

  int threads() const { return threads_; }

  void run(int n, void (*fn)(void*, int), void* ctx) {
    fn_ = fn, ctx_ = ctx;
    for (int i = 0; i < threads_; ++i)
      ranges_[i].reset(static_cast<int64_t>(n) * i / threads_, static_cast<int64_t>(n) * (i + 1) / threads_);
    finished_.store(0, std::memory_order_relaxed);
    state_.store(((state_.load(std::memory_order_relaxed) >> 32) + 1) << 32);  // seq_cst: see wait_for_job
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wakeup_.notify_all();
    }
    take_chunks(0);
    const int joined = static_cast<int>(state_.fetch_or(CLOSED, std::memory_order_acq_rel) & JOINED);
    for (int i = 0; finished_.load(std::memory_order_acquire) < joined; ++i) poll_pause(i);
  }

 private:
  static constexpr uint64_t CLOSED = uint64_t{1} << 31, JOINED = CLOSED - 1;

  // Chunks front .. back-1 of one thread's range not yet taken, packed in one word (front in the low
  // half) so that the owner at the front and a helper at the back never take the same chunk.
  struct alignas(64) Range {
    std::atomic<uint64_t> ends{0};

    void reset(int64_t front, int64_t back) {
      ends.store(static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32, std::memory_order_relaxed);
    }
    int take(bool front) {
      uint64_t e = ends.load(std::memory_order_relaxed);
      for (;;) {
        const uint32_t f = static_cast<uint32_t>(e), b = static_cast<uint32_t>(e >> 32);
        if (f >= b) return -1;
        if (ends.compare_exchange_weak(e, front ? e + 1 : e - (uint64_t{1} << 32), std::memory_order_relaxed))
          return static_cast<int>(front ? f : b - 1);
      }
    }
  };

  void take_chunks(int self) {
    for (int k = 0; k < threads_; ++k)
      for (int c; (c = ranges_[(self + k) % threads_].take(k == 0)) >= 0;) fn_(ctx_, c);
  }

  void work(int self) {
    uint64_t seen = 0;  // the generation of the last job looked at (0: none yet)
    for (;;) {
      uint64_t s = wait_for_job(seen);
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = s >> 32;
      while (!(s & CLOSED) && (s >> 32) == seen)
        if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_relaxed)) {
          take_chunks(self);
          finished_.fetch_add(1, std::memory_order_release);
          break;
        }
    }
  }

  // The state once its generation differs from `seen`: polled for SPIN_BEFORE_SLEEP, then asleep. The
  // sleeper count and the state are both seq_cst, written then read in opposite orders here and in
  // run(), so either the worker sees the new job or run() sees the sleeper and wakes it.
  uint64_t wait_for_job(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + SPIN_BEFORE_SLEEP;
    for (int i = 1;; ++i) {
      const uint64_t s = state_.load(std::memory_order_acquire);
      if ((s >> 32) != seen) return s;
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      poll_pause(i);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1);
    uint64_t s;
    wakeup_.wait(lock, [&] { return ((s = state_.load()) >> 32) != seen; });
    sleepers_.fetch_sub(1);
    return s;
  }

  const int threads_;
  std::unique_ptr<Range[]> ranges_;  // one per thread, the caller's first
  std::vector<std::thread> workers_;
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int> finished_{0};  // joined workers done with the job
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
  void (*fn_)(void*, int) = nullptr;  // the job: written before its generation is published
  void* ctx_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wakeup_;
};

// The pool (null: one thread) and the flag held by whoever runs a job on it or replaces it: a
// second host thread calling in meanwhile runs its chunks alone, in order, and a chunk never starts
// a job of its own (nested calls run alone too). Never freed at exit: its workers end with the process.
Pool* pool = nullptr;
std::atomic<int> pool_threads{1};
std::atomic_flag pool_busy = ATOMIC_FLAG_INIT;
std::atomic<int64_t> pool_jobs{0};  // jobs handed to the pool (dfl_pool_jobs)

// A forked child has the parent's pool object but none of its threads: it runs on one thread.
void forget_pool_in_child() {
  pool = nullptr;
  pool_threads.store(1);
  pool_busy.clear();
}

// task(c) for every c < n: on the pool when it is free, else in order on this thread. Each c must
// write its own outputs and compute them the same way whichever thread runs it.
template <typename Task>
void parallel_for(int n, Task&& task) {
  if (!pool_busy.test_and_set(std::memory_order_acquire)) {
    if (pool != nullptr) {
      pool_jobs.fetch_add(1, std::memory_order_relaxed);
      pool->run(n, [](void* t, int c) { (*static_cast<std::remove_reference_t<Task>*>(t))(c); }, &task);
      pool_busy.clear(std::memory_order_release);
      return;
    }
    pool_busy.clear(std::memory_order_release);
  }
  for (int c = 0; c < n; ++c) task(c);
}

// Replaces the pool with one of n threads (n < 1 counts as 1; 1: no pool), once no job is running.
void set_pool_threads(int n) {
  n = n < 1 ? 1 : n;
  while (pool_busy.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  if ((pool ? pool->threads() : 1) != n) {
    delete pool;
    pool = n > 1 ? new Pool(n) : nullptr;
    pool_threads.store(n);
    static const bool fork_handler = pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0;
    (void)fork_handler;
  }
  pool_busy.clear(std::memory_order_release);
}

}  // namespace
