// POST /v1/messages (the Anthropic Messages API): authenticate, validate, build the
// chat prompt as /v1/chat/completions does, submit, and answer in Anthropic's shapes --
// one message object, or the SSE sequence message_start, content_block_start,
// content_block_delta..., content_block_stop, message_delta, message_stop.
#include <chrono>

#include "attic/server/anthropic_api.h"
#include "server/request_events.h"
#include "server/server_internal.h"

namespace attic::server {

namespace {

using engine::GenerationEvent;
using engine::SchedClock;

void SendAnthropicError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(AnthropicErrorJson(e), "application/json");
}

struct MessageStream {
  std::shared_ptr<engine::ResultChannel> channel;
  std::string id, model;
  int prompt_tokens = 0;
  int breakpoint_tokens = 0;
  bool stored = false;
  std::vector<std::string> stop_sequences;
  bool started = false;
  SchedClock::time_point watchdog;
};

}  // namespace

void Server::Impl::HandleMessages(const httplib::Request& req, const std::string& body, httplib::Response& res) {
  const SchedClock::time_point arrival = SchedClock::now();
  std::string tenant;
  if (auto e = Authenticate(req, &tenant)) return SendAnthropicError(res, *e);
  MessagesParse parsed = ParseMessagesRequest(body);
  if (parsed.error) return SendAnthropicError(res, *parsed.error);
  MessagesRequest& m = parsed.request;
  ApiRequest& r = m.chat;
  if (auto e = ApplySessionHeader(req.get_header_value(kSessionIdHeader), &r)) return SendAnthropicError(res, *e);
  if (r.model != model_name) return SendAnthropicError(res, ModelNotFound(r.model));
  // A breakpoint's TTL lengthens this turn's stored life when the server's is shorter.
  if (m.cache_ttl_s > 0 && options.store.default_ttl_ms > 0 && options.store.default_ttl_ms < m.cache_ttl_s * 1000)
    r.session_ttl_s = m.cache_ttl_s;
  const SchedClock::time_point deadline =
      arrival + std::chrono::duration_cast<SchedClock::duration>(std::chrono::duration<double>(options.request_timeout_s));
  auto prompt = BuildPrompt(r, tenant, deadline);
  if (!prompt.ok()) {
    ApiError e = ErrorFromStatus(prompt.status());
    e.param = "messages";
    return SendAnthropicError(res, e);
  }
  // The prompt's tokens up to the last cache_control breakpoint: the rendered prefix
  // before the marker, tokenized, as far as it agrees with the prompt's tokens.
  int breakpoint_tokens = 0;
  if (!m.marked.empty()) {
    auto marked = engine.RenderChat(m.marked);
    const size_t at = marked.ok() ? marked->find(kCacheBreakMarker) : std::string::npos;
    if (at != std::string::npos) {
      auto ids = engine.Tokenize(marked->substr(0, at), /*add_bos=*/false);
      if (ids.ok()) {
        const std::vector<int32_t>& full = prompt->ids;
        while (breakpoint_tokens < static_cast<int>(std::min(ids->size(), full.size())) &&
               (*ids)[breakpoint_tokens] == full[breakpoint_tokens])
          ++breakpoint_tokens;
      }
    }
  }
  engine::GenerationRequest g;
  g.tenant = tenant;
  g.session_id = r.session_id;
  g.session_ttl_ms = r.session_ttl_s < 0 ? -1 : r.session_ttl_s * 1000;
  g.prompt = std::move(prompt->ids);
  g.sampling = Sampling(r);
  g.arrival = arrival;
  g.deadline = deadline;
  const int prompt_tokens = static_cast<int>(g.prompt.size());
  const SchedClock::time_point watchdog = deadline + kWatchdogGrace;
  auto channel = scheduler->Submit(std::move(g));
  if (!channel.ok()) {
    ApiError e = ErrorFromStatus(channel.status());
    if (e.http_status == 400 || e.http_status == 413) e.param = "messages";
    return SendAnthropicError(res, e);
  }
  const std::string id = NewId("msg_");
  const bool stored = store != nullptr;
  if (!r.stream) {
    std::string text;
    GenerationEvent ev;
    EventWaiter waiter(*channel, watchdog);
    while (true) {
      switch (waiter.Next(&ev)) {
        case EventWaiter::Outcome::kClientGone: res.status = 499; return;
        case EventWaiter::Outcome::kTimedOut: return SendAnthropicError(res, Timeout());
        case EventWaiter::Outcome::kEvent: break;
      }
      if (ev.kind == GenerationEvent::Kind::kText) {
        text += ev.text;
      } else if (ev.kind == GenerationEvent::Kind::kFinish) {
        std::string stop_sequence;
        const std::string reason = AnthropicStopReason(ev.finish_reason, ev.stop_string, m.stop_sequences, &stop_sequence);
        res.set_content(MessageBody(id, model_name, text, reason, stop_sequence,
                                    AnthropicUsage(ev.usage, breakpoint_tokens, stored)),
                        "application/json");
        return;
      } else {
        return SendAnthropicError(res, ErrorFromStatus(ev.status));
      }
    }
  }

  auto st = std::make_shared<MessageStream>();
  st->channel = *channel;
  st->id = id;
  st->model = model_name;
  st->prompt_tokens = prompt_tokens;
  st->breakpoint_tokens = breakpoint_tokens;
  st->stored = stored;
  st->stop_sequences = m.stop_sequences;
  st->watchdog = watchdog;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t /*offset*/, httplib::DataSink& sink) -> bool {
        auto fail = [&] {
          st->channel->Cancel();
          return false;
        };
        if (!st->started) {
          st->started = true;
          const std::string first = MessageStartEvent(st->id, st->model, st->prompt_tokens) + ContentBlockStartEvent();
          return sink.write(first.data(), first.size()) ? true : fail();
        }
        GenerationEvent ev;
        if (!st->channel->Pop(&ev, kPollInterval)) {
          if (!sink.is_writable()) return fail();
          if (SchedClock::now() > st->watchdog) {
            st->channel->Cancel();
            const std::string s = AnthropicErrorEvent(Timeout());
            sink.write(s.data(), s.size());
            sink.done();
          }
          return true;
        }
        NoteEvent(ev);
        std::string out;
        if (ev.kind == GenerationEvent::Kind::kText) {
          if (ev.text.empty()) return true;
          out = TextDeltaEvent(ev.text);
          return sink.write(out.data(), out.size()) ? true : fail();
        }
        if (ev.kind == GenerationEvent::Kind::kFinish) {
          std::string stop_sequence;
          const std::string reason =
              AnthropicStopReason(ev.finish_reason, ev.stop_string, st->stop_sequences, &stop_sequence);
          out = ContentBlockStopEvent() +
                MessageDeltaEvent(reason, stop_sequence, AnthropicUsage(ev.usage, st->breakpoint_tokens, st->stored)) +
                MessageStopEvent();
        } else {
          out = AnthropicErrorEvent(ErrorFromStatus(ev.status));
        }
        if (!sink.write(out.data(), out.size())) return fail();
        sink.done();
        return true;
      },
      [st](bool /*success*/) { st->channel->Cancel(); });
}

}  // namespace attic::server
