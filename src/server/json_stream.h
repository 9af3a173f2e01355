// Internal: JSON read as it arrives, a piece at a time, and written back the way
// nlohmann::ordered_json's dump(-1) writes the parsed value (compact, strings re-escaped,
// numbers in nlohmann's form). Streamed tool calls (tool_call_stream.cc) send a call's
// arguments with it while the model is still writing them, and need every byte sent to be
// a byte of what the whole-reply parse (tool_calls.cc: parse, then dump) will give.
//
// Contract: the output so far is a prefix of dump(parse(input)) for every continuation of
// the input that parses -- unless an object repeats a key (repeated_key(): nlohmann keeps
// the last value at the first key's place, which no prefix can know). The reader accepts
// exactly what nlohmann::json::parse accepts: strings are decoded by nlohmann itself, unit
// by unit (an ASCII byte, a UTF-8 sequence, an escape, a surrogate pair), numbers token by
// token; the structure is JSON's grammar. An error is reported as soon as no continuation
// can parse.
//
// Thread-safety: none; one reader per stream.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace attic::server {

// The body of a JSON string after its opening quote: finds the closing quote and decodes
// the complete units read so far.
class JsonStringReader {
 public:
  // Reads bytes; returns how many were consumed (it stops after the closing quote).
  size_t Feed(std::string_view bytes);
  bool closed() const { return closed_; }
  bool error() const { return error_; }
  // The decoded (UTF-8) bytes of the units completed since the last call; once closed,
  // all of them.
  std::string TakeDecoded();

 private:
  std::string raw_;      // bytes read, not decoded yet (at most one incomplete unit once decoded)
  std::string decoded_;  // decoded, not taken yet
  bool escape_ = false;  // the last byte opened an escape
  bool closed_ = false;
  bool error_ = false;

  void Decode();
};

// True when `text` holds a NUL byte. nlohmann::json::parse reads a NUL as the end of its
// input: it accepts "{}\0anything" and drops what follows. JSON text never holds a NUL
// (RFC 8259: it is not whitespace, and a control character inside a string must be
// escaped), so a parse of untrusted text refuses such text first. (JsonStream reads a NUL
// as it reads any other byte JSON does not allow there.)
inline bool HasNulByte(std::string_view text) { return text.find('\0') != std::string_view::npos; }

// The escaped body of `decoded` as nlohmann writes a string (no quotes around it).
std::string JsonEscape(std::string_view decoded);

// One JSON value, with leading whitespace.
class JsonStream {
 public:
  enum class State { kReading, kDone, kError };
  struct Options {
    bool object_only = false;  // the value must be an object
    bool allow_bom = false;    // a UTF-8 byte-order mark may open the input (nlohmann skips it)
  };
  JsonStream() = default;
  explicit JsonStream(Options options) : options_(options) {}

  // Reads bytes; returns how many were consumed. Reading stops when the value ends: after
  // the closing quote or bracket, the last letter of a literal, or -- a number -- before
  // the first byte that cannot continue it (not consumed).
  size_t Feed(std::string_view bytes);
  // The input ended (a number at the end is complete; anything unfinished is an error).
  void End();

  State state() const { return state_; }
  bool started() const { return started_; }  // a byte other than whitespace was read
  bool repeated_key() const { return repeated_key_; }
  // The compact text written since the last call.
  std::string TakeOutput();

 private:
  enum class Want { kValue, kValueOrClose, kKeyOrClose, kKey, kColon, kCommaOrClose };
  enum class Token { kNone, kString, kKey, kNumber, kLiteral };
  struct Frame {
    bool object = false;
    std::set<std::string> keys;  // an object's keys so far
  };

  Options options_;
  State state_ = State::kReading;
  Want want_ = Want::kValue;
  Token token_ = Token::kNone;
  std::vector<Frame> stack_;
  JsonStringReader string_;
  std::string word_;  // a number or literal so far; a key's decoded bytes
  std::string out_;
  size_t bom_ = 0;          // bytes of a byte-order mark read
  bool any_byte_ = false;   // a byte was read between tokens (the first is where a mark may be)
  bool started_ = false;
  bool repeated_key_ = false;

  bool Start(char c);  // a byte where a token may start; false: an error
  void ValueEnded();
  void Close();
  void EndNumber();
  void Fail() { state_ = State::kError; }
};

}  // namespace attic::server
