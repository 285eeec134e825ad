#include "ddprun/sdk/snapshot_files.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "tests/support/subprocess.h"

using namespace ddprun::sdk;

TEST_CASE("snapshot files are numbered after the base name", "[sdk][unit]") {
  CHECK(snapshot_file_name("run/snapshot.pt", 7) == "run/snapshot.pt.000007");
  CHECK(snapshot_sequence("run/snapshot.pt", "snapshot.pt.000007") == 7);
  CHECK(snapshot_sequence("run/snapshot.pt", "snapshot.pt.1234567") == 1234567);
}

TEST_CASE("temporary files and other series are not snapshots", "[sdk][unit]") {
  CHECK_FALSE(snapshot_sequence("snapshot.pt", "snapshot.pt.000003.tmp-4242"));
  CHECK_FALSE(snapshot_sequence("snapshot.pt", "snapshot.pt"));
  CHECK_FALSE(snapshot_sequence("snapshot.pt", "other.pt.000003"));
  CHECK_FALSE(snapshot_sequence("snapshot.pt", "snapshot.pt.12"));
}

TEST_CASE("the newest snapshots are kept and older ones pruned", "[sdk][unit]") {
  CHECK(newest_first({3, 1, 10, 2}) == std::vector<int64_t>{10, 3, 2, 1});
  CHECK(snapshots_to_prune({3, 1, 10, 2}, 2) == std::vector<int64_t>{2, 1});
  CHECK(snapshots_to_prune({3, 1}, 3).empty());
  // At least one is always kept.
  CHECK(snapshots_to_prune({5, 6}, 0) == std::vector<int64_t>{5});
}

TEST_CASE("a save's temporary file is told apart from snapshots and other files", "[sdk][unit]") {
  // As a writer killed during its save leaves it.
  CHECK(is_snapshot_temporary("run/snapshot.pt", "snapshot.pt.000005.tmp-18002"));
  CHECK_FALSE(is_snapshot_temporary("run/snapshot.pt", "snapshot.pt.000005"));
  CHECK_FALSE(is_snapshot_temporary("run/snapshot.pt", "other.pt.000005.tmp-18002"));
  CHECK_FALSE(is_snapshot_temporary("run/snapshot.pt", "snapshot.pt.000005.tmp-"));
  CHECK_FALSE(is_snapshot_temporary("run/snapshot.pt", "snapshot.pt.000005.tmp-x1"));
  CHECK_FALSE(is_snapshot_temporary("run/snapshot.pt", "snapshot.pt.tmp-18002"));
}

TEST_CASE("the checksum changes when any byte changes", "[sdk][unit]") {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 31);
  const uint64_t original = checksum_update(kChecksumStart, data.data(), data.size());
  CHECK(original == checksum_update(kChecksumStart, data.data(), data.size()));
  for (size_t at : {size_t{0}, size_t{7}, size_t{8}, size_t{500}, size_t{995}, size_t{999}}) {
    auto changed = data;
    changed[at] ^= 0x10;
    CHECK(checksum_update(kChecksumStart, changed.data(), changed.size()) != original);
  }
  CHECK(checksum_hex(0xabcULL) == "0000000000000abc");
}

TEST_CASE("the checksum of no bytes is the state it was given, even without a buffer",
          "[sdk][unit]") {
  CHECK(checksum_update(kChecksumStart, nullptr, 0) == kChecksumStart);
  CHECK(checksum_update(42, nullptr, 0) == 42);
}

TEST_CASE("one listing finds the series' snapshots and a killed writer's temporary files",
          "[sdk][unit]") {
  ddprun::testing::TempDir dir;
  const std::string base = dir.path() + "/snapshot.pt";
  for (const char* name : {"snapshot.pt.000002", "snapshot.pt.000010", "snapshot.pt.000011.tmp-77",
                           "other.pt.000003", "other.pt.000004.tmp-5", "snapshot.pt"})
    std::ofstream(dir.path() + "/" + name) << "x";
  SnapshotListing listing = list_snapshots(base);
  CHECK(newest_first(listing.seqs) == std::vector<int64_t>{10, 2});
  CHECK(listing.temporaries == std::vector<std::string>{dir.path() + "/snapshot.pt.000011.tmp-77"});
  CHECK(snapshot_directory(base) == dir.path());
  CHECK(snapshot_directory("snapshot.pt") == ".");
  // A directory that is not there lists nothing.
  const SnapshotListing none = list_snapshots(dir.path() + "/missing/snapshot.pt");
  CHECK(none.seqs.empty());
  CHECK(none.temporaries.empty());
}

namespace {

/// snapshot_directory_problem(base) as a user who may not write where root may: run as
/// nobody in a child when this test runs as root (root writes anywhere), else as this user.
std::string problem_as_nobody(const std::string& base) {
  if (::geteuid() != 0) return snapshot_directory_problem(base).value_or("none");
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    const std::string why = snapshot_directory_problem(base).value_or("none");
    const bool written =
        ::write(fds[1], why.data(), why.size()) == static_cast<ssize_t>(why.size());
    ::_exit(written ? 0 : 3);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) out.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return out;
}

}  // namespace

TEST_CASE("a snapshot series that could not be saved is told at once, naming the directory",
          "[sdk][unit]") {
  ddprun::testing::TempDir dir;
  // Missing directories that save() would create are fine; so is a bare name.
  CHECK_FALSE(snapshot_directory_problem(dir.path() + "/a/b/snapshot.pt"));
  CHECK_FALSE(snapshot_directory_problem("snapshot.pt"));
  // A file where a directory should be.
  const std::string file = dir.path() + "/file";
  std::ofstream(file) << "x";
  CHECK(snapshot_directory_problem(file + "/ckpt/snapshot.pt") ==
        "snapshot series " + file + "/ckpt/snapshot.pt: " + file +
            " is not a directory, so no snapshot can be saved there");
  // A directory this user may not write in, and one it could not create.
  const std::string locked = dir.path() + "/locked";
  std::filesystem::create_directory(locked);
  std::filesystem::permissions(
      locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                  std::filesystem::perms::group_read | std::filesystem::perms::group_exec |
                  std::filesystem::perms::others_read | std::filesystem::perms::others_exec);
  std::filesystem::permissions(dir.path(), std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add);
  CHECK(problem_as_nobody(locked + "/snapshot.pt") ==
        "snapshot series " + locked + "/snapshot.pt: cannot write in " + locked +
            ": Permission denied; give a path this user can write");
  CHECK(problem_as_nobody(locked + "/run/snapshot.pt") ==
        "snapshot series " + locked + "/run/snapshot.pt: cannot create " + locked + "/run in " +
            locked + ": Permission denied; give a path this user can write");
  if (::geteuid() != 0) return;  // this user owns dir: only nobody is refused there
  CHECK(problem_as_nobody(dir.path() + "/snapshot.pt") ==
        "snapshot series " + dir.path() + "/snapshot.pt: cannot write in " + dir.path() +
            ": Permission denied; give a path "
            "this user can write");
}
