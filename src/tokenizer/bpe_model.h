// The BPE model: a vocabulary plus a table of merges (pair of token ids -> merged id
// and rank), applied to one pre-tokenized piece at a time, lowest rank first and, for
// equal ranks, leftmost first (the order of HF tokenizers' BPE and of llama.cpp).
//
// Pieces are split into initial symbols either per UTF-8 character (SentencePiece
// style: "▁" is part of the text, unknown characters fall back to <0xNN> byte tokens
// or to <unk>) or per byte (byte-level BPE: the vocabulary is keyed by raw bytes, the
// GPT-2 byte<->unicode map having been undone at load time).
//
// The merge loop keeps the symbols in a doubly linked list and the candidate pairs in
// a priority queue with lazy invalidation, so a piece of n symbols costs O(n log n)
// rather than the O(n^2) of rescanning for the best pair after every merge.
//
// Thread-safety: immutable after construction; Encode is const and reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attic::tokenizer {

// Hash for heterogeneous (std::string_view) lookups in maps keyed by std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// The byte a SentencePiece byte-fallback token "<0xNN>" stands for, or -1.
int ParseByteToken(std::string_view text);
// "<0xNN>" for byte b (upper-case hex, as SentencePiece writes it).
std::string ByteTokenText(uint8_t b);

class BpeModel {
 public:
  enum class SymbolUnit { kUtf8Char, kByte };

  struct Options {
    SymbolUnit unit = SymbolUnit::kUtf8Char;
    bool byte_fallback = false;  // unknown characters -> <0xNN> tokens (kUtf8Char only)
    bool fuse_unk = false;       // consecutive unknowns -> one <unk>
    bool ignore_merges = false;  // a piece that is itself a token is emitted whole (Llama-3)
    int32_t unk_id = -1;
  };

  // `keys[id]` is the byte string a token stands for in the text the model sees
  // (SentencePiece: the piece text with "▁"; byte-level: raw bytes). Tokens that must
  // never come out of merging (special/control tokens) get an empty key.
  // `byte_token_ids[b]` is the token for byte b (byte-level: the single-byte token;
  // SentencePiece: <0xNN>), -1 where there is none.
  BpeModel(std::vector<std::string> keys, const std::vector<int32_t>& byte_token_ids, Options opts);

  // Registers merge (left, right) -> merged with priority `rank` (lower merges first).
  // A pair already registered keeps its lower rank.
  void AddMerge(int32_t left, int32_t right, int32_t merged, int32_t rank);
  size_t num_merges() const { return merges_.size(); }

  // True if no merge can yield a token in which `marker` follows something other than
  // `marker` (e.g. SentencePiece vocabularies: "▁" only starts a piece). Then a piece
  // may be cut before every run of markers without changing the result, since no
  // merge can join across such a cut.
  bool MarkerOnlyLeads(std::string_view marker) const;

  // Id of the token whose key is exactly `key`, or -1.
  int32_t KeyToId(std::string_view key) const;

  // Reusable buffers for Encode (one per calling thread / call).
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;
      int32_t left;
      int32_t right;
      int32_t merged;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the token ids of `piece` to `out`. REQUIRES: `piece` is valid UTF-8 when
  // the unit is kUtf8Char.
  void Encode(std::string_view piece, std::vector<int32_t>* out, Scratch* scratch) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void InitialSymbols(std::string_view piece, std::vector<Scratch::Symbol>* symbols) const;
  void PushUnknown(std::vector<Scratch::Symbol>* symbols) const;

  std::vector<std::string> keys_;
  StringIdMap key_to_id_;
  int32_t byte_ids_[256];
  int32_t ascii_ids_[128];  // id of the one-character key, kUtf8Char fast path
  bool all_bytes_ = false;  // every byte has a token (byte fallback possible)
  Options opts_;
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace attic::tokenizer
