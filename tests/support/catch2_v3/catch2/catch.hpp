#pragma once
// Catch2 2's single header, as far as ddprun's tests use it, on Catch2 3 (Debian 13 ships only
// Catch2 3, which has no catch2/catch.hpp). tests/CMakeLists.txt puts this directory on the
// include path only when it finds Catch2 3, so the tests keep one source for both: they go on
// writing Catch2 2's spellings, and this header maps the few that Catch2 3 renamed. main() comes
// from Catch2 3's Catch2WithMain, so CATCH_CONFIG_MAIN (tests/support/catch_main.cpp) is unused.
//
// Catch2 3's catch_matchers_contains.hpp is left out on purpose: its Contains(T&&) is a
// container matcher that would take a string literal before the string Contains below.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <string>

namespace Catch::Matchers {
/// Catch2 2's string Contains, ContainsSubstring in Catch2 3.
inline StringContainsMatcher Contains(const std::string& text,
                                      CaseSensitive case_sensitivity = CaseSensitive::Yes) {
  return ContainsSubstring(text, case_sensitivity);
}
}  // namespace Catch::Matchers

namespace Catch {
// Catch2 2 also had the matchers in namespace Catch.
using Matchers::Contains;
using Matchers::EndsWith;
using Matchers::StartsWith;
}  // namespace Catch

// Catch2 2 declared Approx in the global namespace.
using Catch::Approx;
