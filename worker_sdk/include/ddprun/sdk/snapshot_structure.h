#pragma once
// The structure of a snapshot file, checked before libtorch reads it: libtorch trusts the zip
// directory and the tensor views in data.pkl, so a crafted file (a storage record emptied, a
// view past its storage's end) makes it read outside its buffers. Pure and free of libtorch.
//
// The format is torch.save's zip (what torch::pickle_save and ddprun's writer produce): records
// stored uncompressed under one archive name ("archive" from C++, the file's stem from Python),
//   <archive>/data.pkl       the pickled dict, tensors as torch._utils._rebuild_tensor_v2 calls
//   <archive>/data/<key>     one storage's bytes, named by the key of its persistent id
//   <archive>/version        the format version (".data/version" from newer writers)
// a central directory, and (as miniz writes it) a zip64 end record before the classic one.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ddprun::sdk {

/// One stored zip entry: its full name and where its bytes lie in the file.
struct ZipRecord {
  std::string name;     ///< "archive/data/0"
  uint64_t offset = 0;  ///< of its first data byte in the file
  uint64_t size = 0;    ///< in bytes (stored: compressed and uncompressed sizes are equal)
};

/// A tensor as data.pkl builds it: the storage it views and how.
struct TensorView {
  std::string name;            ///< the dict keys from the top, joined by '.': "model.fc1.weight"
  std::string dtype;           ///< "float32", from the storage's type
  int64_t item_size = 0;       ///< bytes per element
  std::string storage_key;     ///< its storage is the record <archive>/data/<storage_key>
  int64_t storage_offset = 0;  ///< in elements
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

/// A snapshot file whose structure holds together: every tensor lies inside its storage record.
struct SnapshotStructure {
  std::string archive;              ///< the records' common first name component
  std::vector<ZipRecord> records;   ///< in central directory order
  std::vector<TensorView> tensors;  ///< in data.pkl order
};

/// Limits on what a snapshot may hold, far above what ddprun writes; past them a file is refused
/// before anything is allocated for it.
inline constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;  ///< data.pkl's size
inline constexpr size_t kMaxPickleNesting = 64;  ///< tuples in tuples, open marks, dicts in dicts

/// Checks the zip (end records, central directory, local headers, stored entries inside the file
/// and apart from each other), the record names, and data.pkl by reading its opcodes without
/// running them: each storage record's size against its declared element count and against the
/// extent (offset, sizes, strides, dtype) of every tensor that views it. Returns the structure,
/// or an error naming the record or field at fault.
std::variant<SnapshotStructure, std::string> check_snapshot_structure(std::string_view file);

}  // namespace ddprun::sdk
