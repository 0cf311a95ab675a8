// libFuzzer target: the byte-level BPE tokenizer.json reader (ByteBpeTokenizer::from_tokenizer_json_text),
// then encode and decode. The input is the file's bytes up to the first NUL byte, and after it a text
// to encode (none: the file's own first 512 bytes are encoded). A malformed file must be a
// refit::Error; an accepted one must encode any bytes, and its stream decoder must give decode()'s
// text.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "refit/error.h"
#include "text/byte_bpe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = all.find('\0');
  const std::string_view json = all.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? all.substr(0, 512) : all.substr(nul + 1);
  try {
    const auto tok = refit::text::ByteBpeTokenizer::from_tokenizer_json_text(json, "fuzz.json");
    for (bool special : {true, false}) {
      const auto ids = tok.encode(text, special);
      for (bool skip : {false, true}) {
        const std::string whole = tok.decode(ids, skip);
        auto stream = tok.stream_decoder(skip);
        std::string pieces;
        for (auto id : ids) pieces += stream.push(id);
        pieces += stream.finish();
        if (pieces != whole) std::abort();  // the stream decoder must agree with decode()
      }
    }
    (void)tok.pre_tokenize(text);
  } catch (const refit::Error&) {
  }
  return 0;
}
