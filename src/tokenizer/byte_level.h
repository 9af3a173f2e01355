// The GPT-2 byte<->unicode map used by byte-level BPE vocabularies: every byte is
// shown as a printable code point ('!'..'~', '¡'..'¬', '®'..'ÿ' stand for themselves,
// the other 68 bytes map to U+0100.. in order), so " the" is stored as "Ġthe".
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace attic::tokenizer {

// The code point that shows byte `b`.
uint32_t ByteToCodepoint(uint8_t b);

// Undoes the map for a vocabulary string: "Ġthe" -> " the". Returns false (and leaves
// *out unspecified) if `text` holds a code point outside the map, as added tokens may.
// REQUIRES: `text` is valid UTF-8.
bool ByteLevelToBytes(std::string_view text, std::string* out);

// Applies the map: " the" -> "Ġthe".
std::string BytesToByteLevel(std::string_view bytes);

}  // namespace attic::tokenizer
