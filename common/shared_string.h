#pragma once
#include <atomic>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace ddprun::common {

/// An immutable string that any number of holders share: one allocation holding a count, the
/// size and the characters, freed with its last holder. A rendezvous server holds each node's
/// id in its node table and in the node's connection: as one SharedString that is one copy,
/// where two std::strings were two heap blocks and 64 bytes of string objects
/// (docs/design.md#rendezvous-at-scale). Read it as a std::string_view; an empty one holds no
/// allocation. Copies may be used on several threads (the count is atomic).
class SharedString {
 public:
  SharedString() = default;
  explicit SharedString(std::string_view text) {
    if (text.empty()) return;
    if (text.size() > UINT32_MAX) throw std::length_error("SharedString: a string over 4 GiB");
    void* raw = ::operator new(sizeof(Block) + text.size());
    block_ = new (raw) Block{{1}, static_cast<std::uint32_t>(text.size())};
    std::memcpy(block_->chars(), text.data(), text.size());
  }
  SharedString(const SharedString& other) noexcept : block_(other.block_) {
    if (block_ != nullptr) block_->count.fetch_add(1, std::memory_order_relaxed);
  }
  SharedString(SharedString&& other) noexcept : block_(std::exchange(other.block_, nullptr)) {}
  SharedString& operator=(SharedString other) noexcept {
    std::swap(block_, other.block_);
    return *this;
  }
  ~SharedString() { release(); }

  std::string_view view() const {
    return block_ == nullptr ? std::string_view() : std::string_view(block_->chars(), block_->size);
  }
  operator std::string_view() const { return view(); }  // NOLINT: read as a string_view
  std::string str() const { return std::string(view()); }
  bool empty() const { return block_ == nullptr; }
  std::size_t size() const { return block_ == nullptr ? 0 : block_->size; }
  /// Whether `other` holds this very allocation (not merely the same characters).
  bool shares_with(const SharedString& other) const { return block_ == other.block_; }

  friend bool operator==(const SharedString& a, const SharedString& b) {
    return a.block_ == b.block_ || a.view() == b.view();
  }
  friend std::strong_ordering operator<=>(const SharedString& a, const SharedString& b) {
    return a.view() <=> b.view();
  }
  friend bool operator==(const SharedString& a, std::string_view b) { return a.view() == b; }
  friend std::strong_ordering operator<=>(const SharedString& a, std::string_view b) {
    return a.view() <=> b;
  }

 private:
  struct Block {
    std::atomic<std::uint32_t> count;
    std::uint32_t size;
    char* chars() { return reinterpret_cast<char*>(this + 1); }
  };
  void release() noexcept {
    if (block_ != nullptr && block_->count.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      block_->~Block();
      ::operator delete(block_);
    }
    block_ = nullptr;
  }
  Block* block_ = nullptr;
};

}  // namespace ddprun::common

template <>
struct std::hash<ddprun::common::SharedString> {
  std::size_t operator()(const ddprun::common::SharedString& s) const noexcept {
    return std::hash<std::string_view>()(s.view());
  }
};
