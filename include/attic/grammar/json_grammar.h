// Constrained decoding for JSON: a JSON Schema (the subset in docs/serving.md,
// "Structured outputs") compiled to a byte-level pushdown matcher, and the token masks it
// implies over a BPE vocabulary.
//
//   Grammar     the compiled schema (a graph of nodes; $ref may recurse). Immutable, and
//               shared by every request that sends the same schema.
//   Matcher     one request's position in the grammar: a stack of frames, fed one byte at
//               a time. It accepts compact JSON only (no whitespace outside strings), object
//               properties in the schema's order, and strings without characters outside
//               the Basic Multilingual Plane (so that a length is the same in code points
//               and in UTF-16 units).
//   Vocabulary  the tokenizer's token bytes in a trie (byte-level and byte-fallback tokens
//               as their raw bytes; special tokens never allowed).
//   JsonProcessor  an engine::LogitsProcessor: at each step the tokens whose bytes the
//               matcher accepts (a depth-first walk of the trie, cut where a byte is
//               refused), cached per matcher state; and a budget rule that makes the
//               output finish within the tokens left: a token is allowed only when what
//               it leaves can still be completed in the tokens that remain (every byte a
//               token of its own at worst).
//
// Thread-safety: Grammar and Vocabulary are immutable after construction; a Grammar's
// mask cache is guarded by a mutex. A Matcher or JsonProcessor belongs to one request.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bitset>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "attic/core/status.h"
#include "attic/engine/logits_processor.h"
#include "attic/tokenizer/tokenizer.h"

namespace attic::grammar {

// Generation limits that keep every value finite whatever the model does (they narrow
// what is valid, never widen it): digits of a number's integer and fraction parts, the
// exponent's digits, and the nesting depth of schema-less values (json_object).
inline constexpr int kMaxIntDigits = 15;
inline constexpr int kMaxFracDigits = 15;
inline constexpr int kMaxExpDigits = 2;  // |exponent| <= 99: every number is a finite double
inline constexpr int kMaxAnyDepth = 16;

class Grammar {
 public:
  // InvalidArgument naming the keyword and where it is ("#/properties/a/pattern").
  static StatusOr<std::shared_ptr<const Grammar>> FromJsonSchema(const nlohmann::json& schema);
  // The same, keeping the order in which the schema lists properties (they are written
  // in that order).
  static StatusOr<std::shared_ptr<const Grammar>> FromOrderedJsonSchema(const nlohmann::ordered_json& schema);
  // FromOrderedJsonSchema, shared: requests that send the same schema get the same
  // Grammar (and so its mask cache). At most kMaxSharedGrammars are kept.
  static constexpr size_t kMaxSharedGrammars = 64;
  static StatusOr<std::shared_ptr<const Grammar>> Shared(const nlohmann::ordered_json& schema);
  // Any JSON object (response_format json_object).
  static std::shared_ptr<const Grammar> AnyObject();
  // Tool calls (tools with tool_choice "required" or a named function): a call is
  // {"name":<one of the functions' names>,"<args_key>":<that function's parameters>},
  // the arguments following the schema of the function the name chose; with `array`,
  // [call,call,...] (at least one). Each `parameters` must be an object schema of the
  // subset; an error names the function by its index ("functions[1]: ..."). Shared like
  // Shared(): requests that send the same tools get the same Grammar.
  struct Function {
    std::string name;
    nlohmann::ordered_json parameters;
  };
  static StatusOr<std::shared_ptr<const Grammar>> ToolCalls(const std::vector<Function>& functions,
                                                            const std::string& args_key, bool array);

  struct Node;
  const Node& node(int id) const;  // defined below Node (vector<Node>'s operator[] needs it whole)
  int root() const { return root_; }
  // The fewest bytes of a value of node `id` (cached per node; a kSwitch: its largest
  // alternative's, see MinBytes).
  int min_bytes(int id) const { return min_bytes_[id]; }
  // The bytes a value of node `id` may start with.
  const std::bitset<256>& first_bytes(int id) const { return first_[id]; }
  // A string node without limits (the keys of a map).
  int plain_string() const { return plain_string_; }

  // Masks already computed, by matcher state, each with the most bytes that any token it
  // allows leaves to write (bounded; cleared when full).
  static constexpr size_t kMaxCachedMasks = 8192;
  struct MaskCache {
    std::mutex mu;
    std::unordered_map<std::string, std::pair<std::shared_ptr<const std::vector<uint32_t>>, int64_t>> masks;
    const void* vocab = nullptr;  // the Vocabulary the masks are of
  };
  MaskCache& cache() const { return cache_; }

  // The compiled form (json_grammar.cc builds it).
  std::vector<Node> nodes_;
  int root_ = 0;
  int plain_string_ = -1;
  std::vector<int> min_bytes_;
  std::vector<std::bitset<256>> first_;

 private:
  mutable MaskCache cache_;
};

struct Grammar::Node {
  // kSwitch: the value of an object property chosen by the literal written last in the
  // same object (alternatives[i] after literal i: a tool call's arguments by its name).
  enum class Kind { kObject, kArray, kString, kLiterals, kNumber, kAnyOf, kAny, kSwitch };
  Kind kind = Kind::kAny;
  // kObject: properties in order, their keys as JSON text ("\"name\""), whether required.
  struct Property {
    std::string key;
    int value = -1;
    bool required = true;
  };
  std::vector<Property> properties;
  bool any_keys = false;  // kAny's object: keys are any string, values any value
  // kArray
  int items = -1;
  int64_t min_items = 0, max_items = INT64_MAX;
  // kString
  int64_t min_length = 0, max_length = INT64_MAX;
  // kLiterals: the JSON texts allowed (enum, const, true/false, null)
  std::vector<std::string> literals;
  // kNumber. With bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) the
  // integer part w >= 0 of a value, by sign, is in `valid` (the value is w itself) or in
  // `frac` (w followed by any fraction is in bounds); no exponent then.
  bool integer = false;
  bool bounded = false;
  struct Range {
    int64_t lo = 0, hi = -1;  // empty when lo > hi
    bool has(int64_t w) const { return w >= lo && w <= hi; }
    bool meets(int64_t a, int64_t b) const { return std::max(a, lo) <= std::min(b, hi); }
  };
  Range valid[2], frac[2];  // [0] positive, [1] negative
  // kAnyOf: alternatives, each chosen by the first byte of the value (disjoint sets).
  std::vector<int> alternatives;
  int depth = 0;  // kAny: nesting depth
};

inline const Grammar::Node& Grammar::node(int id) const { return nodes_[id]; }

class Matcher {
 public:
  explicit Matcher(const Grammar* g);  // g outlives the matcher
  // Feeds one byte; false if it is refused (the state is then unspecified: feed a copy
  // to probe).
  bool Feed(uint8_t byte);
  // A whole value was matched: nothing more may follow.
  bool Complete() const { return stack_.empty(); }
  // The fewest bytes that complete the value from here.
  int64_t MinBytesLeft() const;
  // The state as bytes (the mask cache's key).
  std::string Key() const;

  struct Frame {
    int32_t node;
    int32_t phase;
    int64_t a;  // per kind: a count, a property index, ...
    int64_t e;  // a number's integer part so far
    int32_t b;
    int32_t c;
    int32_t d;
    int32_t pad;  // zero: frames are compared as bytes
  };

 private:
  enum class Step { kConsumed, kReject, kPopRetry, kPushRetry, kPopConsumed, kReplaceRetry };
  Step StepFrame(Frame& f, uint8_t byte, int* push) const;
  // `literal`: the index of the literal the finished child wrote (-1: not a literal).
  void ChildDone(int literal);
  // The literal a finished kLiterals frame wrote (-1 for other frames).
  int LiteralWritten(const Frame& f) const;
  static Frame NewFrame(int node) { return Frame{node, 0, 0, 0, 0, 0, 0, 0}; }

  const Grammar* g_;
  std::vector<Frame> stack_;
};

class Vocabulary {
 public:
  // The tokenizer's tokens as bytes; special tokens and empty ones are never allowed.
  explicit Vocabulary(const tokenizer::Tokenizer& tok);
  int size() const { return vocab_; }
  // Whether every byte value has a one-byte token (the budget rule's assumption).
  bool has_every_byte() const { return every_byte_; }

  // Trie: node 0 is the root; children by first_child / next_sibling.
  struct TrieNode {
    uint8_t byte = 0;
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    int32_t first_token = -1;  // tokens ending here: tokens_[first_token .. + n_tokens)
    int32_t n_tokens = 0;
  };
  std::vector<TrieNode> trie_;
  std::vector<int32_t> tokens_;
  std::vector<std::string> bytes_;  // by token id ("" = never allowed)

 private:
  int vocab_ = 0;
  bool every_byte_ = false;
};

// The LogitsProcessor of a response_format request. budget: the most tokens the request
// may generate (max_tokens, capped by the context left).
class JsonProcessor : public engine::LogitsProcessor {
 public:
  JsonProcessor(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocabulary> vocab, int64_t budget);
  void Apply(float* logits, int vocab) override;
  void Accept(int32_t token) override;
  bool Complete() const override { return matcher_.Complete(); }

  // The allowed tokens now (bit i of word i/32), for tests and the benchmark.
  std::shared_ptr<const std::vector<uint32_t>> Mask();

 private:
  // budget < 0: none; else allow only tokens leaving at most that many bytes to write.
  std::shared_ptr<const std::vector<uint32_t>> Compute(int64_t budget, int64_t* max_left) const;

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const Vocabulary> vocab_;
  Matcher matcher_;
  int64_t left_;  // tokens that may still be generated
};

}  // namespace attic::grammar
