// The request handlers' shared event relay pieces (request_events.h).
#include "server/request_events.h"

#include "server/access_log.h"
#include "server/http_transport.h"

namespace attic::server {

using engine::GenerationEvent;
using engine::SchedClock;

ApiError Timeout() { return ErrorFromStatus(Status(StatusCode::kDeadlineExceeded, "request timed out")); }

void AddUsage(engine::TokenUsage* sum, const engine::TokenUsage& u) {
  sum->prompt_tokens += u.prompt_tokens;
  sum->completion_tokens += u.completion_tokens;
  sum->cached_tokens += u.cached_tokens;
  sum->recomputed_tokens += u.recomputed_tokens;
}

void NoteEvent(const GenerationEvent& ev) {
  AccessNote& note = CurrentAccessNote();
  if (note.ttft_ms < 0 && ev.kind != GenerationEvent::Kind::kError) {
    note.ttft_ms = std::chrono::duration<double, std::milli>(SchedClock::now() - HttpTransport::RequestStart()).count();
  }
  if (ev.kind == GenerationEvent::Kind::kFinish) {
    if (!note.has_usage) note.usage = engine::TokenUsage{};
    note.has_usage = true;
    AddUsage(&note.usage, ev.usage);
  }
}

EventWaiter::EventWaiter(std::shared_ptr<engine::ResultChannel> channel, SchedClock::time_point watchdog)
    : channel_(std::move(channel)), watchdog_(watchdog), next_check_(SchedClock::now() + kPollInterval) {}

EventWaiter::Outcome EventWaiter::Next(GenerationEvent* ev) {
  while (true) {
    const bool got = channel_->Pop(ev, kPollInterval);
    if (SchedClock::now() >= next_check_) {
      next_check_ = SchedClock::now() + kPollInterval;
      if (!HttpTransport::ClientConnected()) {
        channel_->Cancel();
        return Outcome::kClientGone;
      }
      if (SchedClock::now() > watchdog_) {
        channel_->Cancel();
        return Outcome::kTimedOut;
      }
    }
    if (got) {
      NoteEvent(*ev);
      return Outcome::kEvent;
    }
  }
}

}  // namespace attic::server
