#include "tokenizer/text_pipeline.h"

#include <algorithm>
#include <utility>

namespace attic::tokenizer {

namespace {

struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(text);
  out.reserve(text.size() + text.size() / 8);
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

std::string ReplaceRegex(std::string_view text, const Regex& re, std::string_view to, PipelineScratch* scratch) {
  std::string out;
  size_t pos = 0, b = 0, e = 0;
  while (re.FindNext(text, pos, &scratch->regex, &b, &e)) {
    out.append(text.substr(pos, b - pos));
    out.append(to);
    pos = e;
  }
  out.append(text.substr(pos));
  return out;
}

}  // namespace

void SplitPiece(std::string_view piece, const Regex& re, SplitBehavior behavior, bool invert,
                PipelineScratch* scratch, const std::function<void(std::string_view, bool)>& f) {
  size_t pos = 0, b = 0, e = 0;
  bool first = true;
  const auto emit = [&](size_t from, size_t to) {
    if (to <= from) return;
    f(piece.substr(from, to - from), first);
    first = false;
  };
  if (behavior == SplitBehavior::kIsolated) {  // the common case, streamed match by match
    while (re.FindNext(piece, pos, &scratch->regex, &b, &e)) {
      emit(pos, b);
      emit(b, e);
      pos = e;
    }
    emit(pos, piece.size());
    return;
  }
  // Matches and the gaps between them, in order; every match is its own entry even
  // when two are adjacent (as in HF tokenizers).
  std::vector<Segment> segs;
  while (re.FindNext(piece, pos, &scratch->regex, &b, &e)) {
    if (b > pos) segs.push_back({pos, b, invert});
    segs.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < piece.size()) segs.push_back({pos, piece.size(), invert});

  std::vector<std::pair<size_t, size_t>> parts;
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Segment& s : segs) {
        if (!s.is_match) parts.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Segment& s : segs) parts.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segs) {
        if (s.is_match && !prev_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      // Walk right to left, merging a delimiter into the part after it.
      for (size_t i = segs.size(); i-- > 0;) {
        const Segment& s = segs[i];
        if (s.is_match && !prev_match && !parts.empty()) {
          parts.back().first = s.begin;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < segs.size(); ++i) {
        const Segment& s = segs[i];
        if (i > 0 && s.is_match == prev_match) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        prev_match = s.is_match;
      }
      break;
  }
  for (const auto& [from, to] : parts) emit(from, to);
}

std::string TextPipeline::Normalize(std::string_view text, PipelineScratch* scratch) const {
  std::string s(text);
  for (const NormalizerStep& n : normalizers) {
    switch (n.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, n.content);
        break;
      case NormalizerStep::Kind::kReplace:
        s = n.regex ? ReplaceRegex(s, *n.regex, n.content, scratch) : ReplaceAll(s, n.pattern, n.content);
        break;
    }
  }
  return s;
}

void TextPipeline::Run(std::string_view segment, bool at_start, PipelineScratch* scratch,
                       const PieceSink& sink) const {
  std::string normalized;
  std::string_view text = segment;
  if (!normalizers.empty()) {
    normalized = Normalize(segment, scratch);
    text = normalized;
  }
  if (!text.empty()) RunStep(0, text, at_start, scratch, sink);
}

void TextPipeline::RunStep(size_t i, std::string_view piece, bool first_piece, PipelineScratch* scratch,
                           const PieceSink& sink) const {
  if (i == pre_tokenizers.size()) {
    sink(piece);
    return;
  }
  const PreTokenizerStep& step = pre_tokenizers[i];
  const auto next = [&](std::string_view part, bool first_part) {
    RunStep(i + 1, part, first_piece && first_part, scratch, sink);
  };
  switch (step.kind) {
    case PreTokenizerStep::Kind::kSplit:
      SplitPiece(piece, *step.regex, step.behavior, step.invert, scratch, next);
      break;
    case PreTokenizerStep::Kind::kByteLevel: {
      std::string prefixed;
      if (step.add_prefix_space && piece[0] != ' ') {
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        piece = prefixed;
      }
      if (step.regex) {
        SplitPiece(piece, *step.regex, SplitBehavior::kIsolated, false, scratch, next);
      } else {
        next(piece, true);
      }
      break;
    }
    case PreTokenizerStep::Kind::kMetaspace: {
      std::string s = ReplaceAll(piece, " ", step.replacement);
      const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                           (step.prepend == PreTokenizerStep::Prepend::kFirst && first_piece);
      if (prepend && s.compare(0, step.replacement.size(), step.replacement) != 0) s.insert(0, step.replacement);
      if (!step.split) {
        next(s, true);
        break;
      }
      // Split before every replacement character (MergedWithNext).
      const std::string_view v = s;
      size_t start = 0;
      for (size_t hit = v.find(step.replacement, 1); hit != std::string_view::npos;
           hit = v.find(step.replacement, hit + step.replacement.size())) {
        next(v.substr(start, hit - start), start == 0);
        start = hit;
      }
      next(v.substr(start), start == 0);
      break;
    }
  }
}

}  // namespace attic::tokenizer
