// ByteBpeTokenizer::from_gguf: the tokenizer.ggml.* keys of a GGUF file (llama.cpp's names) read
// into a GgufVocabulary. Built into refit_text where the GGUF reader (refit_gguf) is.
#include "byte_bpe.h"
#include "io/gguf.h"

namespace refit::text {

ByteBpeTokenizer ByteBpeTokenizer::from_gguf(const refit::io::GgufFile& f, GgufPreTokenizer pre) {
  GgufVocabulary v;
  v.label = f.label();
  v.model = f.get_string("tokenizer.ggml.model");
  if (f.has("tokenizer.ggml.pre")) v.pre = f.get_string("tokenizer.ggml.pre");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.merges")) v.merges = f.get_string_array("tokenizer.ggml.merges");
  if (f.has("tokenizer.ggml.token_type")) v.token_types = f.get_int_array("tokenizer.ggml.token_type");
  auto id = [&](const char* key) -> std::optional<std::int64_t> {
    if (!f.has(key)) return std::nullopt;
    return f.get_int(key);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  if (f.has("tokenizer.ggml.add_bos_token")) v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  if (f.has("tokenizer.ggml.add_eos_token")) v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  return from_gguf_vocabulary(v, pre);
}

}  // namespace refit::text
