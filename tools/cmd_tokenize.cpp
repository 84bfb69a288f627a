// `pipeline tokenize`: text -> GPT-2 token ids (little-endian uint16) and back, for debugging
// tokenization and checking parity against other tokenizers from outside.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.h"
#include "datasets/tokenizer/tokenizer.h"
#include "base/atomic_file.h"

namespace {

constexpr const char* usage =
    "usage: pipeline tokenize [--allow-special] [--decode] [--out FILE] [FILE...]\n"
    "\n"
    "Encodes text with the GPT-2 tokenizer (the vocabulary is built into pipeline) and writes\n"
    "the token ids as little-endian uint16. Reads standard input when no FILE is given (or for\n"
    "FILE '-'); several files are encoded one after the other, each on its own.\n"
    "\n"
    "options:\n"
    "  --allow-special  encode \"<|endoftext|>\" as the special token 50256 (default: as plain text)\n"
    "  --decode         the reverse: read uint16 ids, write the text they stand for\n"
    "  --out FILE       write to FILE instead of standard output\n"
    "\n"
    "examples:\n"
    "  pipeline tokenize input.txt --out input.u16\n"
    "  echo 'Hello world' | pipeline tokenize | od -An -tu2     # 15496 995 198\n"
    "  pipeline tokenize --decode input.u16 > roundtrip.txt\n"
    "  pipeline tokenize input.txt | pipeline tokenize --decode | cmp - input.txt\n";

struct Input {
  std::string name;
  std::string bytes;
};

Input read_input(const std::string& path) {
  Input in;
  if (path == "-") {
    in.name = "<stdin>";
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    in.bytes = std::move(ss).str();
    return in;
  }
  in.name = path;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  in.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (f.bad()) throw std::runtime_error("error reading " + path);
  return in;
}

int tokenize_main(const std::vector<std::string>& args) {
  bool allow_special = false;
  bool decode = false;
  std::string out_path;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--allow-special") {
      allow_special = true;
    } else if (a == "--decode") {
      decode = true;
    } else if (a == "--out") {
      if (i + 1 >= args.size()) throw std::invalid_argument("--out needs a file name (see pipeline tokenize --help)");
      out_path = args[++i];
    } else if (a.size() > 1 && a[0] == '-') {
      throw std::invalid_argument("unknown option '" + a + "' (see pipeline tokenize --help)");
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) files.push_back("-");
  if (decode && allow_special) throw std::invalid_argument("--allow-special has no meaning with --decode");

  std::optional<pipeline::AtomicFile> file;  // --out: written atomically, removed on error
  if (!out_path.empty()) file.emplace(out_path);
  auto write = [&](const void* data, size_t size) {
    if (file) {
      file->write(data, size);
    } else if (size > 0 && std::fwrite(data, 1, size, stdout) != size) {
      throw std::runtime_error(std::string("cannot write <stdout>: ") + std::strerror(errno));
    }
  };

  const auto& tok = pipeline::datasets::Tokenizer::gpt2();
  std::vector<uint32_t> ids;
  std::string buf;
  for (const std::string& path : files) {
    const Input in = read_input(path);
    if (decode) {
      if (in.bytes.size() % 2 != 0)
        throw std::runtime_error(in.name + ": odd byte count " + std::to_string(in.bytes.size()) +
                                 "; --decode expects little-endian uint16 token ids (2 bytes each)");
      ids.resize(in.bytes.size() / 2);
      for (size_t i = 0; i < ids.size(); ++i)
        ids[i] = static_cast<uint8_t>(in.bytes[2 * i]) | (uint32_t{static_cast<uint8_t>(in.bytes[2 * i + 1])} << 8);
      buf.clear();
      try {
        tok.decode_append(ids, buf);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(in.name + ": " + e.what());
      }
      write(buf.data(), buf.size());
    } else {
      ids.clear();
      tok.encode_append(in.bytes, allow_special, ids);
      buf.resize(ids.size() * 2);
      for (size_t i = 0; i < ids.size(); ++i) {
        buf[2 * i] = static_cast<char>(ids[i] & 0xFF);
        buf[2 * i + 1] = static_cast<char>(ids[i] >> 8);
      }
      write(buf.data(), buf.size());
    }
  }
  if (file)
    file->commit();
  else if (std::fflush(stdout) != 0)
    throw std::runtime_error(std::string("cannot write <stdout>: ") + std::strerror(errno));
  return 0;
}

}  // namespace

PIPELINE_COMMAND({"tokenize", "encode text to GPT-2 token ids (uint16) or --decode them", usage, &tokenize_main});
