#pragma once
// Naming, ordering and pruning of snapshot files, and their content checksum. Pure and free of
// libtorch; the reading and writing are in ddprun/sdk.h.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::sdk {

/// The file for sequence number `seq` of the snapshot series `base` ("run/snapshot.pt"):
/// "run/snapshot.pt.000007". The directory holds the series; the base file itself is not written.
std::string snapshot_file_name(const std::string& base, int64_t seq);

/// The sequence number of `file_name` (a name inside the base's directory, without the
/// directory) when it belongs to the series of `base`; nullopt for other files, including
/// unfinished temporary files.
std::optional<int64_t> snapshot_sequence(const std::string& base, const std::string& file_name);

/// Whether `file_name` is a temporary file of the series of `base` that a save writes before
/// renaming it ("snapshot.pt.000007.tmp-4242", the writer's pid last). One left behind is from
/// a writer killed during its save.
bool is_snapshot_temporary(const std::string& base, const std::string& file_name);

/// The directory that holds `path` ("." for a bare name).
std::string snapshot_directory(const std::string& path);

/// Why no snapshot of the series `base` could be saved, or nullopt: its directory, or the
/// nearest ancestor of it that exists, is not a directory or not writable by this process.
/// Checked when a series is opened, so a wrong path stops a job at start, not after its first
/// epoch.
std::optional<std::string> snapshot_directory_problem(const std::string& base);

/// What one listing of the series' directory finds: its snapshots' sequence numbers (in no
/// order) and the paths of temporary files of the series (see is_snapshot_temporary).
struct SnapshotListing {
  std::vector<int64_t> seqs;
  std::vector<std::string> temporaries;
};
/// Lists the directory of `base` once; a directory that cannot be read lists nothing.
SnapshotListing list_snapshots(const std::string& base);

/// Sequence numbers newest first.
std::vector<int64_t> newest_first(std::vector<int64_t> seqs);

/// The sequence numbers to delete so that only the newest `keep` remain (keep >= 1).
std::vector<int64_t> snapshots_to_prune(const std::vector<int64_t>& seqs, int keep);

/// A 64-bit FNV-1a-style hash over 8-byte words in four lanes (then the tail), continued from
/// `state` (start with kChecksumStart). `data` may be null when `size` is 0.
inline constexpr uint64_t kChecksumStart = 0xcbf29ce484222325ULL;
uint64_t checksum_update(uint64_t state, const void* data, size_t size);

/// 16 lower-case hex digits.
std::string checksum_hex(uint64_t value);

}  // namespace ddprun::sdk
