// Status and StatusOr<T>: how Attic reports anything a user, a disk or a capacity
// limit can cause. Broken internal invariants use ATTIC_CHECK instead (abort).
//
// Thread-safety: value types; safe to copy between threads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace attic {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // bad user input (maps to HTTP 400)
  kNotFound,           // missing file / model / entry (404)
  kAlreadyExists,
  kOutOfRange,         // e.g. prompt longer than the context window (413)
  kResourceExhausted,  // a capacity or budget is full (429/503)
  kUnimplemented,      // unsupported architecture, dtype, format feature
  kDataLoss,           // corrupt or truncated file
  kFailedPrecondition,
  kUnavailable,
  kCancelled,
  kDeadlineExceeded,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is prefixed with `context + ": "`.
  Status WithContext(const std::string& context) const;
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// StatusOr<T>: either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& s) : v_(s) { CheckNotOk(); }  // NOLINT: implicit by design
  StatusOr(Status&& s) : v_(std::move(s)) { CheckNotOk(); }  // NOLINT
  StatusOr(const T& value) : v_(value) {}  // NOLINT
  StatusOr(T&& value) : v_(std::move(value)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : v_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return v_.index() == 1; }
  Status status() const { return ok() ? Status() : std::get<0>(v_); }
  const T& value() const& { CheckOk(); return std::get<1>(v_); }
  T& value() & { CheckOk(); return std::get<1>(v_); }
  T&& value() && { CheckOk(); return std::get<1>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckNotOk() const {
    if (std::get<0>(v_).ok()) {
      std::fprintf(stderr, "attic: StatusOr constructed from OK status\n");
      std::abort();
    }
  }
  void CheckOk() const {
    if (!ok()) {
      std::fprintf(stderr, "attic: StatusOr::value() on error: %s\n", std::get<0>(v_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<Status, T> v_;
};

}  // namespace attic

#define ATTIC_CONCAT_INNER_(a, b) a##b
#define ATTIC_CONCAT_(a, b) ATTIC_CONCAT_INNER_(a, b)

#define ATTIC_RETURN_IF_ERROR(expr)              \
  do {                                           \
    ::attic::Status _attic_st = (expr);          \
    if (!_attic_st.ok()) return _attic_st;       \
  } while (0)

#define ATTIC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define ATTIC_ASSIGN_OR_RETURN(lhs, expr) \
  ATTIC_ASSIGN_OR_RETURN_IMPL_(ATTIC_CONCAT_(_attic_so_, __LINE__), lhs, expr)

// Internal invariants only: a failure is a bug in Attic, not in the input.
#define ATTIC_CHECK(cond)                                                            \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "attic: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
