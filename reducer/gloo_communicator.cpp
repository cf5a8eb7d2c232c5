// GlooCommunicator: the Communicator over Gloo's TCP transport (libgloo-dev).
//
// Rendezvous. Each rank creates `options.store_dir`, takes an exclusive
// flock() on its progress file `<store_dir>/progress-rank-R`, sets the
// FileStore key `memscope-joined-R` and polls until every rank's key exists
// or `options.timeout` passes; the ranks whose key is missing are named
// ("rank 0: rendezvous timed out after 60 s: ranks 2, 3 never joined (store
// DIR)"). Then gloo::rendezvous::Context::connectFullMesh connects a full mesh
// over a tcp device bound to `options.hostname`. As with PyTorch's FileStore,
// the directory must be fresh for every job and visible to every rank.
//
// Timeouts. `options.timeout` is gloo's context timeout (pair connects, store
// waits) and the end-to-end timeout of every collective.
//
// Checked collectives, in batches. Each collective #N has a fixed-size
// descriptor {N, kind, dtype, count, root, meta}. A rank keeps the
// descriptors of the collectives it called since its last check, and checks
// them at a barrier, at a collective that moves data (before the data moves),
// at one whose arguments are to be rejected, and at the 256th unchecked one:
// rules that depend on the descriptors alone, so ranks that called the same
// collectives check at the same ones. A check exchanges a summary (how many,
// two 64-bit hashes, the last N), by the check's own number so that ranks
// that check at different collectives still meet: through the ranks' progress
// files, which every rank maps (CheckRegion: no message, a futex wake-up),
// or, when the ranks run on more than one kernel (machine) or a file could
// not be mapped, by a gloo allgather tagged with that number (all ranks
// agree on which). Equal summaries end
// it (different batches with equal hashes, odds of about 2^-128, would
// pass); otherwise the lists are allgathered and every rank throws the same line
// after its "rank R: " for the first collective that differs ("collective
// mismatch at collective #7: rank 0 called barrier, rank 1 called
// allreduce(float32, 1234 elements)"). Then the payload moves: when the
// check went through the shared regions and the payload is at most 64 KiB a
// rank, a broadcast, an allgather or an integer allreduce goes through the
// ranks' mailboxes (each rank's progress file, mapped by every rank: the
// payload copied in, a futex wake-up; no message, so no event-loop thread
// spinning on data that arrived before its receive was posted: a meta run
// moves nothing else, and gives that thread a lower priority, loop_nice);
// otherwise
// over gloo (tag 2N+1): gloo::broadcast, gloo::allgather, and for allreduce a
// ring (reduce-scatter, allgather) over gloo's unbound buffers. Barrier is a check alone; null data
// (meta) never moves anything, so a meta run exchanges one small summary per
// 256 collectives instead of a descriptor per collective.
//
// Error naming. On entering collective #N a rank records "N entered <kind>
// <checks>" in its progress file, through a shared mapping (no system call),
// and holds that file's lock while its communicator lives: a peer that can
// take the lock knows the rank is gone (exited, killed or communicator
// destroyed). Each check starts by testing the peers' locks (one flock()
// each), and while gloo runs a watchdog thread tests them every 50 ms and, if
// a peer is gone, aborts the waits on the call's buffers. So a dead rank is
// named at the next check, not at the next collective. Gloo alone would
// sometimes wait for the whole timeout: an operation half sent
// or received when its pair breaks is not failed, and a send can match a
// receive the dead rank posted before dying (this is also why allreduce is
// our own ring: gloo::allreduce waits on an internal buffer). When a call
// fails the rank reads every peer's progress file and names, in this order,
// the peers that are gone ("rank 1 closed its connection (exited or was
// killed) during allreduce #12"), the live peers that never entered our
// check, or the payload of #N ("allreduce #12 timed out after 2 s: rank 1 did
// not arrive (its last collective: barrier #11)"), peers that destroyed their
// communicator, and peers that failed first (quoting the message they
// recorded). The failing rank records "failed" and its message; after a
// transport error it closes its connections, so peers blocked on it fail now
// rather than at their timeout. After a CommError the communicator is
// unusable: every call throws at once. Collectives called after the last
// check are not checked when the communicator is destroyed (a barrier first
// checks them). A fork() while a communicator is alive shares its lock with
// the child.
//
// SIGPIPE. Gloo writes with writev() and does not ignore SIGPIPE. As a
// precaution (the tests, which kill ranks mid-transfer, have not provoked it)
// SIGPIPE is blocked while a gloo call runs on the calling thread, one raised
// there is consumed, and gloo's event-loop thread inherits the blocked mask
// from the thread that creates the device. The process-wide disposition is
// left alone.
//
// A communicator is used by one thread at a time.
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "reducer/communicator.h"

namespace memscope::reducer {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Formatting

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// Gloo's messages start with "[/path/file.cc:123] "; the location is noise in
// a one-line report.
std::string GlooMessage(const std::string& what) {
  std::string s = OneLine(what);
  if (!s.empty() && s.front() == '[') {
    const std::size_t close = s.find("] ");
    if (close != std::string::npos && s.find(':') < close) s = s.substr(close + 2);
  }
  return s;
}

std::string FormatSeconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

// "rank 3", "ranks 1, 2", "ranks 0-7, 9".
std::string FormatRanks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j >= i + 2) {
      out += "-" + std::to_string(ranks[j]);
      i = j + 1;
    } else {
      ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Descriptors

enum class Kind : std::uint8_t { kAllreduce = 1, kBroadcast = 2, kAllgather = 3, kBarrier = 4 };

std::string_view KindName(std::uint64_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kAllreduce: return "allreduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllgather: return "allgather";
    case Kind::kBarrier: return "barrier";
  }
  return "unknown collective";
}

constexpr std::uint64_t kMaxDType = static_cast<std::uint64_t>(DType::kUInt8);

struct Descriptor {
  static constexpr std::size_t kWords = 6;
  std::uint64_t seq = 0;
  std::uint64_t kind = 0;
  std::uint64_t dtype = 0;
  std::uint64_t count = 0;
  std::int64_t root = -1;
  std::uint64_t meta = 0;

  std::array<std::uint64_t, kWords> Encode() const {
    return {seq, kind, dtype, count, static_cast<std::uint64_t>(root), meta};
  }
  static Descriptor Decode(const std::uint64_t* w) {
    return {w[0], w[1], w[2], w[3], static_cast<std::int64_t>(w[4]), w[5]};
  }
  bool SameCall(const Descriptor& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count && root == o.root && meta == o.meta;
  }
  bool operator==(const Descriptor& o) const { return seq == o.seq && SameCall(o); }

  // "barrier", "allreduce(float32, 1234 elements)", "broadcast(int64, 1 element, root 1, meta)".
  std::string Call() const {
    std::string out(KindName(kind));
    if (static_cast<Kind>(kind) == Kind::kBarrier) return out;
    out += "(";
    out += dtype <= kMaxDType ? std::string(DTypeName(static_cast<DType>(dtype))) : "dtype " + std::to_string(dtype);
    out += ", " + std::to_string(count) + (count == 1 ? " element" : " elements");
    if (static_cast<Kind>(kind) == Kind::kBroadcast) out += ", root " + std::to_string(root);
    if (meta != 0) out += ", meta";
    return out + ")";
  }
};

// One line naming what each group of ranks called at collective #seq (all[r]
// is rank r's), the same on every rank. A descriptor of kind 0 stands for a
// rank whose check came earlier: it called nothing more before checking.
std::string MismatchMessage(const std::vector<Descriptor>& all, std::uint64_t seq) {
  std::vector<std::pair<Descriptor, std::vector<int>>> groups;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[r]; });
    if (it == groups.end()) {
      groups.push_back({all[r], {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  std::string out = "collective mismatch at collective #" + std::to_string(seq) + ": ";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) out += ", ";
    if (groups[g].first.kind == 0) {
      out += FormatRanks(groups[g].second) + " checked its collectives before calling it";
      continue;
    }
    out += FormatRanks(groups[g].second) + " called " + groups[g].first.Call();
    if (groups[g].first.seq != seq) out += " as its collective #" + std::to_string(groups[g].first.seq);
  }
  return out;
}

// The collectives a rank called since its last check, with two running
// hashes of their descriptors. A check compares the summaries (count, hashes,
// last sequence number) of every rank; only when they differ are the lists
// themselves exchanged, to name the first collective that differs.
class UncheckedCollectives {
 public:
  static constexpr std::size_t kSummaryWords = 4;

  void Add(const Descriptor& d) {
    for (const std::uint64_t w : d.Encode()) {
      h1_ = Mix(h1_ ^ w);
      h2_ = Mix(std::rotl(h2_, 23) + w * 0xd6e8feb86659fd93ULL);
    }
    list_.push_back(d);
  }
  std::size_t size() const { return list_.size(); }
  const std::vector<Descriptor>& list() const { return list_; }
  std::array<std::uint64_t, kSummaryWords> Summary() const {
    return {list_.size(), h1_, h2_, list_.empty() ? 0 : list_.back().seq};
  }
  void Clear() {
    list_.clear();
    h1_ = kSeed1;
    h2_ = kSeed2;
  }

 private:
  // splitmix64's finalizer: a bijection that mixes every bit.
  static std::uint64_t Mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  static constexpr std::uint64_t kSeed1 = 0x6d656d73636f7065ULL;  // "memscope"
  static constexpr std::uint64_t kSeed2 = 0x9e3779b97f4a7c15ULL;
  std::vector<Descriptor> list_;
  std::uint64_t h1_ = kSeed1;
  std::uint64_t h2_ = kSeed2;
};

// ---------------------------------------------------------------------------
// Progress files: "<seq> <state> <kind> <checks>" padded to kRecordBytes, then
// the failure message (NUL-terminated) if the state is "failed". The file has
// a fixed size, its blocks reserved at open, and its owner writes it through
// a shared mapping: updating it on every collective costs no system call, and
// peers read it with pread() (the page cache is the same).

constexpr std::size_t kRecordBytes = 64;
constexpr std::size_t kMaxMessageBytes = 4096;
// After the message: the check region (CheckRegion), read by the peers
// through their own shared mapping of the file.
constexpr std::size_t kCheckOffset = kRecordBytes + kMaxMessageBytes;
constexpr std::size_t kCheckBytes = 128;
// After the check region, on a page of its own: the mailbox (kMailBytes), in
// which the rank leaves its payload of a small collective that copies (or
// sums integers) for its peers to read through their mapping (see Mailed).
constexpr std::size_t kMailOffset = 8192;
constexpr std::size_t kMailBytes = 64 * 1024;
constexpr std::size_t kFileBytes = kMailOffset + kMailBytes;
static_assert(kCheckOffset + kCheckBytes <= kMailOffset);

// A rank's summaries of its checks, exchanged through memory shared by the
// ranks' processes (their progress files, each mapped by every rank) rather
// than through gloo: a meta run's checks are most of its communication, and
// gloo's exchange of 32 bytes (a ring of world_size - 1 steps, each a few
// messages, each a wake-up of the event loop and of the waiting thread) cost
// a 4-rank gpt2-xl run about a tenth of its CPU time. Check k's summary goes
// to slot k % 2, then `published` becomes k and waiters are woken (a futex
// on the shared page). A peer can be at most one check ahead (it cannot end
// check k + 1 before this rank publishes k + 1), so two slots suffice.
struct CheckRegion {
  static constexpr std::size_t kWords = 5;  // the check's number, then its summary (UncheckedCollectives)
  std::uint32_t published;  // the last check whose summary is in its slot (futex word)
  std::uint32_t failed;     // 1 once the rank failed (its waiters stop waiting)
  std::uint32_t capable;    // 1: the file is mapped; 0 everywhere means: exchange through gloo
  std::uint32_t reserved;
  // The kernel the rank runs on (a hash of its boot_id): shared memory and
  // futexes work between ranks of one kernel only, so ranks on several
  // machines (a shared filesystem, multi-node) exchange through gloo.
  std::uint64_t kernel;
  std::uint64_t slots[2][kWords];
  // The mailbox: the number (low 32 bits) of the collective whose payload it
  // holds (futex word), and the payload's size.
  std::uint32_t mailed;
  std::uint32_t mail_reserved;
  std::uint64_t mail_bytes;
};
static_assert(sizeof(CheckRegion) <= kCheckBytes);

std::atomic_ref<std::uint32_t> Word(const std::uint32_t& w) { return std::atomic_ref(const_cast<std::uint32_t&>(w)); }

// This kernel's identity (FNV-1a of /proc/sys/kernel/random/boot_id), 0 if
// it cannot be read.
std::uint64_t KernelId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id) || id.empty()) return 0;
  std::uint64_t h = 14695981039346656037ULL;
  for (const char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h == 0 ? 1 : h;
}

void FutexWake(const std::uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Waits (at most `timeout`) while *word == expected.
void FutexWait(const std::uint32_t* word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

std::string ProgressPath(const std::string& dir, int rank) { return dir + "/progress-rank-" + std::to_string(rank); }
// Left by a process that found its rank already taken (two processes started
// with the same RANK), so that the rank which has it can say why the others
// never joined.
std::string DuplicatePath(const std::string& dir, int rank) { return dir + "/duplicate-rank-" + std::to_string(rank); }

struct PeerStatus {
  int rank = 0;
  bool exists = false;  // the progress file exists (the rank started)
  bool alive = false;   // its owner still holds the lock
  std::uint64_t seq = 0;
  std::string state;         // joining, ready, entered, failed, closed
  std::string kind;          // the kind of collective #seq
  std::uint64_t checks = 0;  // descriptor checks it has entered
  std::string failure;

  std::string LastCollective() const {
    if (seq == 0) return "none since rendezvous";
    return kind + " #" + std::to_string(seq);
  }
};

// True when nobody holds the lock on `fd`'s file: its communicator is gone.
bool Unlocked(int fd) {
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) return false;  // EWOULDBLOCK: its owner lives
  ::flock(fd, LOCK_UN);
  return true;
}

PeerStatus ReadPeer(int fd, int rank) {
  PeerStatus s;
  s.rank = rank;
  if (fd < 0) return s;
  s.exists = true;
  s.alive = !Unlocked(fd);
  std::string buf(kCheckOffset, '\0');  // the record and the message
  const ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
  if (n <= 0) return s;
  buf.resize(static_cast<std::size_t>(n));
  std::string record = buf.substr(0, std::min(buf.size(), kRecordBytes));
  record.resize(std::min(record.size(), record.find('\0')));
  std::istringstream in(record);
  in >> s.seq >> s.state >> s.kind >> s.checks;
  if (s.state == "failed" && buf.size() > kRecordBytes) {
    std::string message = buf.substr(kRecordBytes);
    message.resize(std::min(message.size(), message.find('\0')));
    s.failure = OneLine(message);
  }
  return s;
}

int OpenPeer(const std::string& dir, int rank) { return ::open(ProgressPath(dir, rank).c_str(), O_RDONLY | O_CLOEXEC); }

class ProgressFile {
 public:
  ProgressFile() = default;
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;
  ~ProgressFile() {
    if (map_ != nullptr) ::munmap(map_, kFileBytes);
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

  // Empty on success, else why not.
  std::string Open(const std::string& dir, int rank, bool offer_check_region) {
    const std::string path = ProgressPath(dir, rank);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return "cannot create " + path + ": " + std::strerror(errno);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) {
        return path + " is locked by a live communicator: another process or thread already is rank " +
               std::to_string(rank);
      }
      return "cannot lock " + path + ": " + std::strerror(err);
    }
    // Blocks reserved first: a store on a full disk must not turn a write
    // into the mapping into SIGBUS. Without them, writes go through pwrite().
    if (::ftruncate(fd_, 0) == 0 && ::posix_fallocate(fd_, 0, static_cast<off_t>(kFileBytes)) == 0) {
      void* map = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (map != MAP_FAILED) {
        map_ = static_cast<char*>(map);
        const std::uint64_t kernel = KernelId();
        if (offer_check_region && kernel != 0) {
          check_region()->kernel = kernel;
          Word(check_region()->capable).store(1, std::memory_order_release);
        }
      }
    }
    return "";
  }

  // Null when the file could not be mapped.
  CheckRegion* check_region() const {
    return map_ == nullptr ? nullptr : reinterpret_cast<CheckRegion*>(map_ + kCheckOffset);
  }

  // Check k's summary (CheckRegion::kWords - 1 words), then k published.
  void Publish(std::uint32_t k, const std::uint64_t* summary) {
    CheckRegion* c = check_region();
    c->slots[k % 2][0] = k;
    std::memcpy(&c->slots[k % 2][1], summary, (CheckRegion::kWords - 1) * sizeof(std::uint64_t));
    Word(c->published).store(k, std::memory_order_release);
    FutexWake(&c->published);
  }

  // Collective #seq's payload (at most kMailBytes) into the mailbox, then
  // its number published and the waiters woken.
  void Mail(std::uint64_t seq, const void* data, std::size_t bytes) {
    CheckRegion* c = check_region();
    if (bytes > 0) std::memcpy(mailbox(), data, bytes);
    c->mail_bytes = bytes;
    Word(c->mailed).store(static_cast<std::uint32_t>(seq), std::memory_order_release);
    FutexWake(&c->mailed);
  }
  const char* mailbox() const { return map_ + kMailOffset; }
  char* mailbox() { return map_ + kMailOffset; }

  // Peers waiting on this rank's summary or mail stop waiting.
  void MarkFailed() {
    CheckRegion* c = check_region();
    if (c == nullptr) return;
    Word(c->failed).store(1, std::memory_order_release);
    FutexWake(&c->published);
    FutexWake(&c->mailed);
  }

  // Best effort: progress only improves error messages.
  void Write(std::uint64_t seq, std::string_view state, std::string_view kind, std::uint64_t checks,
             std::string_view failure = {}) {
    if (fd_ < 0) return;
    std::array<char, kCheckOffset> rec;
    char* p = rec.data();
    char* const end = p + kRecordBytes - 1;
    const auto put = [&](std::string_view text) {
      const std::size_t n = std::min(text.size(), static_cast<std::size_t>(end - p));
      std::memcpy(p, text.data(), n);
      p += n;
    };
    const auto number = [&](std::uint64_t v) { p = std::to_chars(p, end, v).ptr; };
    number(seq);
    put(" ");
    put(state);
    put(" ");
    put(kind.empty() ? "-" : kind);
    put(" ");
    number(checks);
    std::memset(p, ' ', static_cast<std::size_t>(end - p));
    rec[kRecordBytes - 1] = '\n';
    const std::size_t message = std::min(failure.size(), kMaxMessageBytes - 1);
    if (message > 0) std::memcpy(rec.data() + kRecordBytes, failure.data(), message);  // data() may be null
    rec[kRecordBytes + message] = '\0';
    const std::size_t bytes = kRecordBytes + (failure.empty() ? 0 : message + 1);
    if (map_ != nullptr) {
      std::memcpy(map_, rec.data(), bytes);
    } else {
      [[maybe_unused]] const ssize_t n = ::pwrite(fd_, rec.data(), bytes, 0);
    }
  }

 private:
  int fd_ = -1;
  char* map_ = nullptr;  // the file, shared; null when it could not be mapped
};

// ---------------------------------------------------------------------------
// Gloo's event-loop thread, optionally at a lower priority (nice +`nice`,
// GlooOptions::loop_nice). While a pair connects, and whenever data arrives
// before its receive is posted, the loop polls epoll without sleeping until
// the other side moves; with more ranks than cores that poll took the CPU
// from the very peers it waited for (thousands of epoll_wait calls a run).
// The thread inherits the nice value of the thread that creates the device:
// a helper thread raises its own and creates it (the caller's stays;
// lowering it back would need privileges).
std::shared_ptr<gloo::transport::Device> CreateNicedDevice(const gloo::transport::tcp::attr& attr, int nice_by) {
  if (nice_by <= 0) return gloo::transport::tcp::CreateDevice(attr);
  std::shared_ptr<gloo::transport::Device> device;
  std::exception_ptr error;
  std::thread helper([&] {
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(nice + nice_by, 19));  // best effort
    try {
      device = gloo::transport::tcp::CreateDevice(attr);
    } catch (...) {
      error = std::current_exception();
    }
  });
  helper.join();
  if (error) std::rethrow_exception(error);
  return device;
}

// ---------------------------------------------------------------------------
// SIGPIPE: blocked on this thread for the guard's lifetime; one raised
// meanwhile is consumed unless it was already pending.

class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

// ---------------------------------------------------------------------------
// bfloat16 <-> float32 (round to nearest even; NaN stays NaN).

float Bf16ToFloat(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t FloatToBf16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7fffffffU) > 0x7f800000U) return static_cast<std::uint16_t>((bits >> 16) | 0x40U);
  const std::uint32_t rounding = 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// Collectives that need no data moved are checked in batches of at most this
// many (fewer at a barrier or a collective that moves data).
constexpr std::size_t kMaxUnchecked = 256;

// Slots of the ring allreduce (gloo's own prefixes are 0x01-0x08).
constexpr std::uint8_t kRingAllreduceSlotPrefix = 0x4d;

// A FileStore whose keys can be tested without waiting.
// A key of the store that could not be written (a full disk): "cannot
// write the rendezvous store 'DIR/KEYFILE': No space left on device".
class StoreWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// gloo's FileStore, whose set() checks its writes: gloo's own ignores a
// failed write and leaves an empty key, which a peer then reads as a gloo
// assertion ("n > 0. 0 vs 0") instead of the disk's error.
class PollableFileStore : public gloo::rendezvous::FileStore {
 public:
  using gloo::rendezvous::FileStore::FileStore;
  bool Has(const std::string& key) { return check({key}); }

  // As gloo's: refused when the key exists, else written under a temporary
  // name and renamed; every write checked (StoreWriteError).
  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string tmp = tmpPath(key), path = objectPath(key);
    keyFilePaths_.push_back(path);
    GLOO_ENFORCE(::access(path.c_str(), F_OK) != 0, "File already exists: ", path);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw StoreWriteError(Failed(tmp));
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = Failed(tmp);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw StoreWriteError(why);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string why = Failed(path);
      ::unlink(tmp.c_str());
      throw StoreWriteError(why);
    }
  }

 private:
  static std::string Failed(const std::string& path) {
    return "cannot write the rendezvous store '" + path + "': " + std::strerror(errno != 0 ? errno : EIO);
  }
};

std::string JoinedKey(int rank) { return "memscope-joined-" + std::to_string(rank); }

bool IsTimeout(const std::string& msg) {
  return msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos ||
         msg.find("imeout") != std::string::npos;
}

// ---------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const GlooOptions& options)
      : rank_(options.rank),
        world_size_(options.world_size),
        store_dir_(options.store_dir),
        timeout_(options.timeout) {}

  ~GlooCommunicator() override {
    progress_.Write(seq_, "closed", LastKind(), checks_);
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(wd_mu_);
        wd_stop_ = true;
      }
      wd_cv_.notify_all();
      watchdog_.join();
    }
    {
      SigpipeGuard guard;
      context_.reset();  // closes the connections
      device_.reset();   // joins gloo's event loop
    }
    for (const CheckRegion* region : peer_regions_) {
      if (region != nullptr) {
        ::munmap(const_cast<char*>(reinterpret_cast<const char*>(region)) - kCheckOffset, kFileBytes);
      }
    }
    for (int fd : peer_fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "gloo"; }

  void Rendezvous(const GlooOptions& options);
  // Why the wait for `missing` to join is over (without "rank R: "): the
  // process was asked to stop (`interrupt`), or `deadline` passed (naming a
  // rank started twice); "" to wait on.
  std::string JoinWaitOver(const std::vector<int>& missing, Clock::time_point deadline,
                           const std::atomic<int>* interrupt) const;

  void AllreduceSum(void* data, std::size_t count, DType dtype) override {
    // Integers only through the mailboxes: their sum does not depend on the
    // order of the additions (floats keep the ring's order, and its results).
    const auto mail = [&](std::uint64_t seq) {
      switch (dtype) {
        case DType::kInt32: MailSum<std::uint32_t>(seq, data, count); return true;
        case DType::kInt64: MailSum<std::uint64_t>(seq, data, count); return true;
        default: return false;
      }
    };
    Checked(Kind::kAllreduce, dtype, count, -1, data == nullptr, mail, [&](std::uint32_t tag) {
      switch (dtype) {
        case DType::kFloat32: RingAllreduce(static_cast<float*>(data), count, tag); break;
        case DType::kFloat16: RingAllreduce(static_cast<gloo::float16*>(data), count, tag); break;
        case DType::kInt32: RingAllreduce(static_cast<std::int32_t*>(data), count, tag); break;
        case DType::kInt64: RingAllreduce(static_cast<std::int64_t*>(data), count, tag); break;
        case DType::kBFloat16: {
          // Gloo has no bfloat16: sum in float32, round once at the end.
          auto* bf = static_cast<std::uint16_t*>(data);
          std::vector<float> tmp(count);
          for (std::size_t i = 0; i < count; ++i) tmp[i] = Bf16ToFloat(bf[i]);
          RingAllreduce(tmp.data(), count, tag);
          for (std::size_t i = 0; i < count; ++i) bf[i] = FloatToBf16(tmp[i]);
          break;
        }
        default: break;  // rejected by Checked
      }
    });
  }

  void Broadcast(void* data, std::size_t count, DType dtype, int root) override {
    const auto mail = [&](std::uint64_t seq) {
      const std::size_t bytes = count * ElementSize(dtype);
      if (root == rank_) {
        progress_.Mail(seq, data, bytes);
      } else {
        std::memcpy(data, AwaitMail(root, seq, bytes), bytes);
      }
      return true;
    };
    Checked(Kind::kBroadcast, dtype, count, root, data == nullptr, mail, [&](std::uint32_t tag) {
      gloo::BroadcastOptions opts(context_);
      Watched watched(*this);  // after opts: unregisters before opts frees the buffer
      opts.setOutput<std::uint8_t>(watched.Buffer(data, count * ElementSize(dtype)));
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void Allgather(const void* in, void* out, std::size_t count, DType dtype) override {
    const bool meta = in == nullptr || out == nullptr;
    const auto mail = [&](std::uint64_t seq) {
      const std::size_t bytes = count * ElementSize(dtype);
      auto* o = static_cast<std::uint8_t*>(out);
      progress_.Mail(seq, in, bytes);  // first: `in` may overlap another rank's chunk of `out`
      std::memmove(o + static_cast<std::size_t>(rank_) * bytes, progress_.mailbox(), bytes);
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_) std::memcpy(o + static_cast<std::size_t>(r) * bytes, AwaitMail(r, seq, bytes), bytes);
      }
      return true;
    };
    Checked(Kind::kAllgather, dtype, count, -1, meta, mail, [&](std::uint32_t tag) {
      const std::size_t bytes = count * ElementSize(dtype);
      const std::size_t total = bytes * static_cast<std::size_t>(world_size_);
      auto* o = static_cast<std::uint8_t*>(out);
      const auto* i = static_cast<const std::uint8_t*>(in);
      if (world_size_ == 1) {
        std::memmove(o, i, bytes);
        return;
      }
      std::vector<std::uint8_t> copy;
      gloo::AllgatherOptions opts(context_);
      Watched watched(*this);
      if (i != o + static_cast<std::size_t>(rank_) * bytes) {  // else in place: gloo reads our chunk of out
        if (std::less_equal<>()(o, i) && std::less<>()(i, o + total)) {
          copy.assign(i, i + bytes);  // `in` overlaps another rank's chunk of `out`
          i = copy.data();
        }
        opts.setInput(const_cast<std::uint8_t*>(i), bytes);
      }
      opts.setOutput<std::uint8_t>(watched.Buffer(o, total));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void Barrier() override {
    Checked(Kind::kBarrier, DType::kFloat32, 0, -1, true, [](std::uint64_t) { return false; }, [](std::uint32_t) {});
  }

  void CheckNow() override {
    if (!broken_.empty()) ThrowBroken();
    if (unchecked_.size() == 0) return;  // the last collective was checked
    ++checks_;
    progress_.Write(seq_, "entered", LastKind(), checks_);
    CheckDescriptors();
  }

 private:
  [[noreturn]] void ThrowBroken() const {
    throw CommError("rank " + std::to_string(rank_) + ": communicator unusable after an earlier error: " + broken_);
  }

  // Records the failure, closes our connections when asked (peers blocked on
  // us fail now instead of at their timeout), and throws.
  [[noreturn]] void Fail(std::string message, bool close_connections) {
    message = OneLine(std::move(message));
    broken_ = message;
    progress_.Write(seq_, "failed", LastKind(), checks_, message);
    progress_.MarkFailed();
    if (close_connections) {
      SigpipeGuard guard;
      context_.reset();
    }
    throw CommError(message);
  }

  // Why the call is rejected (empty if it is not). Every rank that passed the
  // same arguments rejects them alike, after the check.
  std::string Invalid(Kind kind, DType dtype, int root) const {
    if (kind == Kind::kAllreduce && dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16 &&
        dtype != DType::kInt32 && dtype != DType::kInt64) {
      return "cannot sum " + std::string(DTypeName(dtype)) + " (float32, float16, bfloat16, int32, int64)";
    }
    if (kind == Kind::kBroadcast && (root < 0 || root >= world_size_)) {
      return "root " + std::to_string(root) + " is not a rank of world size " + std::to_string(world_size_);
    }
    return "";
  }

  // Collective #seq: its descriptor joins the unchecked ones; they are checked
  // across ranks now if this call moves data, is a barrier, is to be rejected,
  // or is the kMaxUnchecked-th unchecked one. Each of these is a function of
  // the descriptors alone, so ranks that called the same collectives check at
  // the same ones.
  // A payload that moves goes through the mailboxes (`mail`, which returns
  // false for a collective it does not take) when the ranks share the check
  // regions and it fits (every rank decides alike: the check has just shown
  // that they called the same collective), else through gloo (`payload`).
  template <typename Mail, typename Payload>
  void Checked(Kind kind, DType dtype, std::size_t count, int root, bool meta, Mail&& mail, Payload&& payload) {
    if (!broken_.empty()) ThrowBroken();
    const std::uint64_t seq = ++seq_;
    kind_ = kind;

    Descriptor mine;
    mine.seq = seq;
    mine.kind = static_cast<std::uint64_t>(kind);
    if (kind != Kind::kBarrier) {
      mine.dtype = static_cast<std::uint64_t>(dtype);
      mine.count = count;
      mine.root = kind == Kind::kBroadcast ? root : -1;
      mine.meta = meta ? 1 : 0;
    }
    const std::string invalid = Invalid(kind, dtype, root);
    const bool moves = !meta && count != 0 && (world_size_ > 1 || kind == Kind::kAllgather);
    bool check = false;
    if (world_size_ > 1) {
      unchecked_.Add(mine);
      check = kind == Kind::kBarrier || moves || !invalid.empty() || unchecked_.size() >= kMaxUnchecked;
      if (check) ++checks_;
    }
    progress_.Write(seq, "entered", LastKind(), checks_);
    if (check) CheckDescriptors();
    if (!invalid.empty()) Fail("rank " + std::to_string(rank_) + ": " + What() + ": " + invalid, false);
    if (!moves) return;
    if (shared_checks_ && count * ElementSize(dtype) <= kMailBytes && mail(seq)) return;
    GlooCall([&] { payload(static_cast<std::uint32_t>(2 * seq + 1)); });
  }

  // Waits until `ready` holds for `word` (a futex word in rank r's check
  // region), in futex slices of 50 ms: a peer that is gone or failed ends it
  // at once ("aborted: a peer is gone"), and `deadline` with "Timed out
  // waiting ...ms for <what>" (both through Fail, which names the ranks).
  template <typename Ready>
  void AwaitPeerWord(int r, const std::uint32_t& word, Ready ready, Clock::time_point deadline, const char* what) {
    const CheckRegion* theirs = peer_regions_[static_cast<std::size_t>(r)];
    for (;;) {
      const std::uint32_t v = Word(word).load(std::memory_order_acquire);
      if (ready(v)) return;
      if (Word(theirs->failed).load(std::memory_order_acquire) != 0 || Unlocked(peer_fds_[r])) {
        Fail(DescribeFailure(What(), "aborted: a peer is gone"), true);
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        Fail(DescribeFailure(What(), "Timed out waiting " + std::to_string(timeout_.count()) + "ms for " + what),
             true);
      }
      FutexWait(&word, v, std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(50)));
    }
  }

  // Collective #seq's payload from rank r's mailbox (`bytes` of it), once r
  // has left it there. The wait is the check's (futex slices of 50 ms, a
  // peer that is gone or failed ends it, the timeout names who is missing).
  // Rank r cannot overwrite its mailbox before this rank has read it: its
  // next payload comes after the next check, which this rank enters only
  // after this collective.
  const char* AwaitMail(int r, std::uint64_t seq, std::size_t bytes) {
    const CheckRegion* theirs = peer_regions_[static_cast<std::size_t>(r)];
    const auto want = static_cast<std::uint32_t>(seq);
    AwaitPeerWord(r, theirs->mailed, [want](std::uint32_t v) { return v == want; }, Clock::now() + timeout_,
                  "the payload");
    if (theirs->mail_bytes != bytes) {
      Fail(DescribeFailure(What(), "rank " + std::to_string(r) + "'s payload is out of step"), true);
    }
    return reinterpret_cast<const char*>(theirs) - kCheckOffset + kMailOffset;
  }

  // An integer allreduce through the mailboxes: every rank's `count`
  // elements summed in rank order (wrapping, as the ring's additions do).
  template <typename U>
  void MailSum(std::uint64_t seq, void* data, std::size_t count) {
    const std::size_t bytes = count * sizeof(U);
    progress_.Mail(seq, data, bytes);
    std::vector<U> sum(count, 0);
    for (int r = 0; r < world_size_; ++r) {
      const char* from = r == rank_ ? progress_.mailbox() : AwaitMail(r, seq, bytes);
      for (std::size_t i = 0; i < count; ++i) {
        U v;
        std::memcpy(&v, from + i * sizeof(U), sizeof(U));
        sum[i] = static_cast<U>(sum[i] + v);
      }
    }
    if (bytes > 0) std::memcpy(data, sum.data(), bytes);
  }

  // Check #checks_: every rank's summary of its unchecked collectives, then,
  // if they differ, the lists, and a mismatch names the first that differs.
  void CheckDescriptors() {
    in_check_ = true;
    FailIfPeerGone();
    const auto tag = static_cast<std::uint32_t>(4 * checks_);
    const std::array<std::uint64_t, UncheckedCollectives::kSummaryWords> summary = unchecked_.Summary();
    std::vector<std::uint64_t> all;
    if (shared_checks_) {
      all = ExchangeSummaries(summary.data());
    } else {
      GlooCall([&] { all = AllgatherWords(summary.data(), summary.size(), tag); });
    }
    std::size_t longest = 0;
    bool same = true;
    for (int r = 0; r < world_size_; ++r) {
      const std::uint64_t* theirs = &all[summary.size() * static_cast<std::size_t>(r)];
      same = same && std::equal(summary.begin(), summary.end(), theirs);
      longest = std::max(longest, static_cast<std::size_t>(theirs[0]));
    }
    if (same) {
      in_check_ = false;
      unchecked_.Clear();
      return;
    }
    std::vector<std::uint64_t> mine(longest * Descriptor::kWords, 0);
    for (std::size_t i = 0; i < unchecked_.size(); ++i) {
      const std::array<std::uint64_t, Descriptor::kWords> words = unchecked_.list()[i].Encode();
      std::copy(words.begin(), words.end(), mine.begin() + static_cast<std::ptrdiff_t>(i * Descriptor::kWords));
    }
    GlooCall([&] { all = AllgatherWords(mine.data(), mine.size(), tag + 2); });
    in_check_ = false;
    const std::uint64_t first_seq = unchecked_.list().front().seq;
    for (std::size_t i = 0; i < longest; ++i) {
      std::vector<Descriptor> column;
      for (int r = 0; r < world_size_; ++r) {
        column.push_back(Descriptor::Decode(&all[(static_cast<std::size_t>(r) * longest + i) * Descriptor::kWords]));
      }
      if (std::any_of(column.begin(), column.end(), [&](const Descriptor& d) { return !(d == column[0]); })) {
        Fail("rank " + std::to_string(rank_) + ": " + MismatchMessage(column, first_seq + i), false);
      }
    }
    Fail("rank " + std::to_string(rank_) + ": " + What() + ": the ranks' descriptor hashes differ, their lists do not",
         false);
  }

  // Every rank's summary for check #checks_, rank by rank, through the
  // shared check regions: this rank's published, then each peer's awaited
  // (a futex wait in slices of 50 ms, between which a peer that is gone or
  // failed ends it, as the watchdog would abort gloo's wait) until the
  // timeout, which names the ranks that did not arrive.
  std::vector<std::uint64_t> ExchangeSummaries(const std::uint64_t* summary) {
    constexpr std::size_t words = UncheckedCollectives::kSummaryWords;
    const auto k = static_cast<std::uint32_t>(checks_);
    progress_.Publish(k, summary);
    std::vector<std::uint64_t> all(words * static_cast<std::size_t>(world_size_));
    std::copy(summary, summary + words, all.begin() + static_cast<std::ptrdiff_t>(words * static_cast<std::size_t>(rank_)));
    const Clock::time_point deadline = Clock::now() + timeout_;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      const CheckRegion* theirs = peer_regions_[static_cast<std::size_t>(r)];
      AwaitPeerWord(r, theirs->published, [k](std::uint32_t v) { return v >= k; }, deadline, "the check");
      const std::uint64_t* slot = theirs->slots[k % 2];
      if (slot[0] != k) Fail(DescribeFailure(What(), "check #" + std::to_string(k) + " out of step"), true);
      std::copy(slot + 1, slot + 1 + words, all.begin() + static_cast<std::ptrdiff_t>(words * static_cast<std::size_t>(r)));
    }
    return all;
  }

  // Each rank's `count` words of `in`, rank by rank.
  std::vector<std::uint64_t> AllgatherWords(const std::uint64_t* in, std::size_t count, std::uint32_t tag) {
    std::vector<std::uint64_t> out(count * static_cast<std::size_t>(world_size_));
    gloo::AllgatherOptions opts(context_);
    Watched watched(*this);
    opts.setInput(const_cast<std::uint64_t*>(in), count);
    opts.setOutput<std::uint64_t>(watched.Buffer(out.data(), out.size() * sizeof(std::uint64_t)));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
    return out;
  }

  // "allreduce #12": the collective this rank is in.
  std::string What() const { return std::string(LastKind()) + " #" + std::to_string(seq_); }
  std::string_view LastKind() const { return seq_ == 0 ? "-" : KindName(static_cast<std::uint64_t>(kind_)); }

  template <typename Fn>
  void GlooCall(Fn&& fn) {
    std::string error;
    {
      SigpipeGuard guard;
      {
        std::lock_guard<std::mutex> lock(wd_mu_);
        in_flight_ = true;
        aborted_ = false;
      }
      wd_cv_.notify_all();
      try {
        fn();
      } catch (const gloo::EnforceNotMet& e) {
        error = e.what();
      } catch (const std::exception& e) {  // gloo::IoException, gloo::Exception, std::system_error
        error = e.what();
      }
      std::lock_guard<std::mutex> lock(wd_mu_);
      in_flight_ = false;
      if (aborted_) error = "aborted by the watchdog: a peer is gone";  // the payload may be garbage
    }
    if (!error.empty()) Fail(DescribeFailure(What(), GlooMessage(error)), true);
  }

  // The watchdog: while a gloo call is in flight it tests every 50 ms whether
  // a peer is gone and, if so, aborts every wait on the call's buffers until
  // the call returns (gloo's algorithms go on after an aborted wait, so each
  // later wait is aborted too). Gloo alone does not always notice: a pair that
  // breaks while a large send or receive is half done leaves that operation's
  // buffer waiting for the timeout.
  void WatchdogLoop() {
    std::unique_lock<std::mutex> lock(wd_mu_);
    while (!wd_stop_) {
      if (!in_flight_) {
        wd_cv_.wait(lock);
      } else if (aborted_) {
        for (gloo::transport::UnboundBuffer* b : watched_) {
          b->abortWaitRecv();
          b->abortWaitSend();
        }
        wd_cv_.wait_for(lock, std::chrono::milliseconds(5));
      } else {
        wd_cv_.wait_for(lock, std::chrono::milliseconds(50));
        if (wd_stop_ || !in_flight_) continue;
        for (int r = 0; r < world_size_ && !aborted_; ++r) {
          aborted_ = r != rank_ && peer_fds_[r] >= 0 && Unlocked(peer_fds_[r]);
        }
      }
    }
  }

  // Registers the buffers of one gloo call with the watchdog and unregisters
  // them when it goes out of scope, which must happen before they are freed.
  class Watched {
   public:
    explicit Watched(GlooCommunicator& comm) : comm_(comm) {}
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;
    ~Watched() {
      std::lock_guard<std::mutex> lock(comm_.wd_mu_);
      comm_.watched_.clear();
    }
    std::unique_ptr<gloo::transport::UnboundBuffer> Buffer(void* ptr, std::size_t bytes) {
      std::unique_ptr<gloo::transport::UnboundBuffer> buffer = comm_.context_->createUnboundBuffer(ptr, bytes);
      std::lock_guard<std::mutex> lock(comm_.wd_mu_);
      comm_.watched_.push_back(buffer.get());
      return buffer;
    }

   private:
    GlooCommunicator& comm_;
  };

  std::chrono::milliseconds Remaining(Clock::time_point deadline) const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  // Ring allreduce (reduce-scatter, then allgather) over gloo's transport:
  // gloo::allreduce waits on an internal buffer the watchdog cannot reach.
  // Segment s of the n segments is [Begin(s), Begin(s + 1)); ranks agree on
  // them, so an empty segment is skipped on both ends.
  template <typename T>
  void RingAllreduce(T* data, std::size_t count, std::uint32_t tag) {
    const auto n = static_cast<std::size_t>(world_size_);
    const auto me = static_cast<std::size_t>(rank_);
    const int right = (rank_ + 1) % world_size_;
    const int left = (rank_ + world_size_ - 1) % world_size_;
    const auto begin = [&](std::size_t s) { return count / n * s + std::min(s, count % n); };
    const std::size_t max_segment = count / n + (count % n != 0 ? 1 : 0);
    const std::uint64_t slot = gloo::Slot::build(kRingAllreduceSlotPrefix, tag);
    const Clock::time_point deadline = Clock::now() + timeout_;

    std::vector<T> partial(max_segment);
    std::unique_ptr<gloo::transport::UnboundBuffer> out;
    std::unique_ptr<gloo::transport::UnboundBuffer> in;
    Watched watched(*this);  // after the buffers: unregisters them before they die
    out = watched.Buffer(data, count * sizeof(T));
    in = watched.Buffer(partial.data(), max_segment * sizeof(T));

    const auto check = [](bool completed) {
      if (!completed) throw gloo::IoException("wait aborted");
    };
    // One step: send segment `send` to the right, receive segment `recv`
    // from the left (into `partial` to add it, else in place).
    const auto step = [&](std::size_t send, std::size_t recv, bool add) {
      const std::size_t sb = begin(send), se = begin(send + 1);
      const std::size_t rb = begin(recv), re = begin(recv + 1);
      if (se > sb) out->send(right, slot, sb * sizeof(T), (se - sb) * sizeof(T));
      if (re > rb) {
        if (add) {
          in->recv(left, slot, 0, (re - rb) * sizeof(T));
        } else {
          out->recv(left, slot, rb * sizeof(T), (re - rb) * sizeof(T));
        }
      }
      if (se > sb) check(out->waitSend(Remaining(deadline)));
      if (re > rb) {
        if (add) {
          check(in->waitRecv(Remaining(deadline)));
          gloo::sum<T>(data + rb, data + rb, partial.data(), re - rb);
        } else {
          check(out->waitRecv(Remaining(deadline)));
        }
      }
    };
    // After reduce-scatter step s, segment (me - s - 1) holds s + 2 ranks' sum;
    // at the end, segment (me + 1) holds all of them.
    for (std::size_t s = 0; s + 1 < n; ++s) step((me + n - s) % n, (me + 2 * n - s - 1) % n, true);
    for (std::size_t s = 0; s + 1 < n; ++s) step((me + 1 + n - s) % n, (me + n - s) % n, false);
  }

  std::vector<PeerStatus> ReadPeers() const {
    std::vector<PeerStatus> peers;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      if (static_cast<std::size_t>(r) < peer_fds_.size() && peer_fds_[r] >= 0) {
        peers.push_back(ReadPeer(peer_fds_[r], r));
      } else {
        const int fd = OpenPeer(store_dir_, r);
        peers.push_back(ReadPeer(fd, r));
        if (fd >= 0) ::close(fd);
      }
    }
    return peers;
  }

  // One flock() per peer: a peer whose communicator is gone (process exited
  // or killed, or communicator destroyed) fails the collective at once. Gloo
  // itself may not notice: a send can match a receive the dead rank posted
  // before it died and then wait for the full timeout.
  void FailIfPeerGone() {
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank_ && peer_fds_[r] >= 0 && Unlocked(peer_fds_[r])) Fail(DescribeFailure(What(), ""), true);
    }
  }

  // The one-line message for a gloo error in `what` ("allreduce #12").
  std::string DescribeFailure(const std::string& what, const std::string& gloo_message) const {
    const std::string me = "rank " + std::to_string(rank_) + ": ";
    const bool timeout = IsTimeout(gloo_message);

    std::vector<int> gone, missing, closed, failed;
    std::vector<PeerStatus> peers;
    // A peer that exits closes its sockets and releases its lock in the same
    // exit, but not at the same instant: allow the kernel a moment.
    const Clock::time_point settle = Clock::now() + std::chrono::milliseconds(timeout ? 0 : 300);
    for (;;) {
      gone.clear();
      missing.clear();
      closed.clear();
      failed.clear();
      peers = ReadPeers();
      for (const PeerStatus& p : peers) {
        if (p.state == "failed") {
          failed.push_back(p.rank);
        } else if (p.state == "closed") {
          closed.push_back(p.rank);
        } else if (!p.exists) {
          continue;  // cannot happen after rendezvous
        } else if (!p.alive) {
          gone.push_back(p.rank);
        } else if (in_check_ ? p.checks < checks_ : p.seq < seq_) {  // not in our check, or behind our payload
          missing.push_back(p.rank);
        }
      }
      // A dropped connection comes from a peer that is gone, closed or
      // failed; one that merely has not arrived yet may be exiting.
      const bool explained = !gone.empty() || !closed.empty() || !failed.empty() || (timeout && !missing.empty());
      if (explained || Clock::now() >= settle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto status = [&](int r) -> const PeerStatus& {
      return *std::find_if(peers.begin(), peers.end(), [r](const PeerStatus& p) { return p.rank == r; });
    };
    const auto last = [&](const std::vector<int>& ranks) {
      if (ranks.size() != 1) return std::string();
      return " (its last collective: " + status(ranks[0]).LastCollective() + ")";
    };

    if (!gone.empty()) {
      const bool one = gone.size() == 1;
      return me + FormatRanks(gone) +
             (one ? " closed its connection (exited or was killed)"
                  : " closed their connections (exited or were killed)") +
             " during " + what + last(gone);
    }
    if (!missing.empty()) {
      return me + what + (timeout ? " timed out after " + FormatSeconds(timeout_) : " failed") + ": " +
             FormatRanks(missing) + " did not arrive" + last(missing) +
             (timeout || failed.empty() ? "" : "; " + FormatRanks(failed) + " gave up first");
    }
    if (!closed.empty()) {
      const bool one = closed.size() == 1;
      return me + what + " failed: " + FormatRanks(closed) +
             (one ? " destroyed its communicator" : " destroyed their communicators") + last(closed);
    }
    if (!failed.empty()) {
      const PeerStatus& first = status(failed[0]);
      return me + what + " failed: " + FormatRanks(failed) + " failed first and closed " +
             (failed.size() == 1 ? "its connections" : "their connections") +
             (first.failure.empty() ? "" : " (" + first.failure + ")");
    }
    if (timeout) {
      return me + what + " timed out after " + FormatSeconds(timeout_) +
             " although every rank entered it (gloo: " + gloo_message + ")";
    }
    return me + what + " failed: " + gloo_message;
  }

  const int rank_;
  const int world_size_;
  const std::string store_dir_;
  const std::chrono::milliseconds timeout_;
  ProgressFile progress_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<int> peer_fds_;  // peers' progress files, open after rendezvous (-1: self)
  // Peers' check regions, mapped after rendezvous (null: self, or unmapped).
  std::vector<const CheckRegion*> peer_regions_;
  // Every rank's file is mapped: checks exchange summaries through them.
  bool shared_checks_ = false;
  // The watchdog's state, guarded by wd_mu_.
  std::mutex wd_mu_;
  std::condition_variable wd_cv_;
  bool wd_stop_ = false;
  bool in_flight_ = false;  // a gloo call is running
  bool aborted_ = false;    // a peer is gone: the watchdog aborts every wait
  std::vector<gloo::transport::UnboundBuffer*> watched_;
  std::thread watchdog_;
  std::uint64_t seq_ = 0;     // collectives called
  Kind kind_{};               // the kind of collective #seq_
  std::uint64_t checks_ = 0;  // checks entered
  bool in_check_ = false;     // a check's exchange is running
  UncheckedCollectives unchecked_;
  std::string broken_;  // non-empty after a CommError
};

std::string GlooCommunicator::JoinWaitOver(const std::vector<int>& missing, Clock::time_point deadline,
                                           const std::atomic<int>* interrupt) const {
  if (const int signal = interrupt != nullptr ? interrupt->load() : 0; signal != 0) {
    const char* name = sigabbrev_np(signal);
    return "stopped by " + (name != nullptr ? std::string("SIG") + name : std::to_string(signal)) +
           " while waiting for " + FormatRanks(missing) + " to join";
  }
  if (Clock::now() < deadline) return "";
  std::string msg = "rendezvous timed out after " + FormatSeconds(timeout_) + ": " + FormatRanks(missing) +
                    " never joined";
  for (int r = 0; r < world_size_; ++r) {
    std::error_code exists_ec;
    if (std::filesystem::exists(DuplicatePath(store_dir_, r), exists_ec)) {
      msg += "; rank " + std::to_string(r) + " was started twice (two processes with RANK=" + std::to_string(r) + ")";
    }
  }
  return msg;
}

void GlooCommunicator::Rendezvous(const GlooOptions& options) {
  const std::string me = "rank " + std::to_string(rank_) + ": ";
  const std::string where = " (store " + store_dir_ + ")";

  std::error_code ec;
  std::filesystem::create_directories(store_dir_, ec);
  if (ec) throw CommError(me + "cannot create store directory " + store_dir_ + ": " + ec.message());
  if (std::string err = progress_.Open(store_dir_, rank_, options.shared_checks); !err.empty()) {
    if (err.find("is locked by a live communicator") != std::string::npos) {
      std::ofstream(DuplicatePath(store_dir_, rank_)) << "1\n";
      throw CommError(me + "rank " + std::to_string(rank_) + " is already taken by another process (two processes " +
                      "started with RANK=" + std::to_string(rank_) + "?)" + where);
    }
    throw CommError(me + OneLine(err));
  }
  progress_.Write(0, "joining", "-", 0);

  const Clock::time_point deadline = Clock::now() + timeout_;
  try {
    PollableFileStore store(store_dir_);
    // Announce ourselves and wait for everyone, so a timeout can say who never came.
    try {
      store.set(JoinedKey(rank_), std::vector<char>{'1'});
    } catch (const gloo::EnforceNotMet& e) {
      throw CommError(
          me + "store directory " + store_dir_ + " already holds rank " + std::to_string(rank_) +
          "'s rendezvous (left by an earlier run? each job needs a fresh directory): " + GlooMessage(e.what()));
    }
    std::vector<int> missing;
    for (;;) {
      missing.clear();
      for (int r = 0; r < world_size_; ++r) {
        if (r != rank_ && !store.Has(JoinedKey(r))) missing.push_back(r);
      }
      if (missing.empty()) break;
      if (std::string msg = JoinWaitOver(missing, deadline, options.interrupt); !msg.empty()) {
        msg = me + msg + where;
        progress_.Write(0, "failed", "rendezvous", 0, msg);
        throw CommError(msg);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (world_size_ > 1) {
      SigpipeGuard guard;  // gloo's event-loop thread, started here, inherits the blocked SIGPIPE
      gloo::transport::tcp::attr attr;
      attr.hostname = options.hostname;
      device_ = CreateNicedDevice(attr, options.loop_nice);
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, world_size_);
      context_->setTimeout(timeout_);
      context_->connectFullMesh(store, device_);
    }
  } catch (const CommError&) {
    throw;
  } catch (const StoreWriteError& e) {  // a full disk: said as it is
    const std::string msg = me + e.what();
    context_.reset();
    device_.reset();
    progress_.Write(0, "failed", "rendezvous", 0, msg);
    throw CommError(msg);
  } catch (const std::exception& e) {  // gloo::IoException, gloo::EnforceNotMet, ...
    std::string msg = me + "rendezvous failed";
    std::vector<int> gone;
    for (const PeerStatus& p : ReadPeers()) {
      if (p.exists && !p.alive) gone.push_back(p.rank);
    }
    if (!gone.empty()) {
      msg += ": " + FormatRanks(gone) + " exited or " + (gone.size() == 1 ? "was" : "were") + " killed";
    }
    msg += " (gloo: " + GlooMessage(e.what()) + ")" + where;
    context_.reset();
    device_.reset();
    progress_.Write(0, "failed", "rendezvous", 0, msg);
    throw CommError(msg);
  }
  peer_fds_.assign(static_cast<std::size_t>(world_size_), -1);
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) peer_fds_[r] = OpenPeer(store_dir_, r);
  }
  // Every rank marked its file mapped before it joined, so all ranks see
  // the same flags and agree on how to exchange summaries.
  peer_regions_.assign(static_cast<std::size_t>(world_size_), nullptr);
  const CheckRegion* own = progress_.check_region();
  shared_checks_ = world_size_ > 1 && own != nullptr && Word(own->capable).load(std::memory_order_acquire) == 1;
  for (int r = 0; r < world_size_; ++r) {
    const int fd = peer_fds_[static_cast<std::size_t>(r)];
    if (r == rank_) continue;
    struct stat st {};
    void* map = MAP_FAILED;
    if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= kFileBytes) {
      map = ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
    }
    if (map == MAP_FAILED) {
      shared_checks_ = false;
      continue;
    }
    const auto* region = reinterpret_cast<const CheckRegion*>(static_cast<const char*>(map) + kCheckOffset);
    peer_regions_[static_cast<std::size_t>(r)] = region;
    // A peer of another kernel, or one whose file reads stale here (a
    // network filesystem), makes every rank use gloo: each has such a peer.
    if (Word(region->capable).load(std::memory_order_acquire) != 1 || own == nullptr || region->kernel != own->kernel) {
      shared_checks_ = false;
    }
  }
  if (world_size_ > 1) watchdog_ = std::thread([this] { WatchdogLoop(); });
  progress_.Write(0, "ready", "-", 0);
}

}  // namespace

std::unique_ptr<Communicator> CreateGlooCommunicator(const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw CommError("gloo: rank " + std::to_string(options.rank) + " is not a rank of world size " +
                    std::to_string(options.world_size));
  }
  if (options.store_dir.empty()) throw CommError("gloo: GlooOptions.store_dir is empty");
  if (options.timeout.count() <= 0) throw CommError("gloo: GlooOptions.timeout must be positive");
  auto comm = std::make_unique<GlooCommunicator>(options);
  comm->Rendezvous(options);
  return comm;
}

}  // namespace memscope::reducer
