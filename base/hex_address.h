// An address as messages print it: "0x7f0000000000" (lower-case hex digits,
// no leading zeros), as PyTorch's snapshot viewers show addresses.
#ifndef MEMSCOPE_BASE_HEX_ADDRESS_H_
#define MEMSCOPE_BASE_HEX_ADDRESS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace memscope {

inline std::string HexAddress(std::uint64_t address) { return absl::StrCat("0x", absl::Hex(address)); }

}  // namespace memscope

#endif  // MEMSCOPE_BASE_HEX_ADDRESS_H_
