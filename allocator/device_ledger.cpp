#include "allocator/device_ledger.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"

namespace memscope {
namespace {

static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
              "the ledger needs lock-free (address-free) 64-bit atomics to be shared across processes");

// Layout, in 64-bit cells: a header of 8 (cell 0: the magic), the devices'
// totals, then each device's per-process lines.
constexpr std::uint64_t kMagic = 0x3152474c4453534dULL;  // "MSSDLGR1"
constexpr std::size_t kHeaderCells = 8;
constexpr std::size_t kTotalsCell = kHeaderCells;
constexpr std::size_t kProcessCell = kTotalsCell + DeviceLedger::kMaxDevices;
constexpr std::size_t kCells =
    kProcessCell + static_cast<std::size_t>(DeviceLedger::kMaxDevices) * DeviceLedger::kMaxProcesses;
constexpr std::size_t kBytes = kCells * sizeof(std::uint64_t);

bool ValidDevice(int device) { return device >= 0 && device < DeviceLedger::kMaxDevices; }
bool ValidProcess(int process) { return process >= 0 && process < DeviceLedger::kMaxProcesses; }

std::size_t ProcessCell(int device, int process) {
  return kProcessCell + static_cast<std::size_t>(device) * DeviceLedger::kMaxProcesses +
         static_cast<std::size_t>(process);
}

}  // namespace

DeviceLedger::DeviceLedger(void* base, std::size_t size, bool mapped) : base_(base), size_(size), mapped_(mapped) {}

DeviceLedger::~DeviceLedger() {
  if (mapped_) {
    munmap(base_, size_);
  } else {
    ::operator delete (base_, std::align_val_t{64});
  }
}

namespace {

// Writes `bytes` of `data` at the start of `fd`; false (errno set) when a write fails.
bool WriteAll(int fd, const char* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

// Makes the ledger file at `path` whole before anyone maps it: written in
// full under a temporary name (every block allocated by write(), so no
// store into the mapping can meet a full disk: SIGBUS), then linked into
// place; when another process linked its own first, that one is kept. An
// error (a full disk) says why, naming the path.
absl::Status CreateWhole(const std::string& path, std::size_t bytes, std::uint64_t magic) {
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("device ledger '", path, "': cannot create: ", std::strerror(errno)));
  }
  std::unique_ptr<char[]> zeros(new char[bytes]());
  std::memcpy(zeros.get(), &magic, sizeof(magic));
  bool ok = WriteAll(fd, zeros.get(), bytes);
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::link(temp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    ok = false;
    err = errno;
  }
  ::unlink(temp.c_str());
  if (!ok) return absl::InternalError(absl::StrCat("cannot write device ledger '", path, "': ", std::strerror(err)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceLedger>> DeviceLedger::Open(const std::string& path) {
  auto error = [&path](const char* what) {
    return absl::InternalError(absl::StrCat("device ledger '", path, "': ", what, ": ", std::strerror(errno)));
  };
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    if (absl::Status s = CreateWhole(path, kBytes, kMagic); !s.ok()) return s;
    fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) return error("cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const auto s = error("cannot stat");
    ::close(fd);
    return s;
  }
  // Only a whole ledger is mapped: a shorter file (sparse or torn) could
  // turn a store into SIGBUS on a full disk.
  if (static_cast<std::size_t>(st.st_size) != kBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("device ledger '", path, "': not a memscope device ledger (",
                                                   st.st_size, " bytes, expected ", kBytes, ")"));
  }
  void* base = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const auto s = error("cannot map");
    ::close(fd);
    return s;
  }
  ::close(fd);  // the mapping stays
  std::shared_ptr<DeviceLedger> ledger(new DeviceLedger(base, kBytes, true));
  if (std::atomic_ref<std::uint64_t>(*ledger->Cell(0)).load() != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("device ledger '", path, "': not a memscope device ledger"));
  }
  return ledger;
}

std::shared_ptr<DeviceLedger> DeviceLedger::InMemory() {
  void* base = ::operator new (kBytes, std::align_val_t{64});
  std::memset(base, 0, kBytes);
  std::shared_ptr<DeviceLedger> ledger(new DeviceLedger(base, kBytes, false));
  *ledger->Cell(0) = kMagic;
  return ledger;
}

std::uint64_t* DeviceLedger::Cell(std::size_t index) const { return static_cast<std::uint64_t*>(base_) + index; }

bool DeviceLedger::TryCharge(int device, int process, std::uint64_t bytes, std::uint64_t capacity) {
  if (!ValidDevice(device)) return false;
  std::atomic_ref<std::uint64_t> used(*Cell(kTotalsCell + static_cast<std::size_t>(device)));
  std::uint64_t current = used.load();
  do {
    if (current > capacity || bytes > capacity - current) return false;
  } while (!used.compare_exchange_weak(current, current + bytes));
  if (ValidProcess(process)) std::atomic_ref<std::uint64_t>(*Cell(ProcessCell(device, process))).fetch_add(bytes);
  return true;
}

void DeviceLedger::Credit(int device, int process, std::uint64_t bytes) {
  if (!ValidDevice(device)) return;
  std::atomic_ref<std::uint64_t>(*Cell(kTotalsCell + static_cast<std::size_t>(device))).fetch_sub(bytes);
  if (ValidProcess(process)) std::atomic_ref<std::uint64_t>(*Cell(ProcessCell(device, process))).fetch_sub(bytes);
}

std::uint64_t DeviceLedger::Used(int device) const {
  if (!ValidDevice(device)) return 0;
  return std::atomic_ref<std::uint64_t>(*Cell(kTotalsCell + static_cast<std::size_t>(device))).load();
}

std::uint64_t DeviceLedger::UsedBy(int device, int process) const {
  if (!ValidDevice(device) || !ValidProcess(process)) return 0;
  return std::atomic_ref<std::uint64_t>(*Cell(ProcessCell(device, process))).load();
}

}  // namespace memscope
