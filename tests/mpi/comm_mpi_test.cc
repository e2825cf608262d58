// The MPI communicator across real processes: run by ctest as `mpirun -np 2|4 comm_mpi_tests`.
// Every rank runs every test (the calls are collective); each checks its own results, and the
// process exits non-zero when any rank fails.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <mpi.h>

#include "comm/mpi/mpi_communicator.h"

namespace dh::comm {
namespace {

Communicator* g_comm = nullptr;

TEST(MpiCommunicator, LaunchedWithSeveralRanks) {
  EXPECT_TRUE(LaunchedByMpi());
  EXPECT_GE(g_comm->Size(), 2);
  EXPECT_EQ(g_comm->Name(), "mpi");
}

TEST(MpiCommunicator, AllReduceSumF32MatchesTheClosedForm) {
  const int n = g_comm->Size(), r = g_comm->Rank();
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.25f * static_cast<float>(r);
  ASSERT_TRUE(g_comm->AllReduceSum(x.data(), x.size(), DType::kF32).ok());
  const float rank_sum = 0.25f * static_cast<float>(n * (n - 1) / 2);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i], static_cast<float>(n) * static_cast<float>(i) + rank_sum) << "element " << i;
  }
}

TEST(MpiCommunicator, AllReduceSumBf16RoundsTheF32SumOnceOnEveryRank) {
  const int n = g_comm->Size(), r = g_comm->Rank();
  std::vector<uint16_t> x(257);
  for (size_t i = 0; i < x.size(); ++i) x[i] = F32ToBF16(1.0f / static_cast<float>(i + 1 + r));
  ASSERT_TRUE(g_comm->AllReduceSum(x.data(), x.size(), DType::kBF16).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    float sum = 0;
    for (int k = 0; k < n; ++k) sum += BF16ToF32(F32ToBF16(1.0f / static_cast<float>(i + 1 + k)));
    ASSERT_EQ(x[i], F32ToBF16(sum)) << "element " << i;
  }
  // Every rank holds the same bits.
  std::vector<uint16_t> all(x.size() * static_cast<size_t>(n));
  ASSERT_TRUE(g_comm->AllGather(x.data(), x.size() * 2, all.data()).ok());
  for (int k = 0; k < n; ++k) {
    ASSERT_TRUE(std::equal(x.begin(), x.end(), all.begin() + static_cast<long>(k * x.size())));
  }
}

TEST(MpiCommunicator, AllGatherConcatenatesInRankOrder) {
  const int n = g_comm->Size(), r = g_comm->Rank();
  std::vector<int32_t> mine = {r * 10, r * 10 + 1, r * 10 + 2};
  std::vector<int32_t> all(3 * static_cast<size_t>(n));
  ASSERT_TRUE(g_comm->AllGather(mine.data(), sizeof(int32_t) * 3, all.data()).ok());
  for (int k = 0; k < n; ++k) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(all[static_cast<size_t>(3 * k + j)], k * 10 + j);
  }
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  for (int root = 0; root < g_comm->Size(); ++root) {
    std::vector<double> v(5, g_comm->Rank() == root ? 3.5 + root : -1.0);
    ASSERT_TRUE(g_comm->Broadcast(v.data(), v.size() * sizeof(double), root).ok());
    for (double d : v) EXPECT_EQ(d, 3.5 + root);
  }
  int32_t x = 0;
  EXPECT_FALSE(g_comm->Broadcast(&x, sizeof(x), g_comm->Size()).ok());
}

TEST(MpiCommunicator, AllToAllVWithUnequalPieces) {
  // Rank r sends (r + d + 1) bytes of value 16*r + d to rank d: the expert-parallel pattern where
  // each rank holds a different number of tokens for each other rank.
  const int n = g_comm->Size(), r = g_comm->Rank();
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  size_t send_total = 0, recv_total = 0;
  for (int d = 0; d < n; ++d) {
    sb[d] = static_cast<size_t>(r + d + 1);
    so[d] = send_total;
    send_total += sb[d];
    rb[d] = static_cast<size_t>(d + r + 1);  // what rank d sends to me
    ro[d] = recv_total;
    recv_total += rb[d];
  }
  std::vector<uint8_t> send(send_total), recv(recv_total, 0xFF);
  for (int d = 0; d < n; ++d) std::fill_n(send.begin() + so[d], sb[d], 16 * r + d);
  ASSERT_TRUE(g_comm->AllToAllV(send.data(), sb, so, recv.data(), rb, ro).ok());
  for (int s = 0; s < n; ++s) {
    for (size_t i = 0; i < rb[s]; ++i) ASSERT_EQ(recv[ro[s] + i], 16 * s + r) << "from " << s;
  }
}

TEST(MpiCommunicator, StatsCountCallsAndTime) {
  const CommStats before = g_comm->Stats();
  float x = 1;
  ASSERT_TRUE(g_comm->AllReduceSum(&x, 1, DType::kF32).ok());
  ASSERT_TRUE(g_comm->Barrier().ok());
  EXPECT_EQ(g_comm->Stats().calls, before.calls + 2);
  EXPECT_EQ(g_comm->Stats().bytes, before.bytes + 4);
  EXPECT_GT(g_comm->Stats().seconds, before.seconds);
}

}  // namespace
}  // namespace dh::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto comm = dh::comm::MakeMpiCommunicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "error: %s\n", comm.status().message().c_str());
    return 2;
  }
  dh::comm::g_comm = comm.value().get();
  // Only rank 0 prints gtest's report; every rank's result decides the exit code.
  if (dh::comm::g_comm->Rank() != 0) {
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  comm.value().reset();
  return any_failed;
}
