#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

// One constexpr name table per enum: the names a value has on the wire, in `ddprun status`
// and in its --json output, read and written from the same rows so they cannot drift apart.

namespace ddprun::common {

/// One row of a name table.
template <typename Enum>
struct EnumName {
  Enum value;
  std::string_view name;
};

/// The name of `value` in `table` ("" if it has no row: name_table_complete() rules that out).
template <typename Enum, std::size_t N>
constexpr std::string_view name_of(Enum value, const std::array<EnumName<Enum>, N>& table) {
  for (const auto& row : table)
    if (row.value == value) return row.name;
  return {};
}

/// The value named `name` in `table`, or nullopt for a name it does not have.
template <typename Enum, std::size_t N>
constexpr std::optional<Enum> enum_from(std::string_view name,
                                        const std::array<EnumName<Enum>, N>& table) {
  for (const auto& row : table)
    if (row.name == name) return row.value;
  return std::nullopt;
}

/// Whether `table` names the values 0..N-1 of a contiguous enum exactly once each, with distinct
/// non-empty names: checked by a static_assert next to each table.
template <typename Enum, std::size_t N>
constexpr bool name_table_complete(const std::array<EnumName<Enum>, N>& table) {
  for (std::size_t i = 0; i < N; ++i) {
    if (table[i].name.empty()) return false;
    if (name_of(static_cast<Enum>(i), table).empty()) return false;
    for (std::size_t j = i + 1; j < N; ++j)
      if (table[i].value == table[j].value || table[i].name == table[j].name) return false;
  }
  return true;
}

}  // namespace ddprun::common
