#include "store/store_state.h"

#include <charconv>
#include <utility>

namespace ddprun::store {

namespace {

constexpr std::uint8_t kReady = 0;         // CHECK: every key is there
constexpr std::uint8_t kNotReady = 1;      // CHECK: one is missing
constexpr std::uint8_t kStopWaiting = 0;   // WAIT: every key is there now
constexpr std::uint8_t kWaitCanceled = 1;  // CANCEL_WAIT, whether a wait was parked or not

/// ADD's stored value: ASCII decimal, as torch writes it.
std::optional<std::int64_t> parse_counter(const std::string& text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || p != end || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

Effects StoreState::apply(ConnId conn, const Request& q) {
  Effects out;
  auto reply = [&out, conn](std::string bytes) { out.send(conn, std::move(bytes)); };
  switch (q.op) {
    case Op::Validate:
      break;  // no reply: the 2.x client does not read one
    case Op::Ping:
      reply(encode_u32(q.word));
      break;
    case Op::Set:
      put(q.keys[0], q.values[0], out);
      break;
    case Op::CompareSet: {
      const std::string& key = q.keys[0];
      const std::string& expected = q.values[0];
      const std::string& desired = q.values[1];
      auto it = data_.find(key);
      if (it == data_.end()) {
        // Missing: only an empty expectation creates it; otherwise the reply is `expected`
        // and nothing is created (torch's behaviour in every version).
        if (expected.empty()) put(key, desired, out);
        reply(encode_bytes(expected.empty() ? desired : expected));
        break;
      }
      if (it->second == expected && desired != expected) put(key, desired, out);
      reply(encode_bytes(data_.at(key)));
      break;
    }
    case Op::Get: {
      // A client always WAITs first; a key deleted in between reads as empty (libuv's answer).
      auto it = data_.find(q.keys[0]);
      reply(encode_bytes(it == data_.end() ? std::string_view() : std::string_view(it->second)));
      break;
    }
    case Op::Add: {
      const std::string& key = q.keys[0];
      std::int64_t value = 0;
      if (auto it = data_.find(key); it != data_.end()) {
        auto current = parse_counter(it->second);
        if (!current) {
          out.close = "ADD on a key whose value is not a decimal number";
          return out;
        }
        value = *current;
      }
      if (__builtin_add_overflow(value, q.delta, &value)) {
        out.close = "ADD overflows a 64-bit counter";
        return out;
      }
      put(key, std::to_string(value), out);
      reply(encode_i64(value));
      break;
    }
    case Op::Check: {
      bool all = true;
      for (const auto& key : q.keys) all = all && present(key);
      reply(encode_u8(all ? kReady : kNotReady));
      break;
    }
    case Op::Wait: {
      std::set<std::string> missing;
      for (const auto& key : q.keys)
        if (!present(key)) missing.insert(key);
      if (missing.empty()) {
        reply(encode_u8(kStopWaiting));
        break;
      }
      std::size_t cost = 0;
      for (const auto& key : missing) cost += 2 * entry_bytes(key);
      if (parked_bytes_ + cost > max_parked_bytes_) {
        out.close = "the store's parked waits and watches would take more than " +
                    std::to_string(max_parked_bytes_) +
                    " bytes (this wait: " + std::to_string(missing.size()) + " missing keys)";
        return out;
      }
      // Parked: answered by the change that makes the last missing key appear (wake). A key
      // this connection already waits on is not counted twice.
      std::set<std::string>& mine = pending_[conn];
      for (const auto& key : missing) {
        if (!mine.insert(key).second) continue;
        waiters_[key].insert(conn);
        parked_bytes_ += 2 * entry_bytes(key);
      }
      break;
    }
    case Op::NumKeys:
      reply(encode_i64(static_cast<std::int64_t>(data_.size())));
      break;
    case Op::WatchKey:
      if (parked_bytes_ + entry_bytes(q.keys[0]) > max_parked_bytes_) {
        out.close = "the store's parked waits and watches would take more than " +
                    std::to_string(max_parked_bytes_) + " bytes";
        return out;
      }
      if (watchers_[q.keys[0]].insert(conn).second) parked_bytes_ += entry_bytes(q.keys[0]);
      reply(encode_u8(static_cast<std::uint8_t>(WatchEvent::Registered)));
      break;
    case Op::DeleteKey: {
      auto it = data_.find(q.keys[0]);
      const bool found = it != data_.end();
      if (found) {
        const std::string old_value = it->second;
        erase_key(it);
        if (auto w = watchers_.find(q.keys[0]); w != watchers_.end()) {
          const SharedBytes push = std::make_shared<const std::string>(
              encode_watch_push(WatchEvent::Deleted, q.keys[0], old_value, ""));
          for (ConnId c : w->second) out.sends.emplace_back(c, push);
        }
      }
      reply(encode_i64(found ? 1 : 0));
      break;
    }
    case Op::Append: {
      auto it = data_.find(q.keys[0]);
      put(q.keys[0], (it == data_.end() ? std::string() : it->second) + q.values[0], out);
      break;
    }
    case Op::MultiGet:
      for (const auto& key : q.keys) {
        auto it = data_.find(key);
        reply(encode_bytes(it == data_.end() ? std::string_view() : std::string_view(it->second)));
      }
      break;
    case Op::MultiSet:
      for (std::size_t i = 0; i < q.keys.size(); ++i) put(q.keys[i], q.values[i], out);
      break;
    case Op::CancelWait:
      // A wait woken before the cancel came already had its 0; the client reads both.
      disconnect_waits(conn);
      reply(encode_u8(kWaitCanceled));
      break;
    case Op::QueuePush:
      queues_[q.keys[0]].push_back(q.values[0]);
      bytes_ += q.values[0].size();
      wake(q.keys[0], out);
      break;
    case Op::QueuePop: {
      auto it = queues_.find(q.keys[0]);
      const std::size_t before = it == queues_.end() ? 0 : it->second.size();
      reply(encode_i64(static_cast<std::int64_t>(before)));
      if (before > 0) {
        reply(encode_bytes(it->second.front()));
        bytes_ -= it->second.front().size();
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case Op::QueueLen: {
      auto it = queues_.find(q.keys[0]);
      reply(encode_i64(static_cast<std::int64_t>(it == queues_.end() ? 0 : it->second.size())));
      break;
    }
    case Op::ListKeys: {
      std::string body = encode_i64(static_cast<std::int64_t>(data_.size()));
      for (const auto& [key, value] : data_) body += encode_bytes(key);
      reply(std::move(body));
      break;
    }
  }
  return out;
}

void StoreState::disconnect_waits(ConnId conn) {
  auto it = pending_.find(conn);
  if (it == pending_.end()) return;
  for (const auto& key : it->second) {
    parked_bytes_ -= 2 * entry_bytes(key);
    auto w = waiters_.find(key);
    if (w == waiters_.end()) continue;
    w->second.erase(conn);
    if (w->second.empty()) waiters_.erase(w);
  }
  pending_.erase(it);
}

void StoreState::disconnect(ConnId conn) {
  disconnect_waits(conn);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.erase(conn) > 0) parked_bytes_ -= entry_bytes(it->first);
    it = it->second.empty() ? watchers_.erase(it) : std::next(it);
  }
}

void StoreState::clear() {
  // Parked waits and watches stay: they belong to connections, which end with their workers.
  data_.clear();
  queues_.clear();
  bytes_ = 0;
}

void StoreState::put(const std::string& key, std::string value, Effects& out) {
  std::optional<std::string> old_value;
  auto it = data_.find(key);
  if (it != data_.end()) {
    old_value = std::move(it->second);
    bytes_ -= old_value->size();
    it->second = std::move(value);
  } else {
    bytes_ += key.size();
    it = data_.emplace(key, std::move(value)).first;
  }
  bytes_ += it->second.size();
  changed(key, old_value, out);
}

void StoreState::erase_key(std::map<std::string, std::string>::iterator it) {
  bytes_ -= it->first.size() + it->second.size();
  data_.erase(it);
}

bool StoreState::present(const std::string& key) const {
  if (data_.count(key) > 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::changed(const std::string& key, const std::optional<std::string>& old_value,
                         Effects& out) {
  wake(key, out);
  auto w = watchers_.find(key);
  if (w == watchers_.end()) return;
  const WatchEvent event = old_value ? WatchEvent::Updated : WatchEvent::Created;
  // One buffer for every watcher (a big value pushed to many watchers is held once).
  const SharedBytes push = std::make_shared<const std::string>(
      encode_watch_push(event, key, old_value.value_or(std::string()), data_.at(key)));
  for (ConnId c : w->second) out.sends.emplace_back(c, push);
}

void StoreState::wake(const std::string& key, Effects& out) {
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  const std::set<ConnId> conns = std::move(w->second);
  waiters_.erase(w);
  for (ConnId c : conns) {
    auto p = pending_.find(c);
    if (p == pending_.end()) continue;
    if (p->second.erase(key) > 0) parked_bytes_ -= 2 * entry_bytes(key);
    if (!p->second.empty()) continue;
    // The last missing key of c's WAIT appeared: it stops waiting.
    pending_.erase(p);
    out.send(c, encode_u8(kStopWaiting));
  }
}

}  // namespace ddprun::store
