#include "tokenizer/bpe_model.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace attic::tokenizer {

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

std::string ByteTokenText(uint8_t b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

BpeModel::BpeModel(std::vector<std::string> keys, const std::vector<int32_t>& byte_token_ids,
                   Options opts)
    : keys_(std::move(keys)), opts_(opts) {
  key_to_id_.reserve(keys_.size() * 2);
  for (size_t id = 0; id < keys_.size(); ++id) {
    if (keys_[id].empty()) continue;
    key_to_id_.emplace(keys_[id], static_cast<int32_t>(id));  // first id wins on duplicates
  }
  all_bytes_ = byte_token_ids.size() == 256;
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = b < static_cast<int>(byte_token_ids.size()) ? byte_token_ids[b] : -1;
    if (byte_ids_[b] < 0) all_bytes_ = false;
  }
  for (int c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    ascii_ids_[c] = KeyToId(std::string_view(&ch, 1));
  }
}

void BpeModel::AddMerge(int32_t left, int32_t right, int32_t merged, int32_t rank) {
  auto [it, inserted] = merges_.try_emplace(PairKey(left, right), Merge{rank, merged});
  if (!inserted && rank < it->second.rank) it->second = Merge{rank, merged};
}

bool BpeModel::MarkerOnlyLeads(std::string_view marker) const {
  if (marker.empty()) return false;
  for (const auto& [pair, merge] : merges_) {
    std::string_view k = keys_[merge.merged];
    while (k.substr(0, marker.size()) == marker) k.remove_prefix(marker.size());
    if (k.find(marker) != std::string_view::npos) return false;
  }
  return true;
}

int32_t BpeModel::KeyToId(std::string_view key) const {
  auto it = key_to_id_.find(key);
  return it == key_to_id_.end() ? -1 : it->second;
}

void BpeModel::PushUnknown(std::vector<Scratch::Symbol>* symbols) const {
  if (opts_.unk_id < 0) return;  // no <unk>: the character is dropped
  if (opts_.fuse_unk && !symbols->empty() && symbols->back().id == opts_.unk_id) return;
  symbols->push_back({opts_.unk_id, 0, 0});
}

void BpeModel::InitialSymbols(std::string_view piece, std::vector<Scratch::Symbol>* symbols) const {
  symbols->clear();
  if (opts_.unit == SymbolUnit::kByte) {
    for (char ch : piece) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(ch)];
      if (id >= 0) {
        symbols->push_back({id, 0, 0});
      } else {
        PushUnknown(symbols);
      }
    }
    return;
  }
  size_t pos = 0;
  while (pos < piece.size()) {
    const uint8_t lead = static_cast<uint8_t>(piece[pos]);
    const size_t len = std::min<size_t>(Utf8SeqLen(lead), piece.size() - pos);
    const int32_t id = lead < 0x80 ? ascii_ids_[lead] : KeyToId(piece.substr(pos, len));
    if (id >= 0) {
      symbols->push_back({id, 0, 0});
    } else if (opts_.byte_fallback && all_bytes_) {
      for (size_t i = 0; i < len; ++i) {
        symbols->push_back({byte_ids_[static_cast<uint8_t>(piece[pos + i])], 0, 0});
      }
    } else {
      PushUnknown(symbols);
    }
    pos += len;
  }
}

void BpeModel::Encode(std::string_view piece, std::vector<int32_t>* out, Scratch* scratch) const {
  if (piece.empty()) return;
  if (opts_.ignore_merges) {
    const int32_t whole = KeyToId(piece);
    if (whole >= 0) {
      out->push_back(whole);
      return;
    }
  }
  auto& sym = scratch->symbols;
  InitialSymbols(piece, &sym);
  const int32_t n = static_cast<int32_t>(sym.size());
  if (n <= 1) {
    if (n == 1) out->push_back(sym[0].id);
    return;
  }
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }

  // Min-heap on (rank, pos).
  auto& heap = scratch->heap;
  heap.clear();
  const auto later = [](const Scratch::Candidate& a, const Scratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push_pair = [&](int32_t left_pos) {
    if (left_pos < 0) return;
    const int32_t right_pos = sym[left_pos].next;
    if (right_pos < 0) return;
    auto it = merges_.find(PairKey(sym[left_pos].id, sym[right_pos].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left_pos, sym[left_pos].id, sym[right_pos].id, it->second.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    // Stale candidates: the left symbol was merged away or changed, or its right
    // neighbour is no longer the token the candidate was made for.
    Scratch::Symbol& left = sym[c.pos];
    if (left.id != c.left || left.next < 0) continue;
    Scratch::Symbol& right = sym[left.next];
    if (right.id != c.right) continue;
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    push_pair(left.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace attic::tokenizer
