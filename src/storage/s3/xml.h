// S3's XML documents: parsing the responses the backend reads and building the
// request bodies it sends. Pure functions over strings (pugixml underneath),
// unit-tested and fuzzable apart from any I/O.
//
// Failure: a response that is not the document expected throws kCorruption
// naming `what` (the operation) and the problem; a field that may be absent
// is returned empty.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cairn::s3 {

// <Error><Code/><Message/><RequestId/>...</Error>. Empty fields when the body
// is not an S3 error document (a proxy's HTML page, an empty HEAD body).
struct S3ErrorBody {
  std::string code;
  std::string message;
  std::string request_id;
  std::string region;  // <Region>, sent with region mismatches
};
S3ErrorBody parse_error_body(std::string_view xml);

struct ListedObject {
  std::string key;
  uint64_t size = 0;
  double modified = 0.0;  // seconds since the Unix epoch
};

// ListObjectsV2's ListBucketResult.
struct ListPage {
  std::vector<ListedObject> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken
};
ListPage parse_list_objects_v2(std::string_view xml);

// ListMultipartUploads' ListMultipartUploadsResult.
struct ListedUpload {
  std::string key;
  std::string upload_id;
};
struct UploadsPage {
  std::vector<ListedUpload> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};
UploadsPage parse_list_multipart_uploads(std::string_view xml);

// InitiateMultipartUploadResult's UploadId.
std::string parse_initiate_multipart(std::string_view xml);

// CompleteMultipartUpload answers 200 and may still carry an <Error> (S3
// reports failures found after it started streaming the reply that way).
// Returns the error, or nothing when the body is a CompleteMultipartUploadResult.
std::optional<S3ErrorBody> parse_complete_multipart(std::string_view xml);

// DeleteObjects' DeleteResult: the keys that could not be deleted.
struct DeleteFailure {
  std::string key;
  std::string code;
  std::string message;
};
std::vector<DeleteFailure> parse_delete_result(std::string_view xml);

struct CompletedPart {
  int number = 0;
  std::string etag;  // as the server returned it, quotes included
};
std::string complete_multipart_body(const std::vector<CompletedPart>& parts);
// A quiet DeleteObjects request (only failures are reported back).
std::string delete_objects_body(const std::vector<std::string>& keys);

// "2026-11-23T10:15:30.000Z" -> seconds since the epoch; nullopt if malformed.
std::optional<double> parse_iso8601(std::string_view text);
// An HTTP date ("Mon, 23 Nov 2026 10:15:30 GMT") -> seconds; nullopt if malformed.
std::optional<double> parse_http_date(std::string_view text);

}  // namespace cairn::s3
