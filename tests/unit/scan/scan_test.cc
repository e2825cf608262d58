// deepharness scan: lexers (comments and strings are not code), import aliases, rule matching per
// language family, suppressions, baseline, effort model and output formats.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "scan/report.h"
#include "scan/scanner.h"

namespace dh::scan {
namespace {

namespace fs = std::filesystem;

struct Hit {
  std::string rule;
  int line;
  bool operator<(const Hit& o) const { return std::tie(rule, line) < std::tie(o.rule, o.line); }
  bool operator==(const Hit& o) const { return rule == o.rule && line == o.line; }
};

std::vector<Hit> Hits(FileClass cls, const std::string& text, int* suppressed = nullptr) {
  int s = 0;
  std::vector<Hit> out;
  for (const Finding& f : ScanText("f", cls, text, &s)) out.push_back({f.rule->id, f.line});
  if (suppressed) *suppressed = s;
  return out;
}

std::string Show(const std::vector<Hit>& hits) {
  std::string s;
  for (const Hit& h : hits) s += h.rule + "@" + std::to_string(h.line) + " ";
  return s;
}

#define EXPECT_HITS(hits, ...)                                   \
  do {                                                           \
    const std::vector<Hit> expected_ = {__VA_ARGS__};            \
    EXPECT_EQ(hits, expected_) << "got: " << Show(hits);         \
  } while (0)

TEST(GlobTest, StarsAndDigits) {
  EXPECT_TRUE(GlobMatch("cuda", "cuda"));
  EXPECT_FALSE(GlobMatch("cuda", "cudax"));
  EXPECT_TRUE(GlobMatch("cuda:#", "cuda:12"));
  EXPECT_FALSE(GlobMatch("cuda:#", "cuda:"));
  EXPECT_FALSE(GlobMatch("cuda:#", "cuda:1a"));
  EXPECT_TRUE(GlobMatch("*+cu#*", "torch==2.1.0+cu121"));
  EXPECT_FALSE(GlobMatch("*+cu#*", "torch==2.1.0+cpu"));
  EXPECT_TRUE(GlobMatch("cublas*", "cublasGemmEx"));
  EXPECT_TRUE(GlobMatch("*", ""));
}

TEST(PythonTest, CommentsAndDocstringsAreNotCode) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "import torch\n"
                   "# torch.cuda.synchronize()\n"
                   "\"\"\"torch.cuda.synchronize() and x.cuda() in a docstring\"\"\"\n"
                   "s = 'torch.cuda.synchronize()'\n"));
}

TEST(PythonTest, ImportAliasesResolve) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "import torch as t\n"
                   "t.cuda.synchronize()\n"
                   "from torch import cuda as c\n"
                   "c.empty_cache()\n"
                   "from torch.cuda import amp\n"
                   "with amp.autocast():\n"
                   "    pass\n"),
              {"PY03", 2}, {"PY03", 3}, {"PY03", 4}, {"PY05", 5}, {"PY05", 6});
}

TEST(PythonTest, UnimportedNamesDoNotResolve) {
  // `cuda` is a local variable here, not torch.cuda or numba.cuda.
  EXPECT_HITS(Hits(FileClass::kPython, "cuda = 3\ncuda.synchronize()\ntriton = 1\n"));
}

TEST(PythonTest, DeviceStringsCountInsideStrings) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "x = torch.zeros(1, device=\"cuda\")\n"
                   "d = 'cuda:0'\n"
                   "e = f\"cuda:{rank}\"\n"
                   "print(\"cuda is fast\")\n"
                   "g = 'cudagraph'\n"),
              {"PY01", 1}, {"PY01", 2}, {"PY01", 3});
}

TEST(PythonTest, CudaMethodCalls) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "m = m.cuda()\n"
                   "y = model(x).cuda(non_blocking=True)\n"
                   "z = m.cuda\n"
                   "def cuda(self):\n"
                   "    pass\n"),
              {"PY02", 1}, {"PY02", 2});
}

TEST(PythonTest, LibrariesAndParenthesisedImports) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "import triton.language as tl\n"
                   "from flash_attn import (\n"
                   "    flash_attn_func,\n"
                   "    flash_attn_varlen_func as fav,\n"
                   ")\n"
                   "fav(q)\n"
                   "from numba import cuda\n"
                   "@cuda.jit\n"
                   "def k(): pass\n"
                   "from . import cuda_utils\n"),
              {"PY15", 1}, {"PY13", 3}, {"PY13", 4}, {"PY13", 6}, {"PY16", 7}, {"PY16", 8});
}

TEST(PythonTest, NcclBackendAndEnvironment) {
  EXPECT_HITS(Hits(FileClass::kPython,
                   "dist.init_process_group(backend='nccl')\n"
                   "os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
                   "os.environ['NCCL_DEBUG'] = 'INFO'\n"),
              {"PY07", 1}, {"PY23", 2}, {"PY09", 3});
}

TEST(PythonTest, InlineSuppressions) {
  int suppressed = 0;
  EXPECT_HITS(Hits(FileClass::kPython,
                   "x = x.cuda()  # deepharness: ignore[PY02]\n"
                   "y = y.cuda()  # deepharness: ignore[PY01]\n"
                   "# deepharness: ignore\n"
                   "z = z.cuda()\n"
                   "w = w.cuda()\n",
                   &suppressed),
              {"PY02", 2}, {"PY02", 5});
  EXPECT_EQ(suppressed, 2);
  EXPECT_HITS(Hits(FileClass::kPython, "# deepharness: ignore-file\nx = x.cuda()\n"));
}

TEST(CTest, CommentsStringsAndRawStringsAreNotCode) {
  EXPECT_HITS(Hits(FileClass::kC,
                   "// cudaMalloc(&p, n);\n"
                   "/* cudaFree(p); */\n"
                   "const char* s = \"cudaMalloc\";\n"
                   "auto r = R\"x(cudaMalloc(\"y\"))x\";\n"
                   "int n = 1'000;\n"
                   "cudaMalloc(&p, n);\n"),
              {"CC02", 6});
}

TEST(CTest, KernelsLaunchesHeadersAndNamespaces) {
  const std::string src =
      "#include <cuda_runtime.h>\n"
      "#include \"cublas_v2.h\"\n"
      "#include <thrust/sort.h>\n"
      "__global__ void scale(float* x) { x[threadIdx.x] *= 2; }\n"
      "void f(float* x) {\n"
      "  scale<<<1, 32>>>(x);\n"
      "  thrust::sort(x, x + 4);\n"
      "  auto s = at::cuda::getCurrentCUDAStream();\n"
      "#ifdef __CUDA_ARCH__\n"
      "#endif\n"
      "}\n";
  EXPECT_HITS(Hits(FileClass::kCuda, src), {"CC01", 1}, {"CC09", 2}, {"CC13", 3}, {"CC06", 4},
              {"CC06", 4}, {"CC07", 6}, {"CC13", 7}, {"CC19", 8}, {"CC16", 9});
  int s = 0;
  const auto findings = ScanText("k.cu", FileClass::kCuda, src, &s);
  ASSERT_GE(findings.size(), 4u);
  EXPECT_EQ(findings[3].symbol, "__global__ scale");
  // __device__ / __shared__ count only in .cu files (a .h may define them away).
  EXPECT_HITS(Hits(FileClass::kC, "__device__ int g;\n"));
  EXPECT_HITS(Hits(FileClass::kCuda, "__device__ int g;\n"), {"CC06", 1});
}

TEST(CMakeTest, CommandsAndArguments) {
  EXPECT_HITS(Hits(FileClass::kCMake,
                   "# find_package(CUDA)\n"
                   "#[[ enable_language(CUDA) ]]\n"
                   "project(p LANGUAGES CXX CUDA)\n"
                   "find_package(CUDAToolkit REQUIRED)\n"
                   "find_package(Threads REQUIRED)\n"
                   "target_link_libraries(x PRIVATE CUDA::cublas)\n"
                   "set(FLAGS \"-gencode arch=compute_80,code=sm_80\")\n"
                   "message(\"CUDA\")\n"),
              {"BLD01", 3}, {"BLD01", 4}, {"BLD02", 6}, {"BLD03", 7});
}

TEST(BuildFilesTest, RequirementsAndPyproject) {
  EXPECT_HITS(Hits(FileClass::kRequirements,
                   "--extra-index-url https://download.pytorch.org/whl/cu121\n"
                   "torch==2.3.1+cu121\n"
                   "Flash_Attn>=2.5  # fast attention\n"
                   "# xformers\n"
                   "numpy\n"
                   "nvidia-cublas-cu12\n"),
              {"BLD05", 1}, {"BLD05", 2}, {"PY13", 3}, {"BLD05", 6});
  EXPECT_HITS(Hits(FileClass::kToml,
                   "[project]\n"
                   "# dependencies = [\"xformers\"]\n"
                   "dependencies = [\"torch>=2\", \"bitsandbytes\", 'triton']\n"),
              {"PY19", 3}, {"BLD05", 3});
}

TEST(DeployFilesTest, DockerfileYamlShell) {
  EXPECT_HITS(Hits(FileClass::kDockerfile,
                   "FROM --platform=linux/amd64 nvidia/cuda:12.1.1-devel-ubuntu22.04 AS build\n"
                   "ENV NVIDIA_VISIBLE_DEVICES=all\n"
                   "RUN pip install flash-attn && echo '# not a comment'\n"
                   "# RUN nvidia-smi\n"
                   "FROM ubuntu:22.04\n"),
              {"CTR01", 1}, {"CTR03", 2}, {"PY13", 3});
  EXPECT_HITS(Hits(FileClass::kYaml,
                   "runtimeClassName: nvidia\n"
                   "limits:\n"
                   "  nvidia.com/gpu: 1  # one GPU\n"
                   "# nvidia.com/gpu: 2\n"
                   "note: \"a # inside quotes is text, nvidia-smi too\"\n"),
              {"CTR04", 1}, {"CTR04", 3}, {"OPS01", 5});
  EXPECT_HITS(Hits(FileClass::kShell,
                   "export CUDA_VISIBLE_DEVICES=0,1\n"
                   "nvidia-smi -L # list\n"
                   "docker run --gpus all img\n"
                   "echo done # nvidia-smi\n"),
              {"OPS04", 1}, {"OPS01", 2}, {"CTR02", 3});
}

TEST(TargetTest, CategoryAndReplacementDependOnTheTarget) {
  const Rule* fa = FindRule("PY13");
  ASSERT_NE(fa, nullptr);
  EXPECT_EQ(fa->category[static_cast<int>(Target::kAscend)], Category::kPartial);
  EXPECT_EQ(fa->category[static_cast<int>(Target::kCpu)], Category::kCostly);
  EXPECT_NE(fa->replacement[0], fa->replacement[2]);
  std::set<std::string> ids;
  for (const Rule& r : Rules()) {
    EXPECT_TRUE(ids.insert(r.id).second) << r.id;
    EXPECT_FALSE(r.patterns.empty()) << r.id;
    for (int t = 0; t < kNumTargets; ++t) EXPECT_FALSE(r.replacement[t].empty()) << r.id;
  }
  EXPECT_EQ(Rules().size(), 60u);
}

ScanReport ReportOf(std::vector<Finding> findings, Target target) {
  ScanReport r;
  r.target = target;
  r.findings = std::move(findings);
  Summarize(&r);
  return r;
}

TEST(EffortTest, CountModesAndPerFileCap) {
  std::string many;
  for (int i = 0; i < 15; ++i) many += "x.cuda()\n";
  int s = 0;
  std::vector<Finding> f = ScanText("a.py", FileClass::kPython, many, &s);
  auto more = ScanText("b.py", FileClass::kPython, "y.cuda()\nimport tensorrt\n", &s);
  auto trt = ScanText("c.py", FileClass::kPython, "import tensorrt\n", &s);
  f.insert(f.end(), more.begin(), more.end());
  f.insert(f.end(), trt.begin(), trt.end());
  const ScanReport r = ReportOf(f, Target::kAscend);
  ASSERT_EQ(r.by_rule.count("PY02"), 1u);
  EXPECT_EQ(r.by_rule.at("PY02").hits, 16);
  EXPECT_EQ(r.by_rule.at("PY02").units, 11);  // 10 (capped) + 1
  EXPECT_EQ(r.by_rule.at("PY18").hits, 2);
  EXPECT_EQ(r.by_rule.at("PY18").units, 1);  // once per tree
  const double expected = 11 * HoursForWeight(1) + 1 * HoursForWeight(20);
  EXPECT_NEAR(r.hours, expected, 1e-9);
  EXPECT_NEAR(r.hours_low, 0.7 * expected, 1e-9);
  EXPECT_NEAR(r.hours_high, 1.5 * expected, 1e-9);
  EXPECT_EQ(r.by_category[static_cast<int>(Category::kCostly)], 2);
  EXPECT_EQ(r.bucket, "kernel rewrite project");  // 80 h of 81.8 h are costly
  EXPECT_TRUE(FailsOn(r, "costly"));
  const ScanReport mech = ReportOf(more, Target::kAscend);
  EXPECT_EQ(ReportOf(ScanText("d.py", FileClass::kPython, "x.cuda()\n", &s), Target::kCpu).bucket,
            "mostly mechanical");
  EXPECT_FALSE(FailsOn(ReportOf(ScanText("d.py", FileClass::kPython, "x.cuda()\n", &s),
                                Target::kAscend),
                       "partial"));
  EXPECT_TRUE(FailsOn(mech, "any"));
  EXPECT_FALSE(FailsOn(ReportOf({}, Target::kAscend), "any"));
}

fs::path FixtureTree() { return fs::path(DH_SOURCE_DIR) / "tests/fixtures/scan/cuda_service"; }

TEST(TreeTest, FixtureTreeFindsEachFamilyAndBaselineRemovesThem) {
  ScanOptions opt;
  opt.jobs = 2;
  auto r = ScanPaths({FixtureTree().string()}, opt);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->files_scanned, 8);
  EXPECT_EQ(r->suppressed, 1);
  std::set<std::string> rules;
  for (const Finding& f : r->findings) rules.insert(f.rule->id);
  for (const char* id : {"PY01", "PY02", "PY03", "PY05", "PY07", "PY13", "PY15", "PY23", "CC01",
                         "CC02", "CC06", "CC07", "CC08", "CC13", "CC19", "BLD01", "BLD02", "BLD03",
                         "BLD04", "BLD05", "PY19", "CTR01", "CTR02", "CTR03", "CTR04", "OPS01",
                         "OPS04", "PY09"}) {
    EXPECT_TRUE(rules.count(id)) << id;
  }
  // Nothing from comments, docstrings or sentences.
  for (const Finding& f : r->findings) {
    EXPECT_EQ(f.code.find("comment"), std::string::npos) << f.path << ":" << f.line;
    EXPECT_EQ(f.code.find("cuda is fast"), std::string::npos) << f.path << ":" << f.line;
  }
  const fs::path tmp = fs::temp_directory_path() / ("dh_scan_baseline_" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp);
    out << FormatBaseline(r->findings);
  }
  const size_t n = r->findings.size();
  ASSERT_TRUE(ApplyBaseline(tmp.string(), &*r).ok());
  EXPECT_EQ(r->findings.size(), 0u);
  EXPECT_EQ(r->baselined, static_cast<int>(n));
  fs::remove(tmp);
  EXPECT_FALSE(ScanPaths({"/no/such/dir"}, opt).ok());
  opt.disabled = {"PY*", "CC*"};
  opt.excludes = {"deploy"};
  auto r2 = ScanPaths({FixtureTree().string()}, opt);
  ASSERT_TRUE(r2.ok());
  for (const Finding& f : r2->findings) {
    EXPECT_NE(f.rule->id.substr(0, 2), "PY");
    EXPECT_EQ(f.path.find("deploy"), std::string::npos);
  }
}

TEST(FormatTest, JsonCsvSarifMarkdown) {
  ScanOptions opt;
  opt.jobs = 1;
  auto r = ScanPaths({FixtureTree().string()}, opt);
  ASSERT_TRUE(r.ok());
  const auto j = nlohmann::json::parse(FormatReport(*r, Format::kJson));
  EXPECT_EQ(j["findings"].size(), r->findings.size());
  EXPECT_EQ(j["target"], "ascend");
  const auto s = nlohmann::json::parse(FormatReport(*r, Format::kSarif));
  EXPECT_EQ(s["version"], "2.1.0");
  EXPECT_EQ(s["runs"][0]["results"].size(), r->findings.size());
  EXPECT_EQ(s["runs"][0]["tool"]["driver"]["rules"].size(), Rules().size());
  const std::string csv = FormatReport(*r, Format::kCsv);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "file,start_line,end_line,column,rule_id,category,severity,symbol,snippet,replacement,"
            "weight,count_mode");
  EXPECT_EQ(static_cast<size_t>(std::count(csv.begin(), csv.end(), '\n')), r->findings.size() + 1);
  const std::string md = FormatReport(*r, Format::kMarkdown);
  EXPECT_NE(md.find("| Rule | Category |"), std::string::npos);
  const std::string text = FormatReport(*r, Format::kText);
  EXPECT_NE(text.find("Effort:"), std::string::npos);
}

}  // namespace
}  // namespace dh::scan
