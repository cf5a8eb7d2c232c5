// A mutex whose uncontended lock and unlock are one atomic instruction each
// (std::mutex goes through pthread_mutex_lock/unlock, about 60 instructions a
// pair). Contended, it spins briefly, then sleeps on the futex behind
// std::atomic::wait: the three-state mutex of Drepper's "Futexes Are Tricky"
// (0 free, 1 locked, 2 locked with possible sleepers). Not recursive, not
// fair; BasicLockable, so std::lock_guard works with it.
#ifndef MEMSCOPE_ALLOCATOR_FAST_MUTEX_H_
#define MEMSCOPE_ALLOCATOR_FAST_MUTEX_H_

#include <atomic>

namespace memscope {

class FastMutex {
 public:
  FastMutex() = default;
  FastMutex(const FastMutex&) = delete;
  FastMutex& operator=(const FastMutex&) = delete;

  void lock() {
    int expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
    LockSlow();
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  void LockSlow() {
    for (int spin = 0; spin < 64; ++spin) {
      int expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire, std::memory_order_relaxed)) {
        return;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    // Mark the lock as wanted by a sleeper, and sleep until it is free.
    while (state_.exchange(2, std::memory_order_acquire) != 0) state_.wait(2, std::memory_order_relaxed);
  }

  std::atomic<int> state_{0};
};

}  // namespace memscope

#endif  // MEMSCOPE_ALLOCATOR_FAST_MUTEX_H_
