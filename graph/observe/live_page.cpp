// See live_page.h.
#include "graph/observe/live_page.h"

#include <stdexcept>

#include "base/json.h"

namespace pipeline::graph {

// Generated from live_page.html by cmake/embed_text.cmake.
extern const char kLivePageHtml[];
extern const unsigned long kLivePageHtmlSize;

const std::string& live_page_html() {
  static const std::string page(kLivePageHtml, kLivePageHtmlSize);
  return page;
}

namespace {

// JSON inside <script>: a "<" can only occur inside a JSON string, where \u003c means the same
// and cannot close the script element or open a comment.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string run_page_html(const std::vector<Snapshot>& series, const std::vector<Event>& events,
                          const std::string& title) {
  std::string data = "{\"title\":" + json_quote(title) + ",\"series\":[";
  for (size_t i = 0; i < series.size(); ++i) {
    if (i) data += ",";
    data += to_json(series[i]);
  }
  data += "],\"events\":[";
  for (size_t i = 0; i < events.size(); ++i) {
    if (i) data += ",";
    data += to_json(events[i]);
  }
  data += "]}";
  const std::string& page = live_page_html();
  const std::string slot = "<script id=\"run-data\" type=\"application/json\">null</script>";
  const auto at = page.find(slot);
  if (at == std::string::npos) throw std::logic_error("live_page.html has no run-data script");
  std::string out = page.substr(0, at);
  out += "<script id=\"run-data\" type=\"application/json\">" + script_safe(data) + "</script>";
  out += page.substr(at + slot.size());
  return out;
}

}  // namespace pipeline::graph
