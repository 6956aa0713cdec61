// A stand-in for libcuda.so.1: the driver-API entry points agent/ebpf probes, with the real
// signatures, doing nothing but counting and (for the blocking calls) sleeping for
// `fake_delay_us`. Built into a temporary directory by agent/ebpf/probe_target/__init__.py for
// the eBPF tests and `proof-agent bench --ebpf`; never shipped as a library.
#include "fake_common.h"

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct CUlaunchConfig_st CUlaunchConfig;

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra) {
    fake_calls++;
    return 0;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra) {
    fake_calls++;
    return 0;
}

CUresult cuStreamSynchronize(CUstream hStream) { fake_calls++; delay(); return 0; }
CUresult cuEventSynchronize(CUevent hEvent) { fake_calls++; delay(); return 0; }
CUresult cuCtxSynchronize(void) { fake_calls++; delay(); return 0; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t ByteCount) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t ByteCount) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t ByteCount, CUstream s) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t ByteCount, CUstream s) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream s) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                      CUcontext srcContext, size_t ByteCount) {
    fake_calls++; delay(); return 0;
}

typedef void *CUgraphExec;
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    fake_calls++; delay(); return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    fake_calls++; delay(); if (dptr) *dptr = 0x1000; return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    fake_calls++; delay(); if (dptr) *dptr = 0x1000; return 0;
}
CUresult cuMemFree_v2(CUdeviceptr dptr) { fake_calls++; delay(); return 0; }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { fake_calls++; delay(); return 0; }
