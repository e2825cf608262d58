// The single-rank communicator and the registry (the MPI implementation is tested across processes
// by tests/mpi under mpirun).
#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace dh::comm {
namespace {

TEST(LocalCommunicator, CollectivesOverOneRankAreIdentityAndCopies) {
  auto comm = MakeLocalCommunicator();
  EXPECT_EQ(comm->Rank(), 0);
  EXPECT_EQ(comm->Size(), 1);

  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(comm->AllReduceSum(x.data(), x.size(), DType::kF32).ok());
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.25f}));

  std::vector<uint8_t> send = {1, 2, 3, 4}, recv(4);
  ASSERT_TRUE(comm->AllGather(send.data(), send.size(), recv.data()).ok());
  EXPECT_EQ(recv, send);

  std::vector<uint8_t> a2a_recv(6, 0);
  const size_t sb[] = {3}, so[] = {1}, rb[] = {3}, ro[] = {2};
  ASSERT_TRUE(comm->AllToAllV(send.data(), sb, so, a2a_recv.data(), rb, ro).ok());
  EXPECT_EQ(a2a_recv, (std::vector<uint8_t>{0, 0, 2, 3, 4, 0}));

  ASSERT_TRUE(comm->Barrier().ok());
  EXPECT_EQ(comm->Stats().calls, 3u);  // the barrier moves nothing and is not counted
  EXPECT_EQ(comm->Stats().bytes, 12u + 4u + 3u);
}

TEST(LocalCommunicator, RejectsBadArguments) {
  auto comm = MakeLocalCommunicator();
  int32_t v = 0;
  const Status s = comm->AllReduceSum(&v, 1, DType::kI32);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("i32"), std::string::npos) << s.message();
  EXPECT_FALSE(comm->Broadcast(&v, sizeof(v), 1).ok());
  const size_t two[] = {1, 1};
  EXPECT_FALSE(comm->AllToAllV(&v, two, two, &v, two, two).ok());
  const size_t sb[] = {2}, rb[] = {3}, zero[] = {0};
  EXPECT_FALSE(comm->AllToAllV(&v, sb, zero, &v, rb, zero).ok());
}

TEST(CommunicatorRegistry, LocalIsAlwaysThereAndUnknownNamesListTheKnownOnes) {
  auto local = CreateCommunicator("local");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local.value()->Name(), "local");
  auto missing = CreateCommunicator("carrier-pigeon");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("available: "), std::string::npos);
  EXPECT_NE(missing.status().message().find("local"), std::string::npos);
}

}  // namespace
}  // namespace dh::comm
