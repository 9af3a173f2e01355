// JSON read as it arrives and written back as nlohmann writes it (json_stream.h).
#include "server/json_stream.h"

#include <nlohmann/json.hpp>

namespace attic::server {

namespace {

using ojson = nlohmann::ordered_json;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsNumberByte(char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

int HexValue(std::string_view hex) {
  int v = 0;
  for (char c : hex) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}

// The length of the unit of raw string bytes that starts at raw[i], or 0 when more bytes
// are needed to know it. A unit that is invalid (nlohmann refuses it) is still a unit: it
// is decoded, and refused, as soon as it is whole.
size_t UnitLength(std::string_view raw, size_t i) {
  const size_t n = raw.size() - i;
  const unsigned char c = static_cast<unsigned char>(raw[i]);
  if (c == '\\') {
    if (n < 2) return 0;
    if (raw[i + 1] != 'u') return 2;
    if (n < 6) return 0;
    const int code = HexValue(raw.substr(i + 2, 4));
    if (code < 0xD800 || code > 0xDBFF) return 6;  // not hex (refused), or not a high surrogate
    // A high surrogate is only valid with the low one after it: one unit of 12 bytes.
    if (n < 7) return 0;
    if (raw[i + 6] != '\\') return 6;
    if (n < 8) return 0;
    if (raw[i + 7] != 'u') return 6;
    return n < 12 ? 0 : 12;
  }
  size_t len = 1;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) len = 3;
  else if (c >= 0xF0 && c <= 0xF4) len = 4;
  return n < len ? 0 : len;
}

}  // namespace

std::string JsonEscape(std::string_view decoded) {
  const std::string quoted = ojson(std::string(decoded)).dump(-1, ' ', false, ojson::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

size_t JsonStringReader::Feed(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size() && !closed_) {
    const char c = bytes[i++];
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      closed_ = true;
      break;
    }
    raw_ += c;
  }
  if (!error_) Decode();
  return i;
}

void JsonStringReader::Decode() {
  size_t whole = raw_.size();
  if (!closed_) {  // up to the last complete unit
    size_t at = 0;
    while (at < raw_.size()) {
      const size_t len = UnitLength(raw_, at);
      if (len == 0) break;
      at += len;
    }
    whole = at;
  }
  if (whole == 0) return;
  try {
    decoded_ += ojson::parse("\"" + raw_.substr(0, whole) + "\"").get<std::string>();
  } catch (const std::exception&) {
    error_ = true;
    return;
  }
  raw_.erase(0, whole);
}

std::string JsonStringReader::TakeDecoded() {
  std::string out;
  out.swap(decoded_);
  return out;
}

std::string JsonStream::TakeOutput() {
  std::string out;
  out.swap(out_);
  return out;
}

size_t JsonStream::Feed(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size() && state_ == State::kReading) {
    if (token_ == Token::kString || token_ == Token::kKey) {
      i += string_.Feed(bytes.substr(i));
      if (string_.error()) {
        Fail();
        return i;
      }
      const std::string decoded = string_.TakeDecoded();
      if (token_ == Token::kString) {
        out_ += JsonEscape(decoded);
        if (string_.closed()) {
          out_ += '"';
          token_ = Token::kNone;
          ValueEnded();
        }
      } else {
        word_ += decoded;
        if (string_.closed()) {
          if (!stack_.back().keys.insert(word_).second) repeated_key_ = true;
          out_ += '"' + JsonEscape(word_) + "\":";
          token_ = Token::kNone;
          want_ = Want::kColon;
        }
      }
      continue;
    }
    const char c = bytes[i];
    if (token_ == Token::kNumber) {
      if (IsNumberByte(c)) {
        word_ += c;
        ++i;
      } else {
        EndNumber();  // c is read again, after the number
      }
      continue;
    }
    if (token_ == Token::kLiteral) {
      word_ += c;
      ++i;
      const std::string_view literal = word_[0] == 't' ? "true" : word_[0] == 'f' ? "false" : "null";
      if (literal.substr(0, word_.size()) != word_) {
        Fail();
        return i;
      }
      if (word_.size() == literal.size()) {
        out_ += word_;
        token_ = Token::kNone;
        ValueEnded();
      }
      continue;
    }
    ++i;
    // nlohmann skips a byte-order mark only as the input's first three bytes.
    const bool first = !any_byte_;
    any_byte_ = true;
    if (options_.allow_bom && ((bom_ > 0 && bom_ < 3) || (first && c == '\xEF'))) {
      static constexpr char kBom[] = "\xEF\xBB\xBF";
      if (c != kBom[bom_]) {
        Fail();
        return i;
      }
      ++bom_;
      continue;
    }
    if (IsSpace(c)) continue;
    started_ = true;
    if (!Start(c)) {
      Fail();
      return i;
    }
  }
  return i;
}

bool JsonStream::Start(char c) {
  switch (want_) {
    case Want::kColon:
      if (c != ':') return false;
      want_ = Want::kValue;  // the colon was written with the key
      return true;
    case Want::kCommaOrClose:
      if (c == ',') {
        out_ += ',';
        want_ = stack_.back().object ? Want::kKey : Want::kValue;
        return true;
      }
      if (c != (stack_.back().object ? '}' : ']')) return false;
      Close();
      return true;
    case Want::kKeyOrClose:
      if (c == '}') {
        Close();
        return true;
      }
      [[fallthrough]];
    case Want::kKey:
      if (c != '"') return false;
      token_ = Token::kKey;
      string_ = JsonStringReader();
      word_.clear();
      return true;
    case Want::kValueOrClose:
      if (c == ']') {
        Close();
        return true;
      }
      [[fallthrough]];
    case Want::kValue:
      if (options_.object_only && stack_.empty() && c != '{') return false;
      if (c == '{' || c == '[') {
        stack_.push_back(Frame{c == '{', {}});
        out_ += c;
        want_ = c == '{' ? Want::kKeyOrClose : Want::kValueOrClose;
      } else if (c == '"') {
        token_ = Token::kString;
        string_ = JsonStringReader();
        out_ += '"';
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        token_ = Token::kNumber;
        word_.assign(1, c);
      } else if (c == 't' || c == 'f' || c == 'n') {
        token_ = Token::kLiteral;
        word_.assign(1, c);
      } else {
        return false;
      }
      return true;
  }
  return false;
}

void JsonStream::Close() {
  out_ += stack_.back().object ? '}' : ']';
  stack_.pop_back();
  ValueEnded();
}

void JsonStream::ValueEnded() {
  if (stack_.empty()) {
    state_ = State::kDone;
  } else {
    want_ = Want::kCommaOrClose;
  }
}

void JsonStream::EndNumber() {
  token_ = Token::kNone;
  try {
    const ojson v = ojson::parse(word_);
    if (!v.is_number()) return Fail();
    out_ += v.dump();
  } catch (const std::exception&) {
    return Fail();
  }
  ValueEnded();
}

void JsonStream::End() {
  if (state_ != State::kReading) return;
  if (token_ == Token::kNumber) EndNumber();
  if (state_ == State::kReading) Fail();
}

}  // namespace attic::server
