// A short most-recently-used-last list of owned entries, each with a `key` member: the graph
// caches (training step slots, inference forward graphs) keep one entry per input shape.
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace libreyolo {

// The entry with this key, moved to the back (most recent); nullptr when there is none.
template <class Entry, class Key>
Entry* lru_touch(std::vector<std::unique_ptr<Entry>>& entries, const Key& key) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i]->key != key) continue;
    const auto at = entries.begin() + static_cast<std::ptrdiff_t>(i);
    std::rotate(at, at + 1, entries.end());
    return entries.back().get();
  }
  return nullptr;
}

// Drops the least recently used entry while there are `capacity` or more, calling
// before_drop(entry) first (e.g. to wait for queued work that may still use it).
template <class Entry, class BeforeDrop>
void lru_make_room(std::vector<std::unique_ptr<Entry>>& entries, size_t capacity, BeforeDrop before_drop) {
  while (!entries.empty() && entries.size() >= capacity) {
    before_drop(*entries.front());
    entries.erase(entries.begin());
  }
}

}  // namespace libreyolo
