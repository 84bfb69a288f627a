// Fuzzes the AWS credentials and config files (datasets/io/credentials.h) as resolve_s3_access
// reads them: any bytes either resolve, to access whose description does not depend on its
// secrets, or raise DatasetError, whose message never quotes a secret of the file.
#include <cstdint>
#include <map>
#include <string>

#include "datasets/dataset_error.h"
#include "datasets/io/credentials.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = pipeline::datasets::io;
  static fuzz_util::InputFile file;
  const std::string path = file.write(data, size);
  const std::map<std::string, std::string> vars = {{"HOME", "/nonexistent"},
                                                   {"AWS_SHARED_CREDENTIALS_FILE", path},
                                                   {"AWS_CONFIG_FILE", path}};
  const io::EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  for (const char* profile : {"", "dev"}) {
    try {
      const io::S3Access a = io::resolve_s3_access({.profile = profile}, env);
      // describe() never prints the secret or the session token: it is the same whatever they
      // are. (Searching it for the secret's text is no test: a one-character secret such as ")"
      // is in any description by chance.)
      io::S3Access other = a;
      other.secret = io::Secret(a.secret.reveal() + "\x01other");
      other.session_token = io::Secret(a.session_token.reveal() + "\x01other");
      if (other.describe() != a.describe()) fuzz_util::broken("describe() depends on a secret");
    } catch (const pipeline::datasets::DatasetError& e) {
      // The message names the file and a section, never a secret: no value of a secret key that
      // looks like a key (16 or more characters, no space, a digit in it) is in it, unless the path
      // holds it too. (Other values, a bad endpoint_url, are quoted: they are what to fix.)
      const std::string what = e.what();
      const std::string text(fuzz_util::as_text(data, size));
      // The lines that hold no secret: a secret written inside one of them too is printed as that.
      std::string plain;
      for (size_t at = 0; at < text.size();) {
        const size_t nl = std::min(text.find('\n', at), text.size());
        const std::string line = text.substr(at, nl - at);
        at = nl + 1;
        const std::string key = line.substr(0, line.find('='));
        if (key.find("aws_secret_access_key") == std::string::npos && key.find("aws_session_token") == std::string::npos)
          plain += line + "\n";
      }
      for (size_t at = 0; at < text.size();) {
        const size_t nl = std::min(text.find('\n', at), text.size());
        const std::string line = text.substr(at, nl - at);
        at = nl + 1;
        const size_t eq = line.find('=');
        if (eq == std::string::npos) continue;
        const std::string key = line.substr(0, eq);
        if (key.find("aws_secret_access_key") == std::string::npos && key.find("aws_session_token") == std::string::npos)
          continue;
        std::string value = line.substr(eq + 1);
        while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.erase(0, 1);
        while (!value.empty() && (value.back() == ' ' || value.back() == '\t' || value.back() == '\r')) value.pop_back();
        const bool key_like = value.size() >= 16 && value.find(' ') == std::string::npos &&
                              value.find_first_of("0123456789") != std::string::npos;
        if (key_like && path.find(value) == std::string::npos && plain.find(value) == std::string::npos &&
            what.find(value) != std::string::npos)
          fuzz_util::broken("a value of the file in an error: " + what);
      }
    }
  }
  return 0;
}
