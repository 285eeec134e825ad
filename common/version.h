#pragma once
#include <string>

namespace ddprun::common {

/// "<program> <version> (<revision>)" for --version: the release number and the source revision
/// it was built from (`git describe` at configure time; "no git revision" when built outside a
/// git checkout, as from a release tarball).
std::string version_line(const std::string& program);

}  // namespace ddprun::common
