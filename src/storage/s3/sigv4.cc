#include "storage/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace cairn::s3 {

namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// SigV4's Trimall: no whitespace at either end, inner runs as one space.
std::string trim_all(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  bool pending_space = false;
  for (char c : v) {
    if (is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::array<unsigned char, 32> hmac_sha256(std::span<const unsigned char> key,
                                          std::string_view msg) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    // OpenSSL fails here only without memory or with a broken provider setup.
    throw std::runtime_error("OpenSSL HMAC-SHA256 failed");
  }
  return out;
}

template <size_t N>
std::array<unsigned char, N> digest(const EVP_MD* md, std::span<const std::byte> data) {
  std::array<unsigned char, N> out{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, md, nullptr) != 1 || len != N) {
    throw std::runtime_error(fmt::format("OpenSSL {} failed", EVP_MD_get0_name(md)));
  }
  return out;
}

bool has_header(const Headers& headers, std::string_view lower_name) {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return lowercase(h.first) == lower_name; });
}

}  // namespace

std::string hex(std::span<const unsigned char> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 0xf]);
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> data) {
  return hex(digest<32>(EVP_sha256(), data));
}

std::string sha256_hex(std::string_view data) { return sha256_hex(bytes_of(data)); }

std::string md5_base64(std::span<const std::byte> data) {
  Md5 md5;
  md5.update(data);
  return md5.base64();
}

std::string md5_base64(std::string_view data) { return md5_base64(bytes_of(data)); }

Md5::Md5() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_md5(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::runtime_error("OpenSSL MD5 failed");
  }
}

Md5::~Md5() { EVP_MD_CTX_free(ctx_); }

void Md5::update(std::span<const std::byte> data) {
  if (EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1) {
    throw std::runtime_error("OpenSSL MD5 failed");
  }
}

std::string Md5::base64() {
  std::array<unsigned char, 16> md5{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_, md5.data(), &len) != 1 || len != md5.size()) {
    throw std::runtime_error("OpenSSL MD5 failed");
  }
  unsigned char out[4 * ((16 + 2) / 3) + 1];
  const int n = EVP_EncodeBlock(out, md5.data(), static_cast<int>(md5.size()));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string uri_encode(std::string_view s, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_unreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 0xf]);
    }
  }
  return out;
}

std::string canonical_query_string(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(uri_encode(name, true), uri_encode(value, true));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out.push_back('&');
    out += name;
    out.push_back('=');
    out += value;
  }
  return out;
}

Headers canonical_headers(const Headers& headers) {
  Headers lowered;
  lowered.reserve(headers.size());
  for (const auto& [name, value] : headers) lowered.emplace_back(lowercase(name), trim_all(value));
  std::stable_sort(lowered.begin(), lowered.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  Headers merged;
  for (auto& [name, value] : lowered) {
    if (!merged.empty() && merged.back().first == name) {
      merged.back().second.push_back(',');
      merged.back().second += value;
    } else {
      merged.emplace_back(std::move(name), std::move(value));
    }
  }
  return merged;
}

std::string signed_headers(const Headers& headers) {
  std::string out;
  for (const auto& [name, value] : canonical_headers(headers)) {
    if (!out.empty()) out.push_back(';');
    out += name;
  }
  return out;
}

std::string canonical_request(const SigningRequest& r) {
  const Headers headers = canonical_headers(r.headers);
  if (!std::any_of(headers.begin(), headers.end(),
                   [](const auto& h) { return h.first == "host"; })) {
    throw std::invalid_argument("SigV4: the request to sign has no host header");
  }
  std::string out;
  out += r.method;
  out.push_back('\n');
  out += r.path.empty() ? std::string_view("/") : r.path;
  out.push_back('\n');
  out += canonical_query_string(r.query);
  out.push_back('\n');
  std::string names;
  for (const auto& [name, value] : headers) {
    out += name;
    out.push_back(':');
    out += value;
    out.push_back('\n');
    if (!names.empty()) names.push_back(';');
    names += name;
  }
  out.push_back('\n');
  out += names;
  out.push_back('\n');
  out += r.payload_sha256;
  return out;
}

std::string amz_date(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto secs = floor<seconds>(t);
  const auto day = floor<days>(secs);
  const year_month_day ymd(day);
  const hh_mm_ss hms(secs - day);
  return fmt::format("{:04}{:02}{:02}T{:02}{:02}{:02}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                     hms.hours().count(), hms.minutes().count(), hms.seconds().count());
}

std::string string_to_sign(std::chrono::system_clock::time_point t, std::string_view region,
                           std::string_view service, std::string_view canonical_request) {
  const std::string date = amz_date(t);
  return fmt::format("{}\n{}\n{}/{}/{}/aws4_request\n{}", kAlgorithm, date,
                     std::string_view(date).substr(0, 8), region, service,
                     sha256_hex(canonical_request));
}

std::array<unsigned char, 32> signing_key(std::string_view secret, std::string_view yyyymmdd,
                                          std::string_view region, std::string_view service) {
  const std::string k_secret = fmt::format("AWS4{}", secret);
  const auto k_date = hmac_sha256(
      {reinterpret_cast<const unsigned char*>(k_secret.data()), k_secret.size()}, yyyymmdd);
  const auto k_region = hmac_sha256(k_date, region);
  const auto k_service = hmac_sha256(k_region, service);
  return hmac_sha256(k_service, "aws4_request");
}

Headers sign_request(const SigningRequest& r, const Credentials& c, std::string_view region,
                     std::string_view service, std::chrono::system_clock::time_point now) {
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    throw std::invalid_argument("SigV4: credentials without an access key id or secret");
  }
  const bool s3 = service == "s3";
  for (std::string_view name :
       {"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"}) {
    if (name == "x-amz-content-sha256" && !s3) continue;
    if (has_header(r.headers, name)) {
      throw std::invalid_argument(
          fmt::format("SigV4: the request to sign already has a {} header", name));
    }
  }

  const std::string date = amz_date(now);
  Headers added;
  added.emplace_back("x-amz-date", date);
  if (s3) added.emplace_back("x-amz-content-sha256", std::string(r.payload_sha256));
  if (!c.session_token.empty()) added.emplace_back("x-amz-security-token", c.session_token);

  SigningRequest full = r;
  full.headers.insert(full.headers.end(), added.begin(), added.end());
  const std::string creq = canonical_request(full);
  const std::string sts = string_to_sign(now, region, service, creq);
  const auto key =
      signing_key(c.secret_access_key, std::string_view(date).substr(0, 8), region, service);
  const std::string signature = hex(hmac_sha256(key, sts));

  added.emplace_back("authorization",
                     fmt::format("{} Credential={}/{}/{}/{}/aws4_request, SignedHeaders={}, "
                                 "Signature={}",
                                 kAlgorithm, c.access_key_id, std::string_view(date).substr(0, 8),
                                 region, service, signed_headers(full.headers), signature));
  return added;
}

}  // namespace cairn::s3
