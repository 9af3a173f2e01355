// ResultChannel: the bounded, never-blocking hand-off from the step loop to a requester.
#include "attic/engine/scheduler.h"

namespace attic::engine {

void ResultChannel::Push(GenerationEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The last pending text event of the same choice takes the text.
    auto back_it = events_.rend();
    if (event.kind == GenerationEvent::Kind::kText && events_.size() >= capacity_) {
      for (auto it = events_.rbegin(); it != events_.rend(); ++it) {
        if (it->index != event.index) continue;
        if (it->kind == GenerationEvent::Kind::kText) back_it = it;
        break;
      }
    }
    if (back_it != events_.rend()) {
      GenerationEvent& back = *back_it;
      back.text += event.text;
      back.logprobs.insert(back.logprobs.end(), std::make_move_iterator(event.logprobs.begin()),
                           std::make_move_iterator(event.logprobs.end()));
      back.prompt_logprobs.insert(back.prompt_logprobs.end(), std::make_move_iterator(event.prompt_logprobs.begin()),
                                  std::make_move_iterator(event.prompt_logprobs.end()));
    } else {
      events_.push_back(std::move(event));
    }
  }
  cv_.notify_one();
}

bool ResultChannel::Pop(GenerationEvent* event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) return false;
  *event = std::move(events_.front());
  events_.pop_front();
  return true;
}

}  // namespace attic::engine
