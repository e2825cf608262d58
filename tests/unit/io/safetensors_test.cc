// safetensors reader/writer: round trips for every dtype, checkpoint layouts (single, sharded,
// glob) and malformed files generated here, each refused with a message naming what is wrong.
#include "io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "io/safetensors_writer.h"
#include "unit/io/io_test_util.h"

namespace dh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::WriteFile;

constexpr DType kAllDTypes[] = {DType::kF64,    DType::kF32,    DType::kF16, DType::kBF16,
                                DType::kF8E4M3, DType::kF8E5M2, DType::kI64, DType::kI32,
                                DType::kI16,    DType::kI8,     DType::kU8,  DType::kBool};

// Owns bytes for a tensor filled with a pattern that differs per tensor.
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
  HostTensor(DType dtype, std::initializer_list<int64_t> dims, uint8_t seed) {
    t = Tensor(nullptr, dtype, dims);
    bytes.resize(t.nbytes());
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(seed + 7 * i);
    if (dtype == DType::kBool) {
      for (auto& b : bytes) b &= 1;
    }
    t.data = bytes.data();
  }
};

std::string OpenError(const std::string& path) {
  auto r = SafetensorsFile::Open(path);
  EXPECT_FALSE(r.ok()) << path << " was accepted";
  return r.ok() ? std::string() : r.status().message();
}

TEST(SafetensorsTest, RoundTripsEveryDType) {
  TempDir dir;
  std::vector<HostTensor> hosts;
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint8_t seed = 1;
  for (DType d : kAllDTypes) hosts.emplace_back(d, std::initializer_list<int64_t>{2, 3}, seed++);
  hosts.emplace_back(DType::kF32, std::initializer_list<int64_t>{}, seed++);       // scalar
  hosts.emplace_back(DType::kBF16, std::initializer_list<int64_t>{0, 4}, seed++);  // empty
  hosts.emplace_back(DType::kF16, std::initializer_list<int64_t>{2, 1, 3, 2}, seed++);
  for (size_t i = 0; i < hosts.size(); ++i) {
    tensors.emplace_back(fmt::format("t{}.{}", i, DTypeName(hosts[i].t.dtype)), hosts[i].t);
  }
  const std::string path = dir.File("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "x"}}).ok());

  for (bool use_mmap : {true, false}) {
    auto r = SafetensorsFile::Open(path, {.use_mmap = use_mmap});
    ASSERT_TRUE(r.ok()) << r.status().message();
    const SafetensorsFile& f = **r;
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "x");
    ASSERT_EQ(f.tensors().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& info = f.tensors()[i];  // stored in file order, as written
      EXPECT_EQ(info.name, tensors[i].first);
      EXPECT_EQ(info.dtype, tensors[i].second.dtype);
      EXPECT_EQ(static_cast<int>(info.shape.size()), tensors[i].second.ndim);
      EXPECT_EQ(info.nbytes, hosts[i].bytes.size());
      EXPECT_EQ(info.file, path);
      if (info.nbytes > 0) {
        EXPECT_EQ(std::memcmp(info.data, hosts[i].bytes.data(), info.nbytes), 0) << info.name;
      }
      Tensor v = info.View();
      EXPECT_EQ(v.nbytes(), info.nbytes);
    }
    EXPECT_EQ(f.tensors()[0].ShapeString(), "[2, 3]");
  }
}

TEST(SafetensorsTest, HeaderIsPaddedToEightBytes) {
  TempDir dir;
  HostTensor a(DType::kU8, {3}, 1);
  const std::string path = dir.File("pad.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a.t}}).ok());
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok());
  uint64_t n;
  std::memcpy(&n, (*f)->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ((*f)->size(), 8 + n + 3);
}

TEST(SafetensorsTest, WriterRefusesDuplicateNames) {
  TempDir dir;
  HostTensor a(DType::kU8, {3}, 1);
  Status s = WriteSafetensors(dir.File("x.safetensors"), {{"a", a.t}, {"a", a.t}});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
}

// Each malformed case: a header, the data bytes and a substring the error must contain.
struct BadCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> expected;
};

std::vector<BadCase> BadCases() {
  const std::string d8(8, '\x01');
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  return {
      {"too_short", "abc", {"too short"}},
      {"header_past_file", SafetensorsBytes(ok_header, d8, 4096), {"runs past the end", "4096"}},
      {"header_too_large", SafetensorsBytes("{}", "", uint64_t{200} << 20), {"more than"}},
      {"not_json", SafetensorsBytes("{not json", ""), {"invalid JSON"}},
      {"not_object", SafetensorsBytes("[1, 2]", ""), {"JSON object"}},
      {"trailing_garbage", SafetensorsBytes(ok_header + " x", d8), {"invalid JSON"}},
      {"duplicate_key",
       SafetensorsBytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                        "ab"),
       {"duplicate key 'w'"}},
      {"unknown_dtype",
       SafetensorsBytes(R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "unknown dtype 'F7'"}},
      {"our_dtype_spelling",
       SafetensorsBytes(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "unknown dtype 'f32'"}},
      {"negative_shape",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "field 'shape'", "-2"}},
      {"float_shape",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "field 'shape'"}},
      {"string_shape",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "field 'shape'"}},
      {"too_many_dims",
       SafetensorsBytes(R"({"w":{"dtype":"U8","shape":[1,1,1,1,8],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "5 dimensions"}},
      {"shape_overflow",
       SafetensorsBytes(
           R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
           d8),
       {"tensor 'w'", "overflow"}},
      {"missing_offsets",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[2]}})", d8),
       {"tensor 'w'", "data_offsets"}},
      {"offsets_past_data",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8),
       {"tensor 'w'", "runs past the end of the 8-byte data region"}},
      {"end_before_begin",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8),
       {"tensor 'w'", "before begin"}},
      {"length_mismatch",
       SafetensorsBytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
       {"tensor 'w'", "needs 12 bytes"}},
      {"overlap",
       SafetensorsBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        d8),
       {"tensor 'b'", "overlap tensor 'a'"}},
      {"hole",
       SafetensorsBytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
                        std::string(6, 'x')),
       {"tensor 'b'", "no tensor uses"}},
      {"hole_at_start",
       SafetensorsBytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                        std::string(4, 'x')),
       {"tensor 'a'", "expected begin 0"}},
      {"trailing_bytes", SafetensorsBytes(ok_header, d8 + "junk"), {"trailing bytes"}},
      {"metadata_not_string",
       SafetensorsBytes(R"({"__metadata__":{"format":1},)"
                        R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        d8),
       {"__metadata__", "'format'", "expected a string"}},
      {"tensor_not_object", SafetensorsBytes(R"({"w":[1,2]})", ""), {"tensor 'w'", "object"}},
  };
}

TEST(SafetensorsTest, RefusesMalformedFiles) {
  TempDir dir;
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.File(std::string(c.name) + ".safetensors");
    WriteFile(path, c.bytes);
    const std::string msg = OpenError(path);
    EXPECT_THAT(msg, HasSubstr(path));
    for (const std::string& e : c.expected) EXPECT_THAT(msg, HasSubstr(e));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(SafetensorsTest, RefusesTruncatedFile) {
  TempDir dir;
  HostTensor a(DType::kF32, {4, 4}, 3);
  const std::string path = dir.File("t.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a.t}}).ok());
  auto full = MappedFile::Open(path, {.use_mmap = false});
  ASSERT_TRUE(full.ok());
  std::string bytes(reinterpret_cast<const char*>((*full)->data()), (*full)->size());
  for (size_t keep : {size_t{0}, size_t{5}, size_t{20}, bytes.size() - 1}) {
    WriteFile(path, bytes.substr(0, keep));
    SCOPED_TRACE(keep);
    EXPECT_THAT(OpenError(path), HasSubstr(path));
  }
}

TEST(SafetensorsTest, RefusesDirectoriesAndMissingFiles) {
  TempDir dir;
  EXPECT_THAT(OpenError(dir.path()), HasSubstr("regular file"));
  auto r = SafetensorsFile::Open(dir.File("nope.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("nope.safetensors"));
}

// ---- Checkpoint layouts ----

void WriteTensors(const std::string& path, const std::vector<std::string>& names, uint8_t seed) {
  std::vector<HostTensor> hosts;
  std::vector<std::pair<std::string, Tensor>> tensors;
  hosts.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    hosts.emplace_back(DType::kF32, std::initializer_list<int64_t>{2, 2}, seed++);
  }
  for (size_t i = 0; i < names.size(); ++i) tensors.emplace_back(names[i], hosts[i].t);
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
}

std::string CheckpointError(const std::string& dir) {
  auto r = Checkpoint::Open(dir);
  EXPECT_FALSE(r.ok()) << dir << " was accepted";
  return r.ok() ? std::string() : r.status().message();
}

TEST(CheckpointTest, OpensSingleFile) {
  TempDir dir;
  WriteTensors(dir.File("model.safetensors"), {"a", "b"}, 1);
  WriteTensors(dir.File("ignored.safetensors"), {"a"}, 1);  // model.safetensors wins
  auto r = Checkpoint::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_files(), 1u);
  EXPECT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(r->total_bytes(), 32u);
  ASSERT_NE(r->Find("b"), nullptr);
  EXPECT_EQ(r->Find("b")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(r->Find("zzz"), nullptr);
}

// --no-mmap reads the files into memory only when they fit in the memory left
// (DEEPHARNESS_MEM_AVAILABLE simulates a machine); otherwise they are mapped, not OOM-killed.
TEST(CheckpointTest, NoMmapMapsACheckpointLargerThanTheMemoryLeft) {
  TempDir dir;
  WriteTensors(dir.File("model.safetensors"), {"a", "b"}, 1);
  const FileLoadOptions no_mmap{.use_mmap = false};
  ASSERT_EQ(setenv("DEEPHARNESS_MEM_AVAILABLE", "100", 1), 0);  // bytes: less than the file
  auto mapped = Checkpoint::Open(dir.path(), no_mmap);
  ASSERT_EQ(setenv("DEEPHARNESS_MEM_AVAILABLE", "64GiB", 1), 0);
  auto read = Checkpoint::Open(dir.path(), no_mmap);
  auto default_mmap = Checkpoint::Open(dir.path());
  unsetenv("DEEPHARNESS_MEM_AVAILABLE");
  ASSERT_TRUE(mapped.ok() && read.ok() && default_mmap.ok());
  EXPECT_FALSE(mapped->read_into_memory());
  EXPECT_TRUE(read->read_into_memory());
  EXPECT_FALSE(default_mmap->read_into_memory());
  EXPECT_TRUE(mapped->mapped_to_fit());
  EXPECT_FALSE(read->mapped_to_fit());
  EXPECT_FALSE(default_mmap->mapped_to_fit());  // mapped because asked to
  const TensorInfo* a = mapped->Find("b");
  const TensorInfo* b = read->Find("b");
  ASSERT_TRUE(a != nullptr && b != nullptr && a->nbytes == b->nbytes);
  EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0);
}

TEST(CheckpointTest, OpensShardedIndex) {
  TempDir dir;
  WriteTensors(dir.File("model-00001-of-00002.safetensors"), {"a", "b"}, 1);
  WriteTensors(dir.File("model-00002-of-00002.safetensors"), {"c"}, 9);
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"metadata":{"total_size":48},"weight_map":{)"
            R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
            R"("c":"model-00002-of-00002.safetensors"}})");
  std::vector<std::pair<size_t, size_t>> progress;
  auto r = Checkpoint::Open(dir.path(), {},
                            [&](size_t done, size_t total) { progress.emplace_back(done, total); });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_files(), 2u);
  EXPECT_EQ(r->tensors().size(), 3u);
  EXPECT_EQ(r->total_bytes(), 48u);
  ASSERT_NE(r->Find("c"), nullptr);
  EXPECT_THAT(r->Find("c")->file, HasSubstr("model-00002-of-00002"));
  EXPECT_EQ(progress, (std::vector<std::pair<size_t, size_t>>{{1, 2}, {2, 2}}));
  // The checkpoint survives a move (TensorInfo pointers stay valid).
  Checkpoint moved = std::move(r.value());
  EXPECT_EQ(moved.Find("a")->nbytes, 16u);
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(moved.Find("a")->data)[0], 1);
}

TEST(CheckpointTest, OpensAllSafetensorsInDirectory) {
  TempDir dir;
  WriteTensors(dir.File("b.safetensors"), {"y"}, 1);
  WriteTensors(dir.File("a.safetensors"), {"x"}, 1);
  WriteFile(dir.File("notes.txt"), "hello");
  auto r = Checkpoint::Open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(r->tensors()[0]->name, "x");  // files in sorted order
}

TEST(CheckpointTest, RefusesShardNamesEscapingTheDirectory) {
  TempDir dir;
  WriteTensors(dir.File("model-1.safetensors"), {"a"}, 1);
  for (const char* bad : {"../x.safetensors", "/etc/passwd", "sub/model-1.safetensors", "..", ""}) {
    SCOPED_TRACE(bad);
    WriteFile(dir.File("model.safetensors.index.json"),
              fmt::format(R"({{"weight_map":{{"a":"{}"}}}})", bad));
    std::string msg = CheckpointError(dir.path());
    EXPECT_THAT(msg, AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'a'"),
                           HasSubstr("escapes the model directory")));
  }
}

TEST(CheckpointTest, RefusesIndexNamingMissingShard) {
  TempDir dir;
  WriteTensors(dir.File("model-1.safetensors"), {"a"}, 1);
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir.path()),
              AllOf(HasSubstr("'model-2.safetensors'"), HasSubstr("does not exist")));
}

TEST(CheckpointTest, RefusesTensorMissingFromItsShard) {
  TempDir dir;
  WriteTensors(dir.File("model-1.safetensors"), {"a"}, 1);
  WriteTensors(dir.File("model-2.safetensors"), {"b"}, 1);
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map":{"a":"model-1.safetensors","b":"model-1.safetensors",)"
            R"("c":"model-2.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir.path()),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr("not found there")));
}

TEST(CheckpointTest, RefusesMalformedIndex) {
  TempDir dir;
  WriteTensors(dir.File("model-1.safetensors"), {"a"}, 1);
  WriteFile(dir.File("model.safetensors.index.json"), R"({"weight_map":)");
  EXPECT_THAT(CheckpointError(dir.path()),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("invalid JSON")));
  WriteFile(dir.File("model.safetensors.index.json"), R"({"weight_map":{"a":3}})");
  EXPECT_THAT(CheckpointError(dir.path()), AllOf(HasSubstr("weight_map['a']")));
  WriteFile(dir.File("model.safetensors.index.json"), R"({"weight_map":{}})");
  EXPECT_THAT(CheckpointError(dir.path()), HasSubstr("field 'weight_map'"));
  WriteFile(dir.File("model.safetensors.index.json"), R"({"metadata":{}})");
  EXPECT_THAT(CheckpointError(dir.path()), HasSubstr("field 'weight_map'"));
}

TEST(CheckpointTest, RefusesDuplicateTensorAcrossShards) {
  TempDir dir;
  WriteTensors(dir.File("a.safetensors"), {"x", "dup"}, 1);
  WriteTensors(dir.File("b.safetensors"), {"dup"}, 1);
  EXPECT_THAT(
      CheckpointError(dir.path()),
      AllOf(HasSubstr("tensor 'dup'"), HasSubstr("a.safetensors"), HasSubstr("b.safetensors")));
}

TEST(CheckpointTest, RefusesMissingOrEmptyDirectory) {
  TempDir dir;
  EXPECT_THAT(CheckpointError(dir.File("nope")), HasSubstr("does not exist"));
  EXPECT_THAT(CheckpointError(dir.path()), HasSubstr("no model.safetensors"));
  WriteFile(dir.File("file"), "x");
  EXPECT_THAT(CheckpointError(dir.File("file")), HasSubstr("expected a model directory"));
}

TEST(CheckpointTest, ReportsTheBrokenShard) {
  TempDir dir;
  WriteTensors(dir.File("model-1.safetensors"), {"a"}, 1);
  WriteFile(dir.File("model-2.safetensors"), SafetensorsBytes("{oops", ""));
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}})");
  EXPECT_THAT(CheckpointError(dir.path()), HasSubstr("model-2.safetensors"));
}

}  // namespace
}  // namespace dh
