// Internal: what the request handlers (completion_handler.cc, messages_handler.cc) share
// while they relay a submitted request's events to its client: the polling and watchdog
// constants, the access-log note of each event, and a non-streaming request's wait.
#pragma once

#include <chrono>
#include <memory>

#include "attic/engine/scheduler.h"
#include "attic/server/openai_api.h"

namespace attic::server {

// How long a handler waits between checks that its client is still connected.
inline constexpr std::chrono::milliseconds kPollInterval{100};
// Grace beyond the request deadline before a handler gives up on the step loop.
inline constexpr std::chrono::seconds kWatchdogGrace{30};

// The error of a request the watchdog gave up on.
ApiError Timeout();

// A request of n choices: the sum of its choices' usages (the prompt counts in choice
// 0's only: engine::TokenUsage).
void AddUsage(engine::TokenUsage* sum, const engine::TokenUsage& u);

// Access log: time to the first output of the request (its first text, or its finish),
// then its usage (summed over its choices) as they finish. Runs on the thread that
// handles the request.
void NoteEvent(const engine::GenerationEvent& ev);

// A non-streaming handler's wait for its request's events: every kPollInterval it checks
// that the client is still connected and that the watchdog has not passed; either way
// the request is cancelled.
class EventWaiter {
 public:
  enum class Outcome { kEvent, kClientGone, kTimedOut };
  EventWaiter(std::shared_ptr<engine::ResultChannel> channel, engine::SchedClock::time_point watchdog);
  // The next event in *ev (noted in the access log), or why there is none.
  Outcome Next(engine::GenerationEvent* ev);

 private:
  std::shared_ptr<engine::ResultChannel> channel_;
  engine::SchedClock::time_point watchdog_, next_check_;
};

}  // namespace attic::server
