#pragma once
#include <string>
#include <utility>
#include <variant>

// One spelling for "a value or an error" across ddprun (docs/design.md#errors-as-values):
//   Result<T>             a value, or the Error that prevented it
//   std::optional<Error>  a check: nullopt when all is well, else what is wrong
//   std::optional<T>      a value that may be absent; never an error
// An empty string never means success. Errors are expected failures (bad flags, unreadable
// files, refused peers) worded for the user; broken invariants abort (common/check.h).

namespace ddprun::common {

/// An expected failure, worded for the user: what is wrong, with the values involved, and what
/// to do.
struct Error {
  std::string message;

  bool operator==(const Error&) const = default;
};

/// A value of type T, or the Error that prevented it. Implicit from either, so a function
/// returns `value` or `Error{"..."}` as it would return one of them.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT: implicit

  /// Whether it holds a value.
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  /// The value; only when ok().
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only when !ok().
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace ddprun::common
