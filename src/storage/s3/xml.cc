#include "storage/s3/xml.h"

#include <charconv>
#include <cstring>
#include <ctime>
#include <sstream>

#include <fmt/format.h>
#include <pugixml.hpp>

#include "cairn/error.h"

namespace cairn::s3 {
namespace {

pugi::xml_document load(std::string_view xml, std::string_view what) {
  pugi::xml_document doc;
  pugi::xml_parse_result r = doc.load_buffer(xml.data(), xml.size(), pugi::parse_default);
  if (!r) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: malformed XML reply at byte offset {}: {}",
                                                    what, r.offset, r.description()));
  }
  return doc;
}

pugi::xml_node root_named(const pugi::xml_document& doc, const char* name, std::string_view what) {
  pugi::xml_node root = doc.document_element();
  if (std::strcmp(root.name(), name) != 0) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: expected an XML <{}> reply, got <{}>", what, name, root.name()));
  }
  return root;
}

std::string text(pugi::xml_node parent, const char* child) {
  return parent.child(child).text().as_string();
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Keys come back percent-encoded when the server honoured encoding-type=url.
std::string url_decode(std::string_view s, std::string_view what) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      int hi = i + 2 < s.size() ? hex_digit(s[i + 1]) : -1;
      int lo = i + 2 < s.size() ? hex_digit(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        throw Error(ErrorCode::kCorruption,
                    fmt::format("{}: bad percent-encoding in key \"{}\"", what, s));
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

uint64_t parse_u64(std::string_view s, std::string_view field, std::string_view what) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
    throw Error(ErrorCode::kCorruption, fmt::format("{}: bad {} \"{}\"", what, field, s));
  }
  return v;
}

bool is_true(pugi::xml_node parent, const char* child) { return text(parent, child) == "true"; }

std::string xml_text(const pugi::xml_document& doc) {
  std::ostringstream out;
  doc.save(out, "", pugi::format_raw | pugi::format_no_declaration);
  return out.str();
}

}  // namespace

S3ErrorBody parse_error_body(std::string_view xml) {
  S3ErrorBody e;
  if (xml.empty()) return e;
  pugi::xml_document doc;
  if (!doc.load_buffer(xml.data(), xml.size())) return e;
  pugi::xml_node root = doc.document_element();
  if (std::strcmp(root.name(), "Error") != 0) return e;
  e.code = text(root, "Code");
  e.message = text(root, "Message");
  e.request_id = text(root, "RequestId");
  e.region = text(root, "Region");
  return e;
}

ListPage parse_list_objects_v2(std::string_view xml) {
  constexpr std::string_view what = "ListObjectsV2";
  pugi::xml_document doc = load(xml, what);
  pugi::xml_node root = root_named(doc, "ListBucketResult", what);
  bool encoded = text(root, "EncodingType") == "url";
  ListPage page;
  for (pugi::xml_node c : root.children("Contents")) {
    ListedObject o;
    std::string key = text(c, "Key");
    o.key = encoded ? url_decode(key, what) : key;
    o.size = parse_u64(text(c, "Size"), "Size", what);
    o.modified = parse_iso8601(text(c, "LastModified")).value_or(0.0);
    page.objects.push_back(std::move(o));
  }
  page.truncated = is_true(root, "IsTruncated");
  page.next_token = text(root, "NextContinuationToken");
  if (page.truncated && page.next_token.empty()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("{}: a truncated listing without NextContinuationToken", what));
  }
  return page;
}

UploadsPage parse_list_multipart_uploads(std::string_view xml) {
  constexpr std::string_view what = "ListMultipartUploads";
  pugi::xml_document doc = load(xml, what);
  pugi::xml_node root = root_named(doc, "ListMultipartUploadsResult", what);
  bool encoded = text(root, "EncodingType") == "url";
  UploadsPage page;
  for (pugi::xml_node u : root.children("Upload")) {
    std::string key = text(u, "Key");
    page.uploads.push_back({encoded ? url_decode(key, what) : key, text(u, "UploadId")});
  }
  page.truncated = is_true(root, "IsTruncated");
  page.next_key_marker = text(root, "NextKeyMarker");
  if (encoded) page.next_key_marker = url_decode(page.next_key_marker, what);
  page.next_upload_id_marker = text(root, "NextUploadIdMarker");
  return page;
}

std::string parse_initiate_multipart(std::string_view xml) {
  constexpr std::string_view what = "CreateMultipartUpload";
  pugi::xml_document doc = load(xml, what);
  pugi::xml_node root = root_named(doc, "InitiateMultipartUploadResult", what);
  std::string id = text(root, "UploadId");
  if (id.empty()) throw Error(ErrorCode::kCorruption, fmt::format("{}: no UploadId", what));
  return id;
}

std::optional<S3ErrorBody> parse_complete_multipart(std::string_view xml) {
  constexpr std::string_view what = "CompleteMultipartUpload";
  pugi::xml_document doc = load(xml, what);
  std::string_view name = doc.document_element().name();
  if (name == "Error") return parse_error_body(xml);
  root_named(doc, "CompleteMultipartUploadResult", what);
  return std::nullopt;
}

std::vector<DeleteFailure> parse_delete_result(std::string_view xml) {
  constexpr std::string_view what = "DeleteObjects";
  pugi::xml_document doc = load(xml, what);
  pugi::xml_node root = root_named(doc, "DeleteResult", what);
  std::vector<DeleteFailure> out;
  for (pugi::xml_node e : root.children("Error")) {
    out.push_back({text(e, "Key"), text(e, "Code"), text(e, "Message")});
  }
  return out;
}

std::string complete_multipart_body(const std::vector<CompletedPart>& parts) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  for (const CompletedPart& p : parts) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber").text().set(p.number);
    part.append_child("ETag").text().set(p.etag.c_str());
  }
  return xml_text(doc);
}

std::string delete_objects_body(const std::vector<std::string>& keys) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("Delete");
  root.append_child("Quiet").text().set("true");
  for (const std::string& k : keys) {
    root.append_child("Object").append_child("Key").text().set(k.c_str());
  }
  return xml_text(doc);
}

std::optional<double> parse_iso8601(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SS[.fff]Z
  std::tm tm{};
  int frac_ms = 0;
  if (s.size() < 20) return std::nullopt;
  auto num = [&](size_t at, size_t len, int& out) {
    auto [p, ec] = std::from_chars(s.data() + at, s.data() + at + len, out);
    return ec == std::errc() && p == s.data() + at + len;
  };
  int year, mon, day, hour, min, sec;
  if (!num(0, 4, year) || s[4] != '-' || !num(5, 2, mon) || s[7] != '-' || !num(8, 2, day) ||
      s[10] != 'T' || !num(11, 2, hour) || s[13] != ':' || !num(14, 2, min) || s[16] != ':' ||
      !num(17, 2, sec)) {
    return std::nullopt;
  }
  size_t at = 19;
  if (at < s.size() && s[at] == '.') {
    size_t end = at + 1;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    std::string digits(s.substr(at + 1, std::min<size_t>(end - at - 1, 3)));
    while (digits.size() < 3) digits.push_back('0');
    frac_ms = std::stoi(digits);
    at = end;
  }
  if (at != s.size() - 1 || s[at] != 'Z') return std::nullopt;
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  return static_cast<double>(timegm(&tm)) + frac_ms / 1000.0;
}

std::optional<double> parse_http_date(std::string_view s) {
  std::tm tm{};
  std::string copy(s);
  const char* end = strptime(copy.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return static_cast<double>(timegm(&tm));
}

}  // namespace cairn::s3
