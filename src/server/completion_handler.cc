// POST /v1/chat/completions and /v1/completions: authenticate, validate, build the
// prompt, submit to the scheduler, then relay the request's events to the client as
// one JSON body or as SSE chunks. A client that goes away cancels its request.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include "attic/core/log.h"
#include "server/access_log.h"
#include "server/logprobs_json.h"
#include "server/request_events.h"
#include "server/server_internal.h"

namespace attic::server {

namespace {

using engine::GenerationEvent;
using engine::SchedClock;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Per-stream state shared by the content provider calls and the releaser.
struct StreamState {
  std::shared_ptr<engine::ResultChannel> channel;
  ResponseMeta meta;
  bool include_usage = false;
  bool started = false;
  int n = 1;              // choices; the stream ends once each has finished
  int finished = 0;
  engine::TokenUsage usage;  // summed over the finished choices
  // Completions with echo: the prompt's text, sent first (with its logprobs when they
  // are asked for: once they arrive).
  std::string echo;
  bool echo_waits_for_logprobs = false;
  std::unique_ptr<LogprobsJson> logprobs;  // null: not asked for
  SchedClock::time_point watchdog;
  // Chat with tools (tool_choice not "none"): the reply is split into content and calls.
  ToolSpec tools;
  std::unique_ptr<ToolCallStream> tool_stream;  // names the calls as NameToolCalls does
};

}  // namespace

ApiError ModelNotFound(const std::string& model) {
  ApiError e;
  e.http_status = 404;
  e.message = "The model '" + model + "' does not exist";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

StatusOr<Server::Impl::BuiltPrompt> Server::Impl::BuildPrompt(const ApiRequest& r, const std::string& tenant,
                                                               engine::SchedClock::time_point deadline) {
  const int ctx = engine.context_length();
  // With decoupled truncation the scheduler shortens an overlong conversation instead
  // (its text is then bounded by the request body limit only).
  const bool truncates = engine::ShortensOverlongPrompts(options.kv, store != nullptr);
  const size_t max_bytes =
      truncates ? std::numeric_limits<size_t>::max() : static_cast<size_t>(ctx) * max_token_bytes * 2 + 1024;
  auto too_long = [ctx](const std::string& what) {
    return OutOfRangeError("This model's maximum context length is " + std::to_string(ctx) + " tokens; " + what);
  };
  BuiltPrompt out;
  std::vector<int32_t>& ids = out.ids;
  std::string text;  // the prompt as text (chat: rendered by the template)
  if (r.kind == ApiKind::kChat) {
    // The engine's template family (`attic serve` loads it with the ChatML fallback).
    ATTIC_ASSIGN_OR_RETURN(text, engine.RenderChat(r.messages, /*add_generation_prompt=*/true, r.tools.ToolJson()));
    if (text.size() > max_bytes) return too_long("your messages are far longer than that");
  } else if (r.prompt_is_ids) {
    ids = r.prompt_ids;
  } else {
    if (r.prompt_text.size() > max_bytes) return too_long("your prompt is far longer than that");
    text = r.prompt_text;
  }
  // Templates that want BOS write it themselves; a completion prompt gets the tokenizer's.
  const bool add_bos = r.kind == ApiKind::kCompletion;
  bool links = !r.cache_parts.empty();
  if (links && caches == nullptr) {
    // Without the KV store nothing is cached: a context cache cannot exist, and
    // cache_control, a hint, is ignored (its text is plain text).
    std::string plain;
    size_t at = 0;
    for (size_t open; (open = text.find(kPartMarkerOpen, at)) != std::string::npos;) {
      const size_t digits = open + std::strlen(kPartMarkerOpen);
      const size_t close = text.find(kPartMarkerClose, digits);
      const ApiRequest::CachePart& part = r.cache_parts.at(std::stoul(text.substr(digits, close - digits)));
      if (!part.cache_id.empty())
        return NotFoundError("No context cache '" + part.cache_id +
                             "': context caches need the KV store, which is not enabled on this server "
                             "(--kv-dram, --kv-ssd-dir)");
      plain += text.substr(at, open - at) + part.text;
      at = close + std::strlen(kPartMarkerClose);
    }
    text = plain + text.substr(at);
    links = false;
  }
  if (!r.prompt_is_ids && !links) {
    ATTIC_ASSIGN_OR_RETURN(ids, engine.Tokenize(text, add_bos));
  } else if (links) {
    // Text pieces are tokenized on their own between the cache parts (each cached chunk
    // was tokenized on its own too).
    std::vector<PromptPiece> pieces;
    if (add_bos && engine.tokenizer().add_bos() && engine.tokenizer().bos_id() >= 0)
      pieces.push_back({{engine.tokenizer().bos_id()}, false, false});
    size_t at = 0;
    while (at <= text.size()) {
      const size_t open = text.find(kPartMarkerOpen, at);
      const std::string piece = text.substr(at, open == std::string::npos ? std::string::npos : open - at);
      if (!piece.empty()) {
        PromptPiece p;
        ATTIC_ASSIGN_OR_RETURN(p.tokens, engine.Tokenize(piece, false));
        pieces.push_back(std::move(p));
      }
      if (open == std::string::npos) break;
      const size_t digits = open + std::strlen(kPartMarkerOpen);
      const size_t close = text.find(kPartMarkerClose, digits);
      const size_t index = std::stoul(text.substr(digits, close - digits));
      at = close + std::strlen(kPartMarkerClose);
      const ApiRequest::CachePart& part = r.cache_parts.at(index);
      if (!part.cache_id.empty()) {
        // A chunk id is its cache's id ("ctx-" + 24 hex) + "-c" + index.
        auto cache = registry->Get(tenant, part.cache_id.substr(0, 28));
        auto chunks = registry->Resolve(tenant, part.cache_id);
        // A registry that did not answer (the shared one, with --kv-remote) is its error
        // (503), never a 404 that would tell the client the cache is gone.
        for (const Status& st : {cache.status(), chunks.status()})
          if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
        if (!chunks.ok() || !cache.ok() || cache->model != model_name)
          return NotFoundError("No context cache or chunk '" + part.cache_id + "' (unknown, expired or deleted)");
        for (pic::CachedChunk& c : *chunks) pieces.push_back({std::move(c.tokens), true, cache->bos});
      } else {
        PromptPiece p;
        ATTIC_ASSIGN_OR_RETURN(p.tokens, engine.Tokenize(part.text, false));
        p.bos = caches->options().chunk_bos;
        p.cached = caches->ImplicitReady(tenant, p.tokens);
        out.implicit.emplace_back(p.tokens, part.ttl_s * 1000);
        pieces.push_back(std::move(p));
      }
    }
    ATTIC_ASSIGN_OR_RETURN(out.link, caches->Link(tenant, pieces, r.link ? *r.link : caches->options().link, deadline,
                                                  &ids, &out.prep));
  }
  if (ids.empty()) return InvalidArgumentError("the prompt is empty");
  if (static_cast<int64_t>(ids.size()) > ctx && !truncates) {
    return too_long("however, your " + std::string(r.kind == ApiKind::kChat ? "messages" : "prompt") +
                    " resulted in " + std::to_string(ids.size()) + " tokens");
  }
  return out;
}

std::shared_ptr<const grammar::Vocabulary> Server::Impl::GrammarVocab() {
  std::call_once(grammar_vocab_once, [this] { grammar_vocab = std::make_shared<grammar::Vocabulary>(engine.tokenizer()); });
  return grammar_vocab;
}

engine::SamplingParams Server::Impl::Sampling(const ApiRequest& r) {
  engine::SamplingParams sp;
  sp.temperature = r.top_p == 0.0f ? 0.0f : r.temperature;  // top_p 0 keeps only the top token
  sp.top_p = r.top_p == 0.0f ? 1.0f : r.top_p;
  sp.top_k = r.top_k;
  sp.min_p = r.min_p;
  if (r.seed) {
    sp.seed = *r.seed;
  } else {
    std::lock_guard<std::mutex> lock(rng_mu);
    sp.seed = rng();
  }
  int64_t limit = engine.context_length();
  if (options.max_tokens_limit > 0) limit = std::min(limit, options.max_tokens_limit);
  sp.max_tokens = static_cast<int>(r.max_tokens ? std::min(*r.max_tokens, limit) : limit);
  sp.stop_strings = r.stop;
  if (r.kind == ApiKind::kChat && engine.chat_template_kind().ok()) {
    // End-of-turn markers end a reply: as token ids when the vocabulary has them, else as
    // text (a model chatting through the ChatML fallback may spell them out).
    for (const std::string& s : tokenizer::ChatStopTokens(*engine.chat_template_kind())) {
      int32_t id = engine.tokenizer().TokenId(s);
      if (id >= 0) {
        sp.stop_token_ids.push_back(id);
      } else if (std::find(sp.stop_strings.begin(), sp.stop_strings.end(), s) == sp.stop_strings.end()) {
        sp.stop_strings.push_back(s);
      }
    }
  }
  return sp;
}

void Server::Impl::HandleCompletion(ApiKind kind, const httplib::Request& req, const std::string& body,
                                    httplib::Response& res) {
  const SchedClock::time_point arrival = SchedClock::now();
  std::string tenant;
  if (auto e = Authenticate(req, &tenant)) return SendError(res, *e);
  ParseResult parsed = ParseApiRequest(kind, body);
  if (parsed.error) return SendError(res, *parsed.error);
  if (auto e = ApplySessionHeader(req.get_header_value(kSessionIdHeader), &parsed.request)) return SendError(res, *e);
  const ApiRequest& r = parsed.request;
  if (r.model != model_name) return SendError(res, ModelNotFound(r.model));
  if (pic::IsChunkStoreSession(r.session_id)) {
    ApiError e = ErrorFromStatus(InvalidArgumentError("session ids starting with 'ctx:' are reserved for context caches"));
    e.param = "session_id";
    return SendError(res, e);
  }
  // The parser checked k and ratio; check_layer depends on the model, so it is checked
  // here: before any chunk is prefilled, and also when the prompt links nothing.
  if (r.link) {
    if (Status st = r.link->Validate(engine.model().config().n_layers); !st.ok()) {
      ApiError e = ErrorFromStatus(st);
      e.param = "link.check_layer";
      return SendError(res, e);
    }
  }
  const SchedClock::time_point deadline =
      arrival + std::chrono::duration_cast<SchedClock::duration>(std::chrono::duration<double>(options.request_timeout_s));
  auto prompt = BuildPrompt(r, tenant, deadline);
  if (!prompt.ok()) {
    ApiError e = ErrorFromStatus(prompt.status());
    e.param = kind == ApiKind::kChat ? "messages" : "prompt";
    if (prompt.status().code() == StatusCode::kNotFound) e.code = "context_cache_not_found";
    return SendError(res, e);
  }
  engine::GenerationRequest g;
  g.tenant = tenant;
  g.session_id = r.session_id;
  g.session_ttl_ms = r.session_ttl_s < 0 ? -1 : r.session_ttl_s * 1000;
  g.prompt = std::move(prompt->ids);
  if (prompt->link != nullptr) g.kv_options.Set(prompt->link);
  if (r.sparse) g.kv_options.Set(std::make_shared<const pq::SparseOptions>(*r.sparse));
  g.sampling = Sampling(r);
  g.ignore_eos = r.ignore_eos;
  g.logprobs = r.logprobs;
  g.n = r.n;
  // Echo with logprobs, or echo alone (max_tokens 0), computes the whole prompt's logits.
  g.prompt_logprobs = r.echo && (r.logprobs >= 0 || g.sampling.max_tokens == 0);
  std::shared_ptr<const grammar::Grammar> grammar = r.grammar;
  if (r.tools.forced()) {
    // tool_choice "required" or a function: the reply is a call, decoded under its grammar.
    auto g_tools = ToolCallGrammar(r.tools, *engine.chat_template_kind());
    if (!g_tools.ok()) {
      const bool keyword = g_tools.status().message().find("is not supported") != std::string::npos;
      return SendError(res, InvalidParam("tools", g_tools.status().message(),
                                         keyword ? "unsupported_parameter" : "invalid_value"));
    }
    grammar = *g_tools;
  }
  if (grammar) {
    // At most max_tokens, and what the context window leaves after the prompt.
    const int64_t budget = std::min<int64_t>(g.sampling.max_tokens, engine.context_length() - static_cast<int64_t>(g.prompt.size()));
    g.processor = std::make_shared<grammar::JsonProcessor>(grammar, GrammarVocab(), budget);
  }
  std::string echo;
  if (r.echo) echo = r.prompt_is_ids ? engine.tokenizer().Decode(g.prompt) : r.prompt_text;
  g.arrival = arrival;
  g.deadline = deadline;
  const SchedClock::time_point watchdog = g.deadline + kWatchdogGrace;
  const bool g_prompt_logprobs = g.prompt_logprobs;
  auto channel = scheduler->Submit(std::move(g));
  if (!channel.ok()) {
    ApiError e = ErrorFromStatus(channel.status());
    if (e.http_status == 400 || e.http_status == 413) e.param = kind == ApiKind::kChat ? "messages" : "prompt";
    if (e.message.rfind("link", 0) == 0) e.param = "link";
    if (e.message.rfind("sparse", 0) == 0) e.param = "sparse";
    if (e.message.rfind("prompt logprobs", 0) == 0) e.param = "echo";
    if (e.message.rfind("n ", 0) == 0) e.param = "n";
    return SendError(res, e);
  }
  metrics.CountLink(prompt->prep, prompt->link != nullptr);
  // Implicit caches (cache_control): kept alive; a first sight is prefilled on its own
  // after this request (queued behind it), and linked by the next request that has it.
  for (const auto& [tokens, ttl_ms] : prompt->implicit) {
    if (Status st = caches->RememberImplicit(tenant, tokens, ttl_ms); !st.ok())
      Log(LogLevel::kWarn, "implicit cache not kept: %s", st.message().c_str());
  }
  ResponseMeta meta;
  meta.kind = kind;
  meta.id = NewId(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  meta.created = UnixNow();
  meta.model = model_name;
  meta.system_fingerprint = system_fingerprint;

  std::unique_ptr<LogprobsJson> logprobs;
  if (r.logprobs >= 0) logprobs = std::make_unique<LogprobsJson>(engine.tokenizer(), kind);
  if (!r.stream) {
    // Choice i's text, logprobs entries and finish reason; the body goes out once every
    // choice has finished.
    std::vector<std::string> texts(r.n, echo);
    std::vector<std::vector<engine::TokenLogprob>> entries(r.n);
    std::vector<ChoiceBody> choices(r.n);
    engine::TokenUsage usage;
    int finished = 0;
    GenerationEvent ev;
    EventWaiter waiter(*channel, watchdog);
    while (true) {
      switch (waiter.Next(&ev)) {
        case EventWaiter::Outcome::kClientGone: res.status = 499; return;  // nothing can be sent
        case EventWaiter::Outcome::kTimedOut: return SendError(res, Timeout());
        case EventWaiter::Outcome::kEvent: break;
      }
      const size_t i = static_cast<size_t>(std::clamp(ev.index, 0, r.n - 1));
      if (ev.kind == GenerationEvent::Kind::kText) {
        texts[i] += ev.text;
        // The prompt's logprobs (echo) arrive once, before the choices fork: each has them.
        for (size_t c = 0; c < entries.size() && !ev.prompt_logprobs.empty(); ++c)
          entries[c].insert(entries[c].end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
        entries[i].insert(entries[i].end(), std::make_move_iterator(ev.logprobs.begin()),
                          std::make_move_iterator(ev.logprobs.end()));
      } else if (ev.kind == GenerationEvent::Kind::kFinish) {
        // Tools come with n = 1 only (ParseApiRequest refuses n > 1 with tools).
        ToolOutput out{std::move(texts[i]), {}};
        if (r.tools.active()) {
          out = ParseToolOutput(out.content, *engine.chat_template_kind(), r.tools);
          NameToolCalls(*engine.chat_template_kind(), NewId("call_"), &out.calls);
        }
        const std::string reason = out.calls.empty() ? ev.finish_reason : "tool_calls";
        choices[i] = {std::move(out.content), reason, logprobs ? logprobs->Of(entries[i]).dump() : std::string(),
                      std::move(out.calls)};
        AddUsage(&usage, ev.usage);
        if (++finished < r.n) continue;
        res.set_content(CompletionBody(meta, choices, usage), "application/json");
        return;
      } else {
        return SendError(res, ErrorFromStatus(ev.status));
      }
    }
  }

  auto st = std::make_shared<StreamState>();
  st->channel = *channel;
  st->meta = meta;
  st->include_usage = r.include_usage;
  st->n = r.n;
  st->watchdog = watchdog;
  st->echo = std::move(echo);
  st->echo_waits_for_logprobs = logprobs != nullptr && g_prompt_logprobs;
  st->logprobs = std::move(logprobs);
  if (r.tools.active()) {
    st->tools = r.tools;
    st->tool_stream = std::make_unique<ToolCallStream>(*engine.chat_template_kind(), &st->tools, NewId("call_"));
  }
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
          for (int i = 0; i < st->n; ++i) {  // each choice opens with its role (chat) or echo
            if (st->meta.kind == ApiKind::kChat) {
              std::string first = ChunkEvent(st->meta, "", "", st->include_usage, /*role_chunk=*/true, "", i);
              if (!sink.write(first.data(), first.size())) return fail();
            }
            if (!st->echo.empty() && !st->echo_waits_for_logprobs) {
              std::string first = ChunkEvent(st->meta, st->echo, "", st->include_usage, false, "", i);
              if (!sink.write(first.data(), first.size())) return fail();
            }
          }
          return true;
        }
        GenerationEvent ev;
        if (!st->channel->Pop(&ev, kPollInterval)) {
          if (!sink.is_writable()) return fail();
          if (SchedClock::now() > st->watchdog) {
            st->channel->Cancel();
            std::string s = ErrorEvent(Timeout());
            sink.write(s.data(), s.size());
            sink.done();
          }
          return true;
        }
        NoteEvent(ev);
        std::string out;
        if (ev.kind == GenerationEvent::Kind::kText) {
          if (!ev.prompt_logprobs.empty() && st->logprobs) {  // once, before the choices fork
            const std::string lp = st->logprobs->Of(ev.prompt_logprobs).dump();
            for (int i = 0; i < st->n; ++i) out += ChunkEvent(st->meta, st->echo, "", st->include_usage, false, lp, i);
          }
          const std::string lp = st->logprobs ? st->logprobs->Of(ev.logprobs).dump() : std::string();
          if (st->tool_stream) {
            // With tools (n = 1): content, and calls as their arguments arrive
            // (tool_call_stream.h); logprobs on the event's chunk as without tools.
            out += ToolStreamEvents(st->meta, st->tool_stream->Push(ev.text), st->include_usage,
                                    ev.logprobs.empty() ? std::string() : lp);
          } else if (!ev.text.empty() || !ev.logprobs.empty()) {
            out += ChunkEvent(st->meta, ev.text, "", st->include_usage, false, lp, ev.index);
          }
          return out.empty() || sink.write(out.data(), out.size()) ? true : fail();
        }
        if (ev.kind == GenerationEvent::Kind::kFinish) {
          std::string reason = ev.finish_reason;
          if (st->tool_stream) {
            ToolCallStream::End end = st->tool_stream->Finish();
            out += ToolStreamEvents(st->meta, end.pieces, st->include_usage);
            if (!end.output.calls.empty()) reason = "tool_calls";
            if (!end.exact)
              Log(LogLevel::kDebug, "%s: a tool call was streamed and then did not read; the stream ends as the "
                  "whole reply reads", st->meta.id.c_str());
          }
          out += ChunkEvent(st->meta, "", reason, st->include_usage, false, "", ev.index);
          AddUsage(&st->usage, ev.usage);
          if (++st->finished < st->n) return sink.write(out.data(), out.size()) ? true : fail();
          if (st->include_usage) out += UsageEvent(st->meta, st->usage);
          out += "data: [DONE]\n\n";
        } else {
          out = ErrorEvent(ErrorFromStatus(ev.status));
        }
        if (!sink.write(out.data(), out.size())) return fail();
        sink.done();
        return true;
      },
      [st](bool /*success*/) { st->channel->Cancel(); });
}

}  // namespace attic::server
