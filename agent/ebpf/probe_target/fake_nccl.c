// A stand-in for libnccl.so.2: the collective entry points agent/ebpf probes, with the real
// signatures (nccl.h), counting and sleeping for `fake_delay_us`. See fake_cuda.c.
#include "fake_common.h"

typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    fake_calls++; delay(); return 0;
}
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    fake_calls++; delay(); return 0;
}
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    fake_calls++; delay(); return 0;
}
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    fake_calls++; delay(); return 0;
}
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
    fake_calls++; delay(); return 0;
}
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    fake_calls++; return 0;
}
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    fake_calls++; return 0;
}
ncclResult_t ncclGroupStart(void) { fake_calls++; return 0; }
// Grouped operations are launched here in real NCCL, so this is where the time goes.
ncclResult_t ncclGroupEnd(void) { fake_calls++; delay(); return 0; }

typedef struct { char internal[128]; } ncclUniqueId;
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    fake_calls++; delay(); if (comm) *comm = (ncclComm_t)0x1; return 0;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    void *config) {
    fake_calls++; delay(); if (comm) *comm = (ncclComm_t)0x1; return 0;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { fake_calls++; delay(); return 0; }
