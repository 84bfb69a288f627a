// Tests for graph/config: TOML and --set parsed into typed sections, and every kind of bad
// input rejected with a message naming the file, line, key and what was expected.
#include <doctest/doctest.h>

#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <unistd.h>

#include "base/config.h"
#include "base/json.h"

using namespace pipeline;
using namespace pipeline::config;

namespace {

using test_util::contains;

std::string json_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pipeline::JsonParseError& e) {
    return e.what();
  }
  return {};
}

Schema model_schema() {
  Schema s("model");
  s.string("preset", "tiny", "model size preset", {"tiny", "gpt2"})
      .integer("n_layer", 2, "transformer blocks", 1, 128)
      .floating("dropout", 0.0, "dropout probability", 0.0, 1.0)
      .boolean("bias", true, "biases in linear layers")
      .string_list("input", std::vector<std::string>{}, "upstream stages");
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("values from the file, defaults and their origins") {
  auto doc = Document::parse("[model]\npreset = \"gpt2\"\nn_layer = 12\ndropout = 0\n", "m.toml");
  auto s = doc.resolve("model", model_schema());
  CHECK(s.get_string("preset") == "gpt2");
  CHECK(s.get_int("n_layer") == 12);
  CHECK(s.get_float("dropout") == 0.0);  // an integer is accepted where a number is expected
  CHECK(s.get_bool("bias") == true);
  CHECK(s.where("n_layer").str() == "m.toml:3");
  CHECK(s.was_set("n_layer"));
  CHECK_FALSE(s.was_set("bias"));
  CHECK(s.where("bias").source == "default");
}

TEST_CASE("unknown key names the file, line, section and the keys that exist") {
  auto doc = Document::parse("[model]\n\nn_layers = 4\n", "bad.toml");
  auto msg = error_of([&] { doc.resolve("model", model_schema()); });
  CHECK(contains(msg, "bad.toml:3"));
  CHECK(contains(msg, "unknown key 'n_layers'"));
  CHECK(contains(msg, "n_layer"));
}

TEST_CASE("wrong type and out-of-range values say what was expected and what was found") {
  auto t = error_of([] { Document::parse("[model]\nn_layer = \"four\"\n", "t.toml").resolve("model", model_schema()); });
  CHECK(contains(t, "t.toml:2"));
  CHECK(contains(t, "n_layer"));
  CHECK(contains(t, "expected an integer"));
  CHECK(contains(t, "\"four\""));

  auto r = error_of([] { Document::parse("[model]\nn_layer = 0\n", "r.toml").resolve("model", model_schema()); });
  CHECK(contains(r, "r.toml:2"));
  CHECK(contains(r, "[1, 128]"));
  CHECK(contains(r, "got 0"));

  auto c = error_of([] { Document::parse("[model]\npreset = \"huge\"\n", "c.toml").resolve("model", model_schema()); });
  CHECK(contains(c, "c.toml:2"));
  CHECK(contains(c, "one of tiny, gpt2"));

  auto f = error_of([] { Document::parse("[model]\ndropout = 1.5\n", "f.toml").resolve("model", model_schema()); });
  CHECK(contains(f, "dropout"));
  CHECK(contains(f, "got 1.5"));

  auto l = error_of([] { Document::parse("[model]\ninput = [\"a\", 3]\n", "l.toml").resolve("model", model_schema()); });
  CHECK(contains(l, "input"));
  CHECK(contains(l, "list of strings"));
}

TEST_CASE("required keys and string lists") {
  Schema s("stage");
  s.string("type", std::nullopt, "stage type").string_list("input", std::vector<std::string>{}, "inputs");
  auto miss = error_of([&] { Document::parse("[stage]\ninput = \"a\"\n", "q.toml").resolve("stage", s); });
  CHECK(contains(miss, "missing required key 'type'"));
  CHECK(contains(miss, "q.toml"));

  auto one = Document::parse("[stage]\ntype = \"x\"\ninput = \"a\"\n", "q.toml").resolve("stage", s);
  CHECK(one.get_string_list("input") == std::vector<std::string>{"a"});
  auto two = Document::parse("[stage]\ntype = \"x\"\ninput = [\"a\", \"b\"]\n", "q.toml").resolve("stage", s);
  CHECK(two.get_string_list("input") == std::vector<std::string>{"a", "b"});
}

TEST_CASE("TOML syntax errors carry line and column") {
  auto msg = error_of([] { Document::parse("[model]\nn_layer = = 3\n", "syn.toml"); });
  CHECK(contains(msg, "syn.toml:2:"));
  CHECK(contains(msg, "invalid TOML"));
}

TEST_CASE("--set overrides use the same names, types and validation") {
  auto doc = Document::parse("[model]\nn_layer = 2\n", "o.toml",
                             {"model.n_layer=6", "model.preset=gpt2", "model.bias=false", "model.dropout=0.25"});
  auto s = doc.resolve("model", model_schema());
  CHECK(s.get_int("n_layer") == 6);
  CHECK(s.get_string("preset") == "gpt2");  // a bare word is a string
  CHECK(s.get_bool("bias") == false);
  CHECK(s.get_float("dropout") == 0.25);
  CHECK(s.where("n_layer").source == "--set");

  auto bad_type = error_of([] {
    Document::parse("", "o.toml", {"model.n_layer=many"}).resolve("model", model_schema());
  });
  CHECK(contains(bad_type, "--set model.n_layer=many"));
  CHECK(contains(bad_type, "expected an integer"));

  auto bad_range = error_of([] { Document::parse("", "o.toml", {"model.n_layer=1000"}).resolve("model", model_schema()); });
  CHECK(contains(bad_range, "--set model.n_layer"));
  CHECK(contains(bad_range, "got 1000"));

  auto bad_key = error_of([] { Document::parse("", "o.toml", {"model.layers=3"}).resolve("model", model_schema()); });
  CHECK(contains(bad_key, "unknown key 'layers'"));

  auto no_eq = error_of([] { Document::parse("", "o.toml", {"model.n_layer"}); });
  CHECK(contains(no_eq, "expected section.key=value"));

  // A bare string may hold what TOML escapes (quotes, backslashes, control characters) and is
  // written back so that it reads again; bytes that are not UTF-8 are refused, as in a file.
  Schema text("model");
  text.string("prompt", "", "any text");
  const std::string odd_value = "a\"b\\c\x02" "d \xc3\xa9";
  auto odd = Document::parse("", "o.toml", {"model.prompt=" + odd_value}).resolve("model", text);
  CHECK(odd.get_string("prompt") == odd_value);
  CHECK(Document::parse(to_toml({odd}), "again.toml").resolve("model", text).get_string("prompt") == odd_value);
  auto not_utf8 = error_of([&] { Document::parse("", "o.toml", {"model.prompt=ab\xff\xfe"}).resolve("model", text); });
  CHECK(contains(not_utf8, "--set model.prompt=ab"));
  CHECK(contains(not_utf8, "[model] prompt: the value is not valid UTF-8"));
}

TEST_CASE("unknown sections and stray keys are reported by check_all_used") {
  auto doc = Document::parse("[model]\nn_layer = 2\n\n[modle]\nx = 1\n", "u.toml");
  doc.resolve("model", model_schema());
  auto msg = error_of([&] { doc.check_all_used(); });
  CHECK(contains(msg, "u.toml:4"));
  CHECK(contains(msg, "unknown section [modle]"));
  CHECK(contains(msg, "model"));

  auto top = Document::parse("lr = 3\n[model]\n", "top.toml");
  top.resolve("model", model_schema());
  CHECK(contains(error_of([&] { top.check_all_used(); }), "top-level key 'lr'"));

  auto set = Document::parse("[model]\n", "s.toml", {"optimizer.lr=3"});
  set.resolve("model", model_schema());
  CHECK(contains(error_of([&] { set.check_all_used(); }), "unknown section [optimizer]"));

  auto ok = Document::parse("[model]\n[stages.a]\ntype = \"x\"\n", "ok.toml");
  ok.resolve("model", model_schema());
  Schema st("stage");
  st.string("type", std::nullopt, "type");
  ok.resolve("stages.a", st);
  CHECK_NOTHROW(ok.check_all_used());
}

TEST_CASE("nested sections are listed in file order, --set ones last") {
  auto doc = Document::parse("[stages.zeta]\ntype=\"a\"\n[stages.alpha]\ntype=\"b\"\n", "n.toml",
                             {"stages.extra.type=c"});
  CHECK(doc.subsections("stages") == std::vector<std::string>{"zeta", "alpha", "extra"});
  CHECK(doc.has_section("stages.alpha"));
  CHECK(doc.has_section("stages.extra"));
  CHECK_FALSE(doc.has_section("stages.beta"));
  CHECK(doc.section_line("stages.alpha") == 3);
}

TEST_CASE("--set TABLE= removes a table; errors about a --set value name the --set") {
  const std::string text = "[stages.read]\ntype=\"a\"\n[stages.tokenize]\ntype=\"b\"\nworkers=2\n[model]\nn_layer=3\n";
  // A stage leaves the graph, with every earlier --set into it; a later --set makes it again.
  auto doc = Document::parse(text, "r.toml", {"stages.tokenize.workers=4", "stages.tokenize="});
  CHECK(doc.subsections("stages") == std::vector<std::string>{"read"});
  CHECK_FALSE(doc.has_section("stages.tokenize"));
  CHECK(doc.removed() == std::vector<std::string>{"stages.tokenize="});
  auto again = Document::parse(text, "r.toml", {"stages.tokenize=", "stages.tokenize.type=c"});
  CHECK(again.subsections("stages") == std::vector<std::string>{"read", "tokenize"});
  CHECK(again.peek("stages.tokenize", "type") == Value{std::string("c")});
  CHECK_FALSE(again.peek("stages.tokenize", "workers"));
  // A section of the run goes back to its defaults.
  CHECK(Document::parse(text, "r.toml", {"model="}).resolve("model", model_schema()).get_int("n_layer") == 2);
  // A key set to nothing is still a key (an empty string), not a removal.
  Schema run("run");
  run.string("dir", "runs/x", "the run directory");
  auto empty = Document::parse("[run]\ndir = \"a\"\n", "r.toml", {"run.dir="}).resolve("run", run);
  CHECK(empty.get_string("dir").empty());
  CHECK(empty.where("dir").str() == "--set run.dir=");
  // Nothing to remove, or a key of a section that only holds tables: named, never ignored.
  auto nothing = Document::parse(text, "r.toml", {"stages.nope="});
  nothing.mark_known("stages");
  nothing.mark_known("model");
  auto msg = error_of([&] { nothing.check_all_used(); });
  CHECK(contains(msg, "--set stages.nope=: there is no table [stages.nope] to remove"));
  CHECK(contains(msg, "its tables: stages.read, stages.tokenize"));
  auto key = Document::parse(text, "r.toml", {"stages.workers=3"});
  key.mark_known("stages");
  key.mark_known("model");
  CHECK(contains(error_of([&] { key.check_all_used(); }), "[stages] holds tables, not keys"));
  // `--set key value` splits a --set in two: the first half has no '='.
  CHECK(contains(error_of([] { Document::parse("", "o.toml", {"training.steps"}); }),
                 "--set training.steps: expected section.key=value (no '=' in it"));

  // A check made after resolve (Section::error) names the --set that gave the value, as the
  // type and range checks do.
  auto sec = Document::parse(text, "r.toml", {"model.dropout=0.5"}).resolve("model", model_schema());
  CHECK(std::string(sec.error("dropout", "too much").what()) == "--set model.dropout=0.5: [model] dropout: too much");
  CHECK(std::string(sec.error("n_layer", "odd").what()) == "r.toml:7: [model] n_layer: odd");
  auto range = error_of([] { Document::parse("", "o.toml", {"model.n_layer=1000"}).resolve("model", model_schema()); });
  CHECK(contains(range, "--set model.n_layer=1000: [model] n_layer: expected a value in"));
}

TEST_CASE("print_table shows every key, its value and origin") {
  auto doc = Document::parse("[model]\nn_layer = 4\n", "p.toml", {"model.bias=false"});
  std::ostringstream os;
  print_table(os, {doc.resolve("model", model_schema())});
  auto t = os.str();
  CHECK(contains(t, "model.n_layer"));
  CHECK(contains(t, "line 2"));
  CHECK(contains(t, "--set"));
  CHECK(contains(t, "default"));
  CHECK(contains(t, "\"tiny\""));
}

TEST_CASE("find_config looks in pipelines/ for bare names and lists where it looked") {
  namespace fs = std::filesystem;
  auto root = fs::temp_directory_path() / ("pipeline_cfg_" + std::to_string(::getpid()));
  fs::create_directories(root / "pipelines");
  std::ofstream(root / "pipelines" / "x.toml") << "[model]\n";
  CHECK(find_config("x.toml", root) == root / "pipelines" / "x.toml");
  CHECK(find_config("x", root) == root / "pipelines" / "x.toml");
  auto msg = error_of([&] { find_config("nope.toml", root); });
  CHECK(contains(msg, "nope.toml: config file not found"));
  CHECK(contains(msg, (root / "pipelines" / "nope.toml").string()));
  CHECK_THROWS_AS(Document::load(root / "missing.toml"), ConfigError);
  fs::remove_all(root);
}

TEST_CASE("to_toml writes sections that read back to the same values") {
  Schema s("model");
  s.string("prompt", "", "text").floating("lr", 0.0, "rate").integer("n", 0, "count").boolean("b", false, "flag")
      .string_list("input", std::vector<std::string>{}, "inputs");
  auto doc = Document::parse(
      "[stages.x]\nprompt = \"a \\\"quoted\\\"\\nline\\twith\\\\ tab\"\nlr = 3e-4\nn = 5\nb = true\ninput = [\"p\", \"q\"]\n",
      "w.toml", {"stages.x.lr=2"});
  auto first = doc.resolve("stages.x", s);
  auto text = to_toml({first});
  auto again = Document::parse(text, "again.toml").resolve("stages.x", s);
  CHECK(again.get_string("prompt") == "a \"quoted\"\nline\twith\\ tab");
  CHECK(again.get_float("lr") == 2.0);
  CHECK(again.get_int("n") == 5);
  CHECK(again.get_bool("b"));
  CHECK(again.get_string_list("input") == std::vector<std::string>{"p", "q"});
  CHECK(contains(text, "[stages.x]"));
}

TEST_CASE("JSON: values, escapes, accessors, and errors with line, column and offset") {
  JsonValue v = json_parse(R"({"a": [1, -2.5e3, true, null], "s": "x\"\u00e9\ud83d\ude00\n"})");
  REQUIRE(v.type == JsonValue::Type::object);
  CHECK(v.find("a")->items.size() == 4);
  CHECK(v.find("a")->items[1].text == "-2.5e3");
  CHECK(v.find("s")->text == "x\"\xc3\xa9\xf0\x9f\x98\x80\n");
  CHECK(json_parse(json_quote(std::string("a\"\\\n\x01 b", 8))).text == std::string("a\"\\\n\x01 b", 8));
  std::string err = json_error_of([] { json_parse("{\n  \"a\": 1,\n  \"b\" 2\n}"); });
  CHECK(err.find("line 3, column 7") != std::string::npos);
  CHECK(err.find("expected ':'") != std::string::npos);
  CHECK(!json_error_of([] { json_parse("[1, 2] 3"); }).empty());
  CHECK(!json_error_of([] { json_parse("01"); }).empty());
  auto o = json_parse(R"({"n": 3.5, "b": true, "l": [1], "s": "t"})");
  CHECK(o.number("n") == 3.5);
  CHECK(o.number("missing", 7) == 7);
  CHECK(o.flag("b"));
  CHECK(o.string("s") == "t");
  CHECK(o.string("n", "d") == "d");  // wrong type: the default
  CHECK(o.array("l").size() == 1);
  CHECK(o.array("s").empty());
}
