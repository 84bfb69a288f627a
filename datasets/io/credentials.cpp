// S3 settings and keys from [data], the environment and the AWS files; the Hub's token
// (credentials.h). The AWS files are INI files; GLib's key-file parser reads them (lines of any
// length: a session token runs to a thousand characters).
#include "datasets/io/credentials.h"

#include <glib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "datasets/dataset_error.h"
#include "datasets/io/url.h"

namespace pipeline::datasets::io {
namespace fs = std::filesystem;
namespace {

std::optional<std::string> nonempty(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

// One AWS INI file, parsed. Its path is printed in errors; its values never are.
class AwsFile {
 public:
  AwsFile(fs::path path, bool explicit_path) : path_(std::move(path)) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      if (explicit_path) throw DatasetError(path_.string() + ": cannot read this AWS file (named by the environment)");
      return;
    }
    std::stringstream text;
    text << in.rdbuf();
    // botocore takes ';' comments as well as '#' ones; GLib takes '#' only.
    std::string data, line;
    while (std::getline(text, line)) {
      const auto first = line.find_first_not_of(" \t");
      if (first != std::string::npos && line[first] == ';') line[first] = '#';
      data += line + "\n";
    }
    file_.reset(g_key_file_new());
    GError* error = nullptr;
    if (!g_key_file_load_from_data(file_.get(), data.data(), data.size(), G_KEY_FILE_NONE, &error)) {
      // GLib's message quotes the offending line, which may hold a key: name the file only.
      const std::string why = error->domain == G_KEY_FILE_ERROR && error->code == G_KEY_FILE_ERROR_PARSE
                                  ? "a line that is neither [section], key = value nor a # comment"
                                  : "cannot parse it";
      g_error_free(error);
      throw DatasetError(path_.string() + ": not an AWS credentials/config file (" + why + ")");
    }
  }
  bool has_section(const std::string& section) const {
    return file_ && g_key_file_has_group(file_.get(), section.c_str());
  }
  std::optional<std::string> get(const std::string& section, const std::string& key) const {
    if (!file_) return std::nullopt;
    gchar* v = g_key_file_get_value(file_.get(), section.c_str(), key.c_str(), nullptr);
    if (!v) return std::nullopt;
    std::string out = trim(v);
    g_free(v);
    if (out.empty()) return std::nullopt;
    return out;
  }
  const fs::path& path() const { return path_; }

 private:
  struct Free {
    void operator()(GKeyFile* k) const { g_key_file_free(k); }
  };
  fs::path path_;
  std::unique_ptr<GKeyFile, Free> file_;
};

fs::path aws_file(const EnvLookup& env, const std::string& var, const std::string& name, bool& explicit_path) {
  if (auto v = nonempty(env, var)) {
    explicit_path = true;
    return *v;
  }
  explicit_path = false;
  const auto home = nonempty(env, "HOME");
  return fs::path(home ? *home : std::string("/")) / ".aws" / name;
}

std::string check_endpoint(std::string endpoint, const std::string& from) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  RemoteUrl u;
  try {
    u = parse_remote_url(endpoint);
  } catch (const DatasetError& e) {
    throw DatasetError(from + ": " + e.what());
  }
  if (u.scheme != "https" && u.scheme != "http")
    throw DatasetError(from + ": the S3 endpoint is an http(s) URL, as https://s3.example.com or http://127.0.0.1:9000");
  if (u.path != "/" || !u.query.empty())
    throw DatasetError(from + ": an S3 endpoint is scheme://host[:port] alone (" + u.redacted() + " has a path)");
  return u.scheme + "://" + u.host;
}

}  // namespace

std::string S3Access::describe() const {
  std::string out = "endpoint " + endpoint + " (" + endpoint_from + "), " + (path_style ? "path-style" : "virtual-hosted") +
                    ", region " + region + " (" + region_from + "), ";
  out += key_id.empty() ? "no keys (unsigned requests: public buckets only)" : "keys from " + keys_from;
  return out;
}

S3Access resolve_s3_access(const S3Settings& settings, const EnvLookup& env) {
  S3Access a;
  std::string profile = settings.profile;
  bool profile_named = !profile.empty();
  std::string profile_from = "[data] profile";
  if (profile.empty()) {
    if (auto p = nonempty(env, "AWS_PROFILE")) {
      profile = *p;
      profile_named = true;
      profile_from = "AWS_PROFILE";
    } else {
      profile = "default";
    }
  }
  bool cred_explicit = false, config_explicit = false;
  const AwsFile credentials(aws_file(env, "AWS_SHARED_CREDENTIALS_FILE", "credentials", cred_explicit), cred_explicit);
  const AwsFile config(aws_file(env, "AWS_CONFIG_FILE", "config", config_explicit), config_explicit);
  // ~/.aws/config names a profile's section "profile NAME" (the default one "default").
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  if (profile_named && !credentials.has_section(profile) && !config.has_section(config_section))
    throw DatasetError("AWS profile '" + profile + "' (" + profile_from + ") is in neither " +
                       credentials.path().string() + " nor " + config.path().string());
  auto from_config = [&](const std::string& key) { return config.get(config_section, key); };
  auto where = [&](const AwsFile& f) { return "profile '" + profile + "' in " + f.path().string(); };

  // Region.
  if (!settings.region.empty()) {
    a.region = settings.region;
    a.region_from = "[data] region";
  } else if (auto r = nonempty(env, "AWS_REGION")) {
    a.region = *r;
    a.region_from = "AWS_REGION";
  } else if (auto r2 = nonempty(env, "AWS_DEFAULT_REGION")) {
    a.region = *r2;
    a.region_from = "AWS_DEFAULT_REGION";
  } else if (auto r3 = from_config("region")) {
    a.region = *r3;
    a.region_from = where(config);
  } else {
    a.region_from = "the default";
  }

  // Endpoint: a custom one is an S3-compatible server, which wants path-style addressing.
  if (!settings.endpoint.empty()) {
    a.endpoint = check_endpoint(settings.endpoint, "[data] endpoint");
    a.endpoint_from = "[data] endpoint";
  } else if (auto e = nonempty(env, "AWS_ENDPOINT_URL_S3")) {
    a.endpoint = check_endpoint(*e, "AWS_ENDPOINT_URL_S3");
    a.endpoint_from = "AWS_ENDPOINT_URL_S3";
  } else if (auto e2 = nonempty(env, "AWS_ENDPOINT_URL")) {
    a.endpoint = check_endpoint(*e2, "AWS_ENDPOINT_URL");
    a.endpoint_from = "AWS_ENDPOINT_URL";
  } else if (auto e3 = from_config("endpoint_url")) {
    a.endpoint = check_endpoint(*e3, where(config) + ": endpoint_url");
    a.endpoint_from = where(config);
  }
  if (a.endpoint.empty()) {
    a.endpoint = "https://s3." + a.region + ".amazonaws.com";
    a.endpoint_from = "AWS's, for the region";
  } else {
    a.path_style = true;
  }

  // Keys: the environment's pair, else the profile's (credentials file first), as the AWS CLI
  // takes them; a profile named in [data] wins over the environment, as its --profile does.
  auto key_id = settings.profile.empty() ? nonempty(env, "AWS_ACCESS_KEY_ID") : std::nullopt;
  auto secret = settings.profile.empty() ? nonempty(env, "AWS_SECRET_ACCESS_KEY") : std::nullopt;
  if (key_id || secret) {
    if (!key_id || !secret)
      throw DatasetError(std::string(key_id ? "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY"
                                            : "AWS_SECRET_ACCESS_KEY is set without AWS_ACCESS_KEY_ID") +
                         ": export both, or neither to use a profile");
    a.key_id = *key_id;
    a.secret = Secret(*secret);
    if (auto t = nonempty(env, "AWS_SESSION_TOKEN")) a.session_token = Secret(*t);
    a.keys_from = "the environment (AWS_ACCESS_KEY_ID)";
    return a;
  }
  for (const AwsFile* f : {&credentials, &config}) {
    const std::string section = f == &credentials ? profile : config_section;
    auto id = f->get(section, "aws_access_key_id");
    auto sec = f->get(section, "aws_secret_access_key");
    if (!id && !sec) continue;
    if (!id || !sec)
      throw DatasetError(f->path().string() + ": [" + section + "] has " +
                         (id ? "aws_access_key_id without aws_secret_access_key" : "aws_secret_access_key without aws_access_key_id"));
    a.key_id = *id;
    a.secret = Secret(*sec);
    if (auto t = f->get(section, "aws_session_token")) a.session_token = Secret(*t);
    a.keys_from = where(*f);
    return a;
  }
  a.keys_from = "none found";
  return a;
}

Secret http_token_for(const std::string& host, const EnvLookup& env) {
  auto token = nonempty(env, "HF_TOKEN");
  if (!token) return {};
  std::string hub_host = "huggingface.co";
  if (auto endpoint = nonempty(env, "HF_ENDPOINT")) {
    try {
      hub_host = parse_remote_url(*endpoint).host;
    } catch (const DatasetError&) {
      return {};  // the hf:// resolution reports a bad HF_ENDPOINT; no token goes anywhere meanwhile
    }
  }
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  return lower(host) == lower(hub_host) ? Secret(*token) : Secret();
}

}  // namespace pipeline::datasets::io
