#pragma once
// ddprun's logging: spdlog, with fmt's formatting code shared rather than copied into every
// source file. Include this, never <spdlog/spdlog.h> itself (cmake/module_dependencies.cmake
// checks it).
//
// fmt 9 defines detail::vformat_to<char>, the engine behind every spdlog call, in its header, so
// each translation unit that logs compiled its own copy (about 20 KB of code, floating-point
// formatting included) although the shared libfmt exports one. Declaring that instantiation
// extern makes every caller use the library's: the agent's binary is smaller and maps fewer
// pages (docs/benchmarks.md). fmt 10 declares it itself. GCC only: the instantiation's
// signature depends on its template parameter, which clang 14 mangles differently from the GCC
// that built libfmt, so a clang build would look for a symbol the library does not have; clang
// builds keep their own copies.
#include <fmt/format.h>

#if defined(FMT_SHARED) && FMT_VERSION >= 90000 && FMT_VERSION < 100000 && defined(__GNUC__) && \
    !defined(__clang__)
extern template void fmt::detail::vformat_to<char>(
    fmt::detail::buffer<char>&, fmt::basic_string_view<char>,
    fmt::basic_format_args<fmt::buffer_context<fmt::type_identity_t<char>>>,
    fmt::detail::locale_ref);
#endif

#include <spdlog/spdlog.h>

#include "common/shared_string.h"

/// A SharedString (a node's id) is logged as its characters: fmt 9 found that through its
/// conversion to std::string_view, fmt 10 (Debian 13) no longer does.
template <>
struct fmt::formatter<ddprun::common::SharedString> : fmt::formatter<fmt::string_view> {
  template <class FormatContext>
  auto format(const ddprun::common::SharedString& text, FormatContext& context) const {
    const std::string_view view = text.view();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(view.data(), view.size()),
                                                    context);
  }
};
