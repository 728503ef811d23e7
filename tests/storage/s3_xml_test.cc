// S3's XML replies and request bodies, the retry policy and the lease
// read-back decision: pure functions.
#include <gtest/gtest.h>

#include "cairn/error.h"
#include "storage/s3/lease.h"
#include "storage/s3/retry.h"
#include "storage/s3/xml.h"

namespace cairn::s3 {
namespace {

TEST(S3Xml, ErrorBodyGivesCodeMessageAndRequestId) {
  auto e = parse_error_body(
      "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Reduce your rate</Message>"
      "<RequestId>R1</RequestId></Error>");
  EXPECT_EQ(e.code, "SlowDown");
  EXPECT_EQ(e.message, "Reduce your rate");
  EXPECT_EQ(e.request_id, "R1");
  EXPECT_TRUE(parse_error_body("<html>bad gateway</html>").code.empty());
  EXPECT_TRUE(parse_error_body("").code.empty());
  EXPECT_TRUE(parse_error_body("not xml at all <").code.empty());
}

TEST(S3Xml, ListPageDecodesUrlEncodedKeysAndPagination) {
  auto page = parse_list_objects_v2(
      "<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok</NextContinuationToken>"
      "<Contents><Key>a/b%20c%2B%25</Key><Size>12</Size>"
      "<LastModified>2026-11-23T10:15:30.500Z</LastModified></Contents>"
      "<Contents><Key>z</Key><Size>0</Size><LastModified>x</LastModified></Contents>"
      "</ListBucketResult>");
  ASSERT_EQ(page.objects.size(), 2u);
  EXPECT_EQ(page.objects[0].key, "a/b c+%");
  EXPECT_EQ(page.objects[0].size, 12u);
  EXPECT_DOUBLE_EQ(page.objects[0].modified, 1795428930.5);
  EXPECT_TRUE(page.truncated);
  EXPECT_EQ(page.next_token, "tok");
}

TEST(S3Xml, KeysAreLiteralWhenTheServerIgnoredUrlEncoding) {
  auto page = parse_list_objects_v2(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a%41</Key><Size>1</Size>"
      "</Contents></ListBucketResult>");
  ASSERT_EQ(page.objects.size(), 1u);
  EXPECT_EQ(page.objects[0].key, "a%41");
}

TEST(S3Xml, MalformedRepliesAreCorruptionNamingTheOperation) {
  for (const char* bad :
       {"<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", "<Other/>",
        "<ListBucketResult>",
        "<ListBucketResult><EncodingType>url</EncodingType>"
        "<Contents><Key>%zz</Key><Size>1</Size></Contents>"
        "</ListBucketResult>"}) {
    try {
      parse_list_objects_v2(bad);
      FAIL() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption) << bad;
      EXPECT_NE(std::string(e.what()).find("ListObjectsV2"), std::string::npos) << e.what();
    }
  }
}

TEST(S3Xml, MultipartRepliesAndBodies) {
  EXPECT_EQ(parse_initiate_multipart("<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
                                     "<UploadId>U-1</UploadId></InitiateMultipartUploadResult>"),
            "U-1");
  EXPECT_THROW(parse_initiate_multipart("<InitiateMultipartUploadResult/>"), Error);
  EXPECT_FALSE(parse_complete_multipart(
      "<CompleteMultipartUploadResult><ETag>\"e-2\"</ETag></CompleteMultipartUploadResult>"));
  auto err = parse_complete_multipart("<Error><Code>InternalError</Code></Error>");
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, "InternalError");
  EXPECT_EQ(complete_multipart_body({{1, "\"a\""}, {2, "\"b&\""}}),
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"a\"</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>\"b&amp;\"</ETag></Part>"
            "</CompleteMultipartUpload>");
  auto uploads = parse_list_multipart_uploads(
      "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated><NextKeyMarker>k2"
      "</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker><Upload><Key>k1</Key>"
      "<UploadId>u1</UploadId></Upload></ListMultipartUploadsResult>");
  ASSERT_EQ(uploads.uploads.size(), 1u);
  EXPECT_EQ(uploads.uploads[0].key, "k1");
  EXPECT_EQ(uploads.uploads[0].upload_id, "u1");
  EXPECT_TRUE(uploads.truncated);
  EXPECT_EQ(uploads.next_key_marker, "k2");
}

TEST(S3Xml, DeleteBodyIsQuietAndFailuresAreReported) {
  EXPECT_EQ(delete_objects_body({"a", "b<c"}),
            "<Delete><Quiet>true</Quiet><Object><Key>a</Key></Object><Object><Key>b&lt;c</Key>"
            "</Object></Delete>");
  auto failures = parse_delete_result(
      "<DeleteResult><Error><Key>k</Key><Code>AccessDenied</Code><Message>no</Message></Error>"
      "</DeleteResult>");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].key, "k");
  EXPECT_EQ(failures[0].code, "AccessDenied");
  EXPECT_TRUE(parse_delete_result("<DeleteResult/>").empty());
}

TEST(S3Xml, DatesParseOrAreRefused) {
  EXPECT_DOUBLE_EQ(*parse_iso8601("1970-01-01T00:00:01Z"), 1.0);
  EXPECT_DOUBLE_EQ(*parse_iso8601("2026-11-23T10:15:30.25Z"), 1795428930.25);
  EXPECT_FALSE(parse_iso8601("2026-11-23 10:15:30Z"));
  EXPECT_FALSE(parse_iso8601("2026-11-23T10:15:30"));
  EXPECT_DOUBLE_EQ(*parse_http_date("Mon, 23 Nov 2026 10:15:30 GMT"), 1795428930.0);
  EXPECT_FALSE(parse_http_date("yesterday"));
}

TEST(S3Retry, FullJitterGrowsExponentiallyUpToTheCap) {
  RetryPolicy p;
  p.base = std::chrono::milliseconds(100);
  p.cap = std::chrono::milliseconds(1000);
  EXPECT_EQ(backoff_delay(p, 1, 0.999).count(), 99);
  EXPECT_EQ(backoff_delay(p, 2, 0.5).count(), 100);
  EXPECT_EQ(backoff_delay(p, 3, 0.5).count(), 200);
  EXPECT_EQ(backoff_delay(p, 10, 0.5).count(), 500);
  EXPECT_EQ(backoff_delay(p, 1000, 0.5).count(), 500);
  EXPECT_EQ(backoff_delay(p, 3, 0.0).count(), 0);
}

TEST(S3Retry, AttemptsAndBudgetBoundRetries) {
  RetryPolicy p;
  p.max_attempts = 3;
  p.budget = std::chrono::milliseconds(1000);
  using ms = std::chrono::milliseconds;
  EXPECT_TRUE(should_retry(p, 1, ms(0), ms(10)));
  EXPECT_TRUE(should_retry(p, 2, ms(0), ms(10)));
  EXPECT_FALSE(should_retry(p, 3, ms(0), ms(10)));
  EXPECT_FALSE(should_retry(p, 1, ms(995), ms(10)));
}

TEST(S3Retry, TransientStatusesAndCodesAreRetryableOthersNot) {
  for (int s : {500, 502, 503, 504}) EXPECT_TRUE(is_retryable_status(s, ""));
  EXPECT_TRUE(is_retryable_status(400, "RequestTimeout"));
  EXPECT_TRUE(is_retryable_status(503, "SlowDown"));
  for (int s : {400, 403, 404, 409, 412}) EXPECT_FALSE(is_retryable_status(s, "")) << s;
  EXPECT_FALSE(is_retryable_status(403, "AccessDenied"));
}

TEST(S3Lease, AReadBackOfOurTokenIsOurs) {
  EXPECT_EQ(classify_lease_read_back(true, "mine", "mine", "old"), LeaseReadBack::kOurs);
  EXPECT_EQ(classify_lease_read_back(true, "mine", "mine", ""), LeaseReadBack::kOurs);
}

TEST(S3Lease, AWriteTheServerDoesNotShowYetIsReadAgain) {
  // Missing, unreadable (read mid-write) or still the lease it replaced.
  EXPECT_EQ(classify_lease_read_back(false, "", "mine", ""), LeaseReadBack::kNotYetVisible);
  EXPECT_EQ(classify_lease_read_back(true, "", "mine", "old"), LeaseReadBack::kNotYetVisible);
  EXPECT_EQ(classify_lease_read_back(true, "old", "mine", "old"), LeaseReadBack::kNotYetVisible);
}

TEST(S3Lease, AnotherHoldersTokenMeansTheLeaseWasTaken) {
  EXPECT_EQ(classify_lease_read_back(true, "theirs", "mine", "old"),
            LeaseReadBack::kTakenByAnother);
  EXPECT_EQ(classify_lease_read_back(true, "theirs", "mine", ""), LeaseReadBack::kTakenByAnother);
}

}  // namespace
}  // namespace cairn::s3
