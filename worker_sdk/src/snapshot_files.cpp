#include "ddprun/sdk/snapshot_files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/strings.h"

namespace ddprun::sdk {
namespace {

constexpr int kSeqDigits = 6;

std::string leaf_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string snapshot_file_name(const std::string& base, int64_t seq) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%0*lld", kSeqDigits, static_cast<long long>(seq));
  return base + "." + digits;
}

std::optional<int64_t> snapshot_sequence(const std::string& base, const std::string& file_name) {
  const std::string prefix = leaf_of(base) + ".";
  if (file_name.size() <= prefix.size() || file_name.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  const std::string rest = file_name.substr(prefix.size());
  // Only digits: "snapshot.pt.000003.tmp-123" is a write in progress, not a snapshot.
  if (rest.size() < kSeqDigits ||
      !std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  auto v = common::parse_int(rest);
  if (!v) return std::nullopt;
  return static_cast<int64_t>(*v);
}

bool is_snapshot_temporary(const std::string& base, const std::string& file_name) {
  const auto tmp = file_name.rfind(".tmp-");
  if (tmp == std::string::npos || tmp + 5 >= file_name.size()) return false;
  const std::string pid = file_name.substr(tmp + 5);
  return std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         snapshot_sequence(base, file_name.substr(0, tmp)).has_value();
}

std::string snapshot_directory(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::optional<std::string> snapshot_directory_problem(const std::string& base) {
  namespace fs = std::filesystem;
  const fs::path directory = snapshot_directory(base);
  // The directory, or the nearest ancestor that exists, in which save() would create it.
  fs::path existing = directory;
  std::error_code ec;
  while (!fs::exists(existing, ec) && !ec) {
    fs::path parent = existing.parent_path();
    if (parent.empty()) parent = ".";
    if (parent == existing) break;
    existing = parent;
  }
  const std::string where = "snapshot series " + base + ": ";
  if (ec)  // not even looked at: a directory above it may not be entered
    return where + "cannot look at " + existing.string() + ": " + ec.message() +
           "; give a path this user can write";
  if (!fs::is_directory(existing, ec))
    return where + existing.string() + " is not a directory, so no snapshot can be saved there";
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    return where + "cannot " +
           (existing == directory ? "write in " + existing.string()
                                  : "create " + directory.string() + " in " + existing.string()) +
           ": " + std::strerror(errno) + "; give a path this user can write";
  return std::nullopt;
}

SnapshotListing list_snapshots(const std::string& base) {
  SnapshotListing listing;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(snapshot_directory(base), ec)) {
    const std::string name = e.path().filename().string();
    if (auto seq = snapshot_sequence(base, name))
      listing.seqs.push_back(*seq);
    else if (is_snapshot_temporary(base, name))
      listing.temporaries.push_back(e.path().string());
  }
  return listing;
}

std::vector<int64_t> newest_first(std::vector<int64_t> seqs) {
  std::sort(seqs.begin(), seqs.end(), std::greater<>());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  return seqs;
}

std::vector<int64_t> snapshots_to_prune(const std::vector<int64_t>& seqs, int keep) {
  std::vector<int64_t> sorted = newest_first(seqs);
  const size_t kept = static_cast<size_t>(std::max(keep, 1));
  if (sorted.size() <= kept) return {};
  return std::vector<int64_t>(sorted.begin() + static_cast<std::ptrdiff_t>(kept), sorted.end());
}

uint64_t checksum_update(uint64_t state, const void* data, size_t size) {
  // An empty tensor's data pointer may be null: nothing to read, not even the pointer.
  if (size == 0) return state;
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  // Four independent lanes of eight bytes hide the multiply's latency, so hashing runs several
  // times faster than the disk. Each lane step is a bijection of the lane for fixed input, and
  // folding the lanes into the state is a bijection in each lane, so changing any one word
  // always changes the result.
  if (size >= 64) {
    uint64_t lane[4] = {state, state ^ 0x9e3779b97f4a7c15ULL, state ^ 0xc2b2ae3d27d4eb4fULL,
                        state ^ 0x165667b19e3779f9ULL};
    for (; i + 32 <= size; i += 32) {
      for (int k = 0; k < 4; ++k) {
        uint64_t word;
        std::memcpy(&word, p + i + 8 * k, 8);
        lane[k] = (lane[k] ^ word) * kPrime;
      }
    }
    for (uint64_t l : lane) state = (state ^ l) * kPrime;
  }
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    state = (state ^ word) * kPrime;
  }
  for (; i < size; ++i) state = (state ^ p[i]) * kPrime;
  return state;
}

std::string checksum_hex(uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(value));
  return out;
}

}  // namespace ddprun::sdk
