// A streamed reply split into content and tool-call deltas as it is generated
// (attic/server/tool_call_stream.h).
#include "attic/server/tool_call_stream.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>

#include "server/json_stream.h"

namespace attic::server {

namespace {

using tokenizer::ChatTemplateKind;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr const char* kSpace = " \t\n\r";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The longest suffix of `text` (from `from`) that is a proper prefix of `marker`.
size_t PrefixHoldback(const std::string& text, size_t from, std::string_view marker) {
  const size_t avail = text.size() - from;
  for (size_t n = std::min(avail, marker.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, marker.data(), n) == 0) return n;
  return 0;
}

// A value given for "arguments" or "parameters": an object, or a string holding the JSON
// text of one (ReadCall in tool_calls.cc takes both); anything else is read to its end and
// does not count as arguments.
class ArgsValue {
 public:
  size_t Feed(std::string_view bytes) {
    size_t i = 0;
    if (kind_ == Kind::kUnknown) {
      while (i < bytes.size() && IsSpace(bytes[i])) ++i;
      if (i == bytes.size()) return i;
      if (bytes[i] == '"') {
        kind_ = Kind::kString;
        ++i;
      } else {
        kind_ = bytes[i] == '{' ? Kind::kObject : Kind::kOther;
      }
    }
    if (kind_ != Kind::kString) return i + outer_.Feed(bytes.substr(i));
    i += string_.Feed(bytes.substr(i));
    const std::string decoded = string_.TakeDecoded();
    size_t used = inner_.state() == JsonStream::State::kReading ? inner_.Feed(decoded) : 0;
    // nlohmann::json::parse of the string allows whitespace after the object, nothing else.
    if (decoded.find_first_not_of(kSpace, used) != std::string::npos) trailing_ = true;
    if (string_.closed()) inner_.End();
    return i;
  }

  // kError: the reply's JSON is broken (not merely arguments of the wrong kind).
  JsonStream::State state() const {
    if (kind_ == Kind::kUnknown) return JsonStream::State::kReading;
    if (kind_ != Kind::kString) return outer_.state();
    if (string_.error()) return JsonStream::State::kError;
    return string_.closed() ? JsonStream::State::kDone : JsonStream::State::kReading;
  }
  bool begun() const { return kind_ != Kind::kUnknown; }
  bool followable() const { return kind_ == Kind::kObject || kind_ == Kind::kString; }
  // Arguments ReadCall accepts.
  bool valid() const {
    if (kind_ == Kind::kObject) return outer_.state() == JsonStream::State::kDone;
    return kind_ == Kind::kString && string_.closed() && !string_.error() &&
           inner_.state() == JsonStream::State::kDone && !trailing_;
  }
  // What was written is what ReadCall will write (no object repeated a key).
  bool exact() const { return kind_ == Kind::kString ? !inner_.repeated_key() : !outer_.repeated_key(); }
  std::string TakeOutput() {
    if (kind_ == Kind::kString) return inner_.TakeOutput();
    std::string out = outer_.TakeOutput();
    return kind_ == Kind::kObject ? out : std::string();
  }

 private:
  enum class Kind { kUnknown, kObject, kString, kOther };
  Kind kind_ = Kind::kUnknown;
  JsonStream outer_;                      // kObject, kOther
  JsonStringReader string_;               // kString: the string
  JsonStream inner_{{.object_only = true, .allow_bom = true}};  // and the object it holds
  bool trailing_ = false;                 // kString: something after the object
};

}  // namespace

// Reads one unit's calls (a call object, or a non-empty array of them) as ReadCalls in
// tool_calls.cc reads them, and opens each call as soon as it may: a declared function's
// name has been read and its arguments have begun. Calls open in order; once a call
// cannot be followed (a name or arguments given twice, arguments of another kind, a
// repeated key), no later call of the unit is opened here: the unit's settlement
// (ToolCallStream::Settle) sends them.
class CallsReader {
 public:
  enum class State { kReading, kDone, kError };
  struct Event {
    bool open = false;  // true: `text` is the name of a new call; false: a piece of the last one's arguments
    std::string text;
  };

  explicit CallsReader(const ToolSpec* spec) : spec_(spec) {}

  // Reads bytes; returns how many were consumed (reading stops after the unit's last byte).
  size_t Feed(std::string_view bytes) {
    size_t i = 0;
    while (i < bytes.size() && state_ == State::kReading) {
      if (want_ == Want::kKeyString) {
        i += key_reader_.Feed(bytes.substr(i));
        if (key_reader_.error()) {
          state_ = State::kError;
          break;
        }
        key_ += key_reader_.TakeDecoded();
        if (key_reader_.closed()) want_ = Want::kColon;
        continue;
      }
      if (want_ == Want::kInValue) {
        i += FeedValue(bytes.substr(i));
        continue;
      }
      const char c = bytes[i];
      if (IsSpace(c)) {
        ++i;
        continue;
      }
      if (want_ == Want::kValue) {  // the value's reader reads c
        StartValue();
        continue;
      }
      ++i;
      if (!Structure(c)) state_ = State::kError;
    }
    return i;
  }

  State state() const { return state_; }
  // Done, and ReadCalls would read every call.
  bool valid() const { return state_ == State::kDone && !invalid_ && !calls_.empty(); }
  std::vector<Event> TakeEvents() {
    std::vector<Event> out;
    out.swap(events_);
    return out;
  }

 private:
  enum class Want { kStart, kFirstCall, kNextCall, kCall, kKeyOrClose, kKey, kKeyString, kColon, kValue, kInValue, kCommaOrClose };
  enum class Role { kName, kArguments, kParameters, kOther };
  struct Call {
    bool named = false;           // "name" given
    bool name_ok = false;         // the last "name" is a declared function's
    std::string name;
    bool has[2] = {false, false};  // "arguments", "parameters" given
    bool valid[2] = {false, false};  // ... and their last value is arguments ReadCall takes
    bool followed_begun = false;  // the first arguments value is an object or a string
    bool follow = true;           // what is sent is what ReadCall will give
    bool open = false;
    std::string text;             // the followed arguments so far (compact)
    size_t sent = 0;              // bytes of `text` sent
  };

  const ToolSpec* spec_;
  State state_ = State::kReading;
  Want want_ = Want::kStart;
  bool array_ = false;
  bool invalid_ = false;  // a call does not read: neither does the unit
  bool stalled_ = false;  // a call was not opened here: no later one is
  std::vector<Call> calls_;
  JsonStringReader key_reader_;
  std::string key_;
  Role role_ = Role::kOther;
  bool followed_ = false;  // the value being read is the followed arguments
  JsonStream value_;       // kName, kOther
  ArgsValue args_;         // kArguments, kParameters
  std::vector<Event> events_;

  bool Declared(const std::string& name) const {
    return std::any_of(spec_->tools.begin(), spec_->tools.end(), [&](const ToolSpec::Tool& t) { return t.name == name; });
  }

  bool Structure(char c) {
    switch (want_) {
      case Want::kStart:
        if (c == '[') {
          array_ = true;
          want_ = Want::kFirstCall;
          return true;
        }
        return c == '{' && BeginCall();
      case Want::kFirstCall:
        if (c == ']') {  // [] is no call
          invalid_ = true;
          state_ = State::kDone;
          return true;
        }
        return c == '{' && BeginCall();
      case Want::kCall:
        return c == '{' && BeginCall();
      case Want::kNextCall:
        if (c == ']') {
          state_ = State::kDone;
          return true;
        }
        if (c != ',') return false;
        want_ = Want::kCall;
        return true;
      case Want::kKeyOrClose:
        if (c == '}') return EndCall();
        [[fallthrough]];
      case Want::kKey:
        if (c != '"') return false;
        key_reader_ = JsonStringReader();
        key_.clear();
        want_ = Want::kKeyString;
        return true;
      case Want::kColon:
        if (c != ':') return false;
        want_ = Want::kValue;
        return true;
      case Want::kCommaOrClose:
        if (c == '}') return EndCall();
        if (c != ',') return false;
        want_ = Want::kKey;
        return true;
      default:
        return false;
    }
  }

  bool BeginCall() {
    calls_.emplace_back();
    want_ = Want::kKeyOrClose;
    return true;
  }

  void StartValue() {
    Call& call = calls_.back();
    role_ = key_ == "name" ? Role::kName : key_ == "arguments" ? Role::kArguments : key_ == "parameters" ? Role::kParameters : Role::kOther;
    followed_ = false;
    if (role_ == Role::kArguments || role_ == Role::kParameters) {
      args_ = ArgsValue();
      const bool first = !call.has[0] && !call.has[1];
      call.has[role_ == Role::kArguments ? 0 : 1] = true;
      if (first) {
        followed_ = true;
      } else {
        call.follow = false;  // the arguments given twice: which one counts is known at the end
      }
    } else {
      if (role_ == Role::kName && call.named) call.follow = false;  // named twice
      value_ = JsonStream();
    }
    want_ = Want::kInValue;
  }

  size_t FeedValue(std::string_view bytes) {
    Call& call = calls_.back();
    size_t used = 0;
    JsonStream::State st;
    if (role_ == Role::kArguments || role_ == Role::kParameters) {
      used = args_.Feed(bytes);
      st = args_.state();
      if (followed_) {
        call.text += args_.TakeOutput();
        if (args_.followable()) call.followed_begun = true;
        if ((args_.begun() && !args_.followable()) || !args_.exact()) call.follow = false;
        MaybeOpen();
        Send();
      }
    } else {
      used = value_.Feed(bytes);
      st = value_.state();
    }
    if (st == JsonStream::State::kError) {
      state_ = State::kError;
    } else if (st == JsonStream::State::kDone) {
      ValueEnded();
    }
    return used;
  }

  void ValueEnded() {
    Call& call = calls_.back();
    if (role_ == Role::kName) {
      const std::string text = value_.TakeOutput();  // compact JSON of the value
      const bool is_string = text[0] == '"';
      call.named = true;
      call.name = is_string ? nlohmann::json::parse(text).get<std::string>() : std::string();
      call.name_ok = is_string && Declared(call.name);
      MaybeOpen();
      Send();
    } else if (role_ == Role::kArguments || role_ == Role::kParameters) {
      call.valid[role_ == Role::kArguments ? 0 : 1] = args_.valid();
    }
    want_ = Want::kCommaOrClose;
  }

  // Opens the last call when it may be: the next to open, a declared function, its
  // followed arguments begun.
  void MaybeOpen() {
    Call& call = calls_.back();
    if (call.open || invalid_ || stalled_ || !call.follow || !call.name_ok || !call.followed_begun) return;
    call.open = true;
    events_.push_back({true, call.name});
  }

  void Send() {
    Call& call = calls_.back();
    if (!call.open || !call.follow || call.sent == call.text.size()) return;
    events_.push_back({false, call.text.substr(call.sent)});
    call.sent = call.text.size();
  }

  bool EndCall() {
    Call& call = calls_.back();
    const int key = call.has[0] ? 0 : call.has[1] ? 1 : -1;  // ReadCall: "arguments" before "parameters"
    const bool ok = call.name_ok && (key < 0 || call.valid[key]);
    if (!ok) {
      invalid_ = true;
    } else if (!invalid_ && !stalled_) {
      if (key < 0 && call.follow) {  // no arguments: {}
        call.text = "{}";
        call.followed_begun = true;
      }
      MaybeOpen();
      Send();
      if (!call.open || !call.follow) stalled_ = true;
    }
    if (array_) {
      want_ = Want::kNextCall;
    } else {
      state_ = State::kDone;
    }
    return true;
  }
};

ToolCallStream::ToolCallStream(ChatTemplateKind kind, const ToolSpec* spec, std::string id_base)
    : kind_(kind), spec_(spec), id_base_(std::move(id_base)) {
  if (spec_->forced()) {
    mode_ = Mode::kCalls;
    reader_ = std::make_unique<CallsReader>(spec_);
  } else if (kind_ != ChatTemplateKind::kLlama3 && kind_ != ChatTemplateKind::kMistral) {
    mode_ = Mode::kPlain;  // ChatML: content until a <tool_call>
  }
}

ToolCallStream::~ToolCallStream() = default;

std::vector<ToolStreamPiece> ToolCallStream::Push(std::string_view piece) {
  text_ += piece;
  Advance(/*end=*/false);
  std::vector<ToolStreamPiece> out;
  out.swap(out_);
  return out;
}

ToolCallStream::End ToolCallStream::Finish() {
  Advance(/*end=*/true);
  End end;
  end.output = ParseToolOutput(text_, kind_, *spec_);
  const bool hermes = !spec_->forced() && kind_ != ChatTemplateKind::kLlama3 && kind_ != ChatTemplateKind::kMistral;
  if (!hermes) Settle(end.output.calls);  // the reply is one unit: settled now
  // Content: what the whole-reply parse has beyond what was sent (held whitespace is
  // either in it or trimmed away).
  held_space_.clear();
  const std::string& content = end.output.content;
  if (content.compare(0, sent_content_.size(), sent_content_) == 0) {
    Content(std::string_view(content).substr(sent_content_.size()), /*hold_space=*/false);
  } else {
    exact_ = false;
  }
  if (calls_.size() != end.output.calls.size()) exact_ = false;
  for (size_t i = 0; i < std::min(calls_.size(), end.output.calls.size()); ++i)
    if (calls_[i].name != end.output.calls[i].name || calls_[i].arguments != end.output.calls[i].arguments) exact_ = false;
  NameToolCalls(kind_, id_base_, &end.output.calls);
  end.pieces.swap(out_);
  end.exact = exact_;
  return end;
}

void ToolCallStream::Advance(bool end) {
  for (;;) {
    const Mode mode = mode_;
    const size_t pos = pos_;
    switch (mode_) {
      case Mode::kStart: {
        const size_t first = text_.find_first_not_of(kSpace);
        if (first == std::string::npos) return;  // only whitespace so far
        const char c = text_[first];
        if (c == '{' || c == '[') {
          mode_ = Mode::kCalls;
          reader_ = std::make_unique<CallsReader>(spec_);
          pos_ = unit_start_ = first;
        } else if (kind_ == ChatTemplateKind::kLlama3 &&
                   text_.compare(first, std::min(kPythonTag.size(), text_.size() - first), kPythonTag.data(),
                                 std::min(kPythonTag.size(), text_.size() - first)) == 0) {
          if (text_.size() - first < kPythonTag.size()) return;  // may still become the tag
          mode_ = Mode::kTag;
          pos_ = first + kPythonTag.size();
        } else {
          mode_ = Mode::kPlain;
        }
        break;
      }
      case Mode::kTag:       // Llama-3: after <|python_tag|>
      case Mode::kMarked: {  // Mistral: after [TOOL_CALLS]
        const size_t first = text_.find_first_not_of(kSpace, pos_);
        if (first == std::string::npos) return;
        if (text_[first] == '{' || text_[first] == '[') {
          mode_ = Mode::kCalls;
          reader_ = std::make_unique<CallsReader>(spec_);
          pos_ = unit_start_ = first;
        } else {
          Fallback();
        }
        break;
      }
      case Mode::kCalls:
        AdvanceCalls();
        break;
      case Mode::kBetween: {  // Llama-3: calls separated by ';'
        const size_t next = text_.find_first_not_of(kSpace, pos_);
        if (next == std::string::npos) {
          pos_ = text_.size();
          return;
        }
        // The whole-reply parse splits at every ';': one inside a call breaks the split.
        if (text_[next] != ';' || std::count(text_.begin() + unit_start_, text_.begin() + next, ';') != separators_) {
          Fallback();  // no split of the reply reads: it is content
          break;
        }
        ++separators_;
        mode_ = Mode::kCalls;
        reader_ = std::make_unique<CallsReader>(spec_);
        pos_ = next + 1;
        break;
      }
      case Mode::kPlain:
        if (kind_ == ChatTemplateKind::kLlama3) {  // a reply that opened with text has no call
          Content(std::string_view(text_).substr(pos_), /*hold_space=*/false);
          pos_ = text_.size();
        } else if (kind_ == ChatTemplateKind::kMistral) {
          AdvancePlain(kMistralCalls, end);
          if (text_.compare(pos_, kMistralCalls.size(), kMistralCalls) == 0) {
            marked_ = true;
            marker_ = pos_;
            pos_ += kMistralCalls.size();
            mode_ = Mode::kMarked;
          }
        } else {
          AdvancePlain(kCallOpen, end);
          if (text_.compare(pos_, kCallOpen.size(), kCallOpen) == 0) {
            unit_start_ = pos_;
            pos_ += kCallOpen.size();
            body_start_ = pos_;
            mode_ = Mode::kBlock;
            reader_ = std::make_unique<CallsReader>(spec_);
          }
        }
        break;
      case Mode::kBlock:
        AdvanceBlock(end);
        break;
      case Mode::kAllContent:
        Content(std::string_view(text_).substr(pos_), /*hold_space=*/false);
        pos_ = text_.size();
        break;
      case Mode::kHeld:
        pos_ = text_.size();
        break;
    }
    if (mode_ == mode && pos_ == pos) return;
  }
}

void ToolCallStream::AdvancePlain(std::string_view marker, bool end) {
  const size_t at = text_.find(marker, pos_);
  const size_t to = at != std::string::npos ? at : end ? text_.size() : text_.size() - PrefixHoldback(text_, pos_, marker);
  Content(std::string_view(text_).substr(pos_, to - pos_), /*hold_space=*/true);
  pos_ = to;
}

void ToolCallStream::AdvanceBlock(bool end) {
  // The block ends at the first "</tool_call>", wherever it is (inside a JSON string too,
  // as the whole-reply parse reads it): what may begin one is not read yet.
  const size_t close = text_.find(kCallClose, pos_);
  const size_t to = close != std::string::npos ? close
                    : end                      ? text_.size()
                                               : text_.size() - PrefixHoldback(text_, pos_, kCallClose);
  FeedReader(to);
  pos_ = to;
  if (close != std::string::npos) {
    BlockEnded(close, close + kCallClose.size());
  } else if (end) {
    BlockEnded(text_.size(), text_.size());
  }
}

void ToolCallStream::BlockEnded(size_t body_end, size_t block_end) {
  std::vector<ToolCall> calls;
  const bool ok = ReadToolCallJson(text_.substr(body_start_, body_end - body_start_), *spec_, &calls);
  Settle(calls);
  if (!ok) Content(std::string_view(text_).substr(unit_start_, block_end - unit_start_), /*hold_space=*/true);
  pos_ = block_end;
  mode_ = Mode::kPlain;
}

void ToolCallStream::AdvanceCalls() {
  if (reader_->state() == CallsReader::State::kReading) pos_ += FeedReader(text_.size());
  const CallsReader::State st = reader_->state();
  if (st == CallsReader::State::kReading) return;
  // Not calls: the reader's verdict is the whole-reply parse's (its JSON is nlohmann's,
  // its calls ReadCall's), so the reply (Mistral: what comes before a marker) is content.
  // Calls already opened stay sent (End::exact is false).
  if (st == CallsReader::State::kError || !reader_->valid()) return Fallback();
  if (kind_ == ChatTemplateKind::kLlama3 && !spec_->forced()) {
    // The whole-reply parse splits calls at every ';': one inside a call breaks that.
    if (separators_ > 0 && std::count(text_.begin() + unit_start_, text_.begin() + pos_, ';') != separators_)
      return Fallback();
    mode_ = Mode::kBetween;
  } else {
    mode_ = Mode::kHeld;  // what follows the calls is read with the whole reply
  }
}

size_t ToolCallStream::FeedReader(size_t to) {
  size_t used = 0;
  if (reader_->state() == CallsReader::State::kReading && to > pos_)
    used = reader_->Feed(std::string_view(text_).substr(pos_, to - pos_));
  for (CallsReader::Event& e : reader_->TakeEvents()) {
    if (e.open) {
      Open(e.text);
    } else {
      Arguments(calls_.size() - 1, e.text);
    }
  }
  return used;
}

void ToolCallStream::Fallback() {
  reader_.reset();
  if (spec_->forced()) {
    pos_ = 0;  // a forced reply that is no call is content, all of it
    mode_ = Mode::kAllContent;
  } else if (kind_ == ChatTemplateKind::kMistral && marked_) {
    pos_ = marker_;  // the text before the marker was sent (or held as whitespace)
    mode_ = Mode::kAllContent;
  } else {
    pos_ = 0;  // nothing was sent yet: Llama-3's reply is content, Mistral's is up to a marker
    mode_ = Mode::kPlain;
  }
}

void ToolCallStream::Content(std::string_view s, bool hold_space) {
  std::string send;
  if (hold_space) {
    const size_t last = s.find_last_not_of(kSpace);
    if (last == std::string_view::npos) {
      held_space_ += s;
      return;
    }
    send = held_space_ + std::string(s.substr(0, last + 1));
    held_space_ = std::string(s.substr(last + 1));
  } else {
    send = held_space_ + std::string(s);
    held_space_.clear();
  }
  if (send.empty()) return;
  sent_content_ += send;
  if (!out_.empty() && out_.back().call < 0) {
    out_.back().text += send;
  } else {
    out_.push_back({-1, std::move(send), "", ""});
  }
}

void ToolCallStream::Open(const std::string& name) {
  const int index = static_cast<int>(calls_.size());
  calls_.push_back({name, ""});
  out_.push_back({index, "", ToolCallId(kind_, id_base_, index), name});
}

void ToolCallStream::Arguments(size_t index, std::string_view piece) {
  if (piece.empty()) return;
  calls_[index].arguments += piece;
  if (!out_.empty() && out_.back().call == static_cast<int>(index) && out_.back().id.empty()) {
    out_.back().text += piece;
  } else {
    out_.push_back({static_cast<int>(index), std::string(piece), "", ""});
  }
}

void ToolCallStream::Settle(const std::vector<ToolCall>& calls) {
  const size_t streamed = calls_.size() - unit_first_call_;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i >= streamed) {
      Open(calls[i].name);
      Arguments(calls_.size() - 1, calls[i].arguments);
      continue;
    }
    const Sent& s = calls_[unit_first_call_ + i];
    if (s.name != calls[i].name || calls[i].arguments.compare(0, s.arguments.size(), s.arguments) != 0) {
      exact_ = false;  // opened, and then the reply said otherwise
      continue;
    }
    Arguments(unit_first_call_ + i, std::string_view(calls[i].arguments).substr(s.arguments.size()));
  }
  if (streamed > calls.size()) exact_ = false;  // opened calls that did not read
  unit_first_call_ = calls_.size();
  reader_.reset();
}

}  // namespace attic::server
