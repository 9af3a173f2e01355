// A streamed chat reply with tools, split while it is generated into content and tool
// calls whose arguments go out piece by piece -- OpenAI's streaming shape: a call's first
// delta carries its index, id, name and arguments "", the next ones pieces of its
// arguments.
//
// How it decides (per template family, as ParseToolOutput reads a whole reply):
//   * Content that cannot belong to a call goes out at once. Held back only: what may
//     begin a call marker (ChatML "<tool_call>", Mistral "[TOOL_CALLS]", Llama-3
//     "<|python_tag|>"), whitespace at the end of content (the whole-reply parse trims
//     it when calls follow), a Llama-3 or Mistral reply that opens with '{' or '[' until
//     it is known not to be a call, and a forced reply (it is the call).
//   * A call opens (its first delta) once its function is known to be one the request
//     declared and its arguments have begun; its arguments follow as the model writes
//     them, re-written compact as the whole-reply parse writes them (json_stream.h), so
//     the pieces concatenate to the non-streamed `arguments`.
//   * Each unit the whole-reply parse reads as a whole (a ChatML <tool_call> block when
//     its closing tag arrives; otherwise the reply at its end) is then read by that very
//     parse, which settles it: what the stream had not sent yet is sent (a call the
//     stream could not follow -- arguments given twice, keys repeated -- is sent whole),
//     a block that is not a call becomes content.
// So content is never sent that later turns out to be part of a call, and when the reply's
// calls all read, the stream carries exactly the non-streamed content and calls. A call
// the stream has opened can still fail to read (cut short by max_tokens, broken JSON, a
// Llama-3 call followed by text): its pieces stay sent, the reply's text is then content
// as in the non-streamed response, and End::exact is false.
//
// Thread-safety: none; one stream per request.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attic/server/tool_calls.h"

namespace attic::server {

class CallsReader;  // tool_call_stream.cc

// One delta the server can send now.
struct ToolStreamPiece {
  int call = -1;          // -1: `text` is content; else the index of the call it belongs to
  std::string text;       // content, or a piece of the call's arguments
  std::string id, name;   // set on a call's first piece (whose `text` is then "")
};

class ToolCallStream {
 public:
  // `spec` must outlive the stream; calls are named ToolCallId(kind, id_base, index).
  ToolCallStream(tokenizer::ChatTemplateKind kind, const ToolSpec* spec, std::string id_base);
  ~ToolCallStream();
  ToolCallStream(const ToolCallStream&) = delete;
  ToolCallStream& operator=(const ToolCallStream&) = delete;

  // A piece of the reply: what may be sent now, in order.
  std::vector<ToolStreamPiece> Push(std::string_view piece);

  struct End {
    std::vector<ToolStreamPiece> pieces;  // the rest
    ToolOutput output;                    // the reply as the non-streamed response reads it (ids given)
    bool exact = true;                    // every piece sent concatenates to `output`
  };
  // The reply ended.
  End Finish();

 private:
  enum class Mode {
    kStart,       // only whitespace so far (Llama-3, Mistral, forced)
    kTag,         // Llama-3: after <|python_tag|>, before the call
    kCalls,       // reading calls (a reader is open)
    kBetween,     // Llama-3: after a call, before ';' and the next one
    kPlain,       // content; ChatML and Mistral look for their marker
    kBlock,       // ChatML: inside a <tool_call> block
    kMarked,      // Mistral: after [TOOL_CALLS], before the calls
    kAllContent,  // the reply is content (Mistral after a marker with no call)
    kHeld,        // a call was opened and then failed: the rest waits for Finish
  };

  tokenizer::ChatTemplateKind kind_;
  const ToolSpec* spec_;
  std::string id_base_;
  std::string text_;            // the whole reply so far
  size_t pos_ = 0;              // bytes of text_ decided (sent, held as whitespace, read as calls)
  Mode mode_ = Mode::kStart;
  std::unique_ptr<CallsReader> reader_;
  size_t unit_start_ = 0;       // ChatML: where the open block's marker begins; else where the calls begin
  size_t body_start_ = 0;       // ChatML: where the open block's JSON begins
  bool marked_ = false;         // Mistral: [TOOL_CALLS] was seen ...
  size_t marker_ = 0;           // ... there
  int separators_ = 0;          // Llama-3: ';' between calls so far
  std::string sent_content_;    // content sent
  std::string held_space_;      // whitespace after the content sent, not sent yet
  struct Sent {
    std::string name, arguments;  // arguments: the pieces sent
  };
  std::vector<Sent> calls_;     // calls opened, in index order
  size_t unit_first_call_ = 0;  // the first call of the unit being read
  bool exact_ = true;
  std::vector<ToolStreamPiece> out_;

  void Advance(bool end);  // decides as much of text_ from pos_ as it can
  void AdvancePlain(std::string_view marker, bool end);
  void AdvanceBlock(bool end);
  void AdvanceCalls();
  size_t FeedReader(size_t to);  // text_[pos_, to) into the reader (returns what it used), its calls out
  void BlockEnded(size_t body_end, size_t block_end);
  void Settle(const std::vector<ToolCall>& calls);  // the unit read whole by the whole-reply parse
  void Fallback();                 // what the reader read is no call: content
  void Content(std::string_view s, bool hold_space);
  void Open(const std::string& name);
  void Arguments(size_t index, std::string_view piece);
};

}  // namespace attic::server
