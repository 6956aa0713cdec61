// Calls the stand-in libcuda/libnccl (fake_cuda.c, fake_nccl.c) at the rates, counts and
// durations it is told, one command per line on stdin, answering "ok ..." on stdout after
// each, so a test knows exactly what the probes should have seen and when.
//
//   driver LIBDIR            loads LIBDIR/libcuda.so.1 and LIBDIR/libnccl.so.2 with dlopen
//                            (as the CUDA runtime does), prints "ready <pid>"
// commands:
//   launch N                 N x cuLaunchKernel
//   launchex N               N x cuLaunchKernelEx
//   threads T N              T threads, each N x cuLaunchKernel, concurrently
//   pause MS                 sleep MS milliseconds
//   sync stream|event|ctx N US        N synchronize calls, each blocking US microseconds
//   memcpy htod|dtoh|dtod|htod_async|dtoh_async|any|any_async|peer N BYTES US
//   nccl allreduce|allgather|reducescatter|broadcast|reduce|send|recv N COUNT DTYPE US
//   graph N US               N x cuGraphLaunch, each taking US microseconds
//   alloc N BYTES US         N x { cuMemAlloc_v2(BYTES); cuMemFree_v2 }, each taking US
//   allocasync N BYTES US    N x { cuMemAllocAsync(BYTES); cuMemFreeAsync }, each taking US
//   comm init|initconfig|abort N US   N x ncclCommInitRank / ncclCommInitRankConfig /
//                            ncclCommAbort, each taking US microseconds
//   group N US               N x { GroupStart; GroupStart; Send; Recv; GroupEnd; GroupEnd },
//                            the outer GroupEnd blocking US microseconds
//   bench launch|sync|allreduce N     time N calls (no delay); answers
//                            "ok <wall ns per call> <CPU ns per call, user+kernel>"
//   say TEXT                 write TEXT and a newline to stderr (for the write-capture test)
//   sayparts A|B|C           write(2) A, then B, then C, then "\n", as separate writes to
//                            stderr; the two characters \r stand for a carriage return
//   saylong N                one write to stderr of N 'x' and a newline
//   saynonl TEXT             write TEXT to stderr without a newline
//   exit
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*launchex_fn)(const void *, void *, void **, void **);
typedef int (*one_ptr_fn)(void *);
typedef int (*void_fn)(void);
typedef int (*memcpy3_fn)(unsigned long long, unsigned long long, size_t);
typedef int (*memcpy4_fn)(unsigned long long, unsigned long long, size_t, void *);
typedef int (*memcpy_peer_fn)(unsigned long long, void *, unsigned long long, void *, size_t);
typedef int (*nccl_coll_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*nccl_gather_fn)(const void *, void *, size_t, int, void *, void *);
typedef int (*nccl_rooted_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*nccl_reduce_fn)(const void *, void *, size_t, int, int, int, void *, void *);
typedef int (*nccl_p2p_fn)(const void *, size_t, int, int, void *, void *);
typedef int (*graph_fn)(void *, void *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*alloc_async_fn)(unsigned long long *, size_t, void *);
typedef int (*free_fn)(unsigned long long);
typedef int (*free_async_fn)(unsigned long long, void *);
typedef struct { char internal[128]; } unique_id;
typedef int (*comm_init_fn)(void **, int, unique_id, int);
typedef int (*comm_init_config_fn)(void **, int, unique_id, int, void *);
typedef int (*comm_abort_fn)(void *);

static void *cuda, *nccl;
static unsigned int *cuda_delay, *nccl_delay;
static launch_fn cu_launch;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "driver: missing symbol %s: %s\n", name, dlerror());
        exit(3);
    }
    return p;
}

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void launch_n(long n) {
    for (long i = 0; i < n; i++)
        cu_launch((void *)0x1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
}

static void *launch_thread(void *arg) {
    launch_n((long)arg);
    return NULL;
}

static int do_command(char *line) {
    char what[32] = "", kind[32] = "";
    long n = 0, a = 0, b = 0, c = 0;
    if (sscanf(line, "%31s", what) != 1)
        return 0;
    if (!strcmp(what, "exit")) {
        return 1;
    } else if (!strcmp(what, "launch") && sscanf(line, "%*s %ld", &n) == 1) {
        launch_n(n);
    } else if (!strcmp(what, "launchex") && sscanf(line, "%*s %ld", &n) == 1) {
        launchex_fn f = (launchex_fn)sym(cuda, "cuLaunchKernelEx");
        for (long i = 0; i < n; i++)
            f(NULL, (void *)0x1, NULL, NULL);
    } else if (!strcmp(what, "threads") && sscanf(line, "%*s %ld %ld", &a, &n) == 2) {
        pthread_t tids[64];
        if (a > 64)
            a = 64;
        for (long t = 0; t < a; t++)
            pthread_create(&tids[t], NULL, launch_thread, (void *)n);
        for (long t = 0; t < a; t++)
            pthread_join(tids[t], NULL);
    } else if (!strcmp(what, "pause") && sscanf(line, "%*s %ld", &n) == 1) {
        struct timespec ts = {n / 1000, (n % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    } else if (!strcmp(what, "sync") && sscanf(line, "%*s %31s %ld %ld", kind, &n, &a) == 3) {
        *cuda_delay = (unsigned)a;
        if (!strcmp(kind, "ctx")) {
            void_fn f = (void_fn)sym(cuda, "cuCtxSynchronize");
            for (long i = 0; i < n; i++)
                f();
        } else {
            one_ptr_fn f = (one_ptr_fn)sym(
                cuda, !strcmp(kind, "event") ? "cuEventSynchronize" : "cuStreamSynchronize");
            for (long i = 0; i < n; i++)
                f(NULL);
        }
        *cuda_delay = 0;
    } else if (!strcmp(what, "memcpy") &&
               sscanf(line, "%*s %31s %ld %ld %ld", kind, &n, &b, &a) == 4) {
        *cuda_delay = (unsigned)a;
        for (long i = 0; i < n; i++) {
            if (!strcmp(kind, "peer"))
                ((memcpy_peer_fn)sym(cuda, "cuMemcpyPeer"))(0x10, NULL, 0x20, NULL, (size_t)b);
            else if (!strcmp(kind, "htod"))
                ((memcpy3_fn)sym(cuda, "cuMemcpyHtoD_v2"))(0x10, 0x20, (size_t)b);
            else if (!strcmp(kind, "dtoh"))
                ((memcpy3_fn)sym(cuda, "cuMemcpyDtoH_v2"))(0x10, 0x20, (size_t)b);
            else if (!strcmp(kind, "dtod"))
                ((memcpy3_fn)sym(cuda, "cuMemcpyDtoD_v2"))(0x10, 0x20, (size_t)b);
            else if (!strcmp(kind, "htod_async"))
                ((memcpy4_fn)sym(cuda, "cuMemcpyHtoDAsync_v2"))(0x10, 0x20, (size_t)b, NULL);
            else if (!strcmp(kind, "dtoh_async"))
                ((memcpy4_fn)sym(cuda, "cuMemcpyDtoHAsync_v2"))(0x10, 0x20, (size_t)b, NULL);
            else if (!strcmp(kind, "any_async"))
                ((memcpy4_fn)sym(cuda, "cuMemcpyAsync"))(0x10, 0x20, (size_t)b, NULL);
            else
                ((memcpy3_fn)sym(cuda, "cuMemcpy"))(0x10, 0x20, (size_t)b);
        }
        *cuda_delay = 0;
    } else if (!strcmp(what, "nccl") &&
               sscanf(line, "%*s %31s %ld %ld %ld %ld", kind, &n, &b, &c, &a) == 5) {
        *nccl_delay = (unsigned)a;
        char buf[8];
        for (long i = 0; i < n; i++) {
            if (!strcmp(kind, "allreduce"))
                ((nccl_coll_fn)sym(nccl, "ncclAllReduce"))(buf, buf, b, c, 0, NULL, NULL);
            else if (!strcmp(kind, "allgather"))
                ((nccl_gather_fn)sym(nccl, "ncclAllGather"))(buf, buf, b, c, NULL, NULL);
            else if (!strcmp(kind, "reducescatter"))
                ((nccl_coll_fn)sym(nccl, "ncclReduceScatter"))(buf, buf, b, c, 0, NULL, NULL);
            else if (!strcmp(kind, "broadcast"))
                ((nccl_rooted_fn)sym(nccl, "ncclBroadcast"))(buf, buf, b, c, 0, NULL, NULL);
            else if (!strcmp(kind, "reduce"))
                ((nccl_reduce_fn)sym(nccl, "ncclReduce"))(buf, buf, b, c, 0, 0, NULL, NULL);
            else if (!strcmp(kind, "send"))
                ((nccl_p2p_fn)sym(nccl, "ncclSend"))(buf, b, c, 1, NULL, NULL);
            else if (!strcmp(kind, "recv"))
                ((nccl_p2p_fn)sym(nccl, "ncclRecv"))(buf, b, c, 1, NULL, NULL);
        }
        *nccl_delay = 0;
    } else if (!strcmp(what, "graph") && sscanf(line, "%*s %ld %ld", &n, &a) == 2) {
        *cuda_delay = (unsigned)a;
        graph_fn f = (graph_fn)sym(cuda, "cuGraphLaunch");
        for (long i = 0; i < n; i++)
            f(NULL, NULL);
        *cuda_delay = 0;
    } else if ((!strcmp(what, "alloc") || !strcmp(what, "allocasync")) &&
               sscanf(line, "%*s %ld %ld %ld", &n, &b, &a) == 3) {
        *cuda_delay = (unsigned)a;
        unsigned long long ptr = 0;
        for (long i = 0; i < n; i++) {
            if (!strcmp(what, "alloc")) {
                ((alloc_fn)sym(cuda, "cuMemAlloc_v2"))(&ptr, (size_t)b);
                ((free_fn)sym(cuda, "cuMemFree_v2"))(ptr);
            } else {
                ((alloc_async_fn)sym(cuda, "cuMemAllocAsync"))(&ptr, (size_t)b, NULL);
                ((free_async_fn)sym(cuda, "cuMemFreeAsync"))(ptr, NULL);
            }
        }
        *cuda_delay = 0;
    } else if (!strcmp(what, "comm") && sscanf(line, "%*s %31s %ld %ld", kind, &n, &a) == 3) {
        *nccl_delay = (unsigned)a;
        unique_id id;
        memset(&id, 0, sizeof id);
        void *comm = NULL;
        for (long i = 0; i < n; i++) {
            if (!strcmp(kind, "init"))
                ((comm_init_fn)sym(nccl, "ncclCommInitRank"))(&comm, 8, id, 0);
            else if (!strcmp(kind, "initconfig"))
                ((comm_init_config_fn)sym(nccl, "ncclCommInitRankConfig"))(&comm, 8, id, 0, NULL);
            else
                ((comm_abort_fn)sym(nccl, "ncclCommAbort"))(comm);
        }
        *nccl_delay = 0;
    } else if (!strcmp(what, "group") && sscanf(line, "%*s %ld %ld", &n, &a) == 2) {
        void_fn start = (void_fn)sym(nccl, "ncclGroupStart"), end = (void_fn)sym(nccl, "ncclGroupEnd");
        nccl_p2p_fn send = (nccl_p2p_fn)sym(nccl, "ncclSend");
        nccl_p2p_fn recv = (nccl_p2p_fn)sym(nccl, "ncclRecv");
        char buf[8];
        for (long i = 0; i < n; i++) {
            start();
            start();
            send(buf, 256, 7, 1, NULL, NULL);
            recv(buf, 256, 7, 1, NULL, NULL);
            end();
            *nccl_delay = (unsigned)a;
            end();
            *nccl_delay = 0;
        }
    } else if (!strcmp(what, "bench") && sscanf(line, "%*s %31s %ld", kind, &n) == 2) {
        long long t0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        if (!strcmp(kind, "launch")) {
            launch_n(n);
        } else if (!strcmp(kind, "sync")) {
            one_ptr_fn f = (one_ptr_fn)sym(cuda, "cuStreamSynchronize");
            for (long i = 0; i < n; i++)
                f(NULL);
        } else if (!strcmp(kind, "allreduce")) {
            nccl_coll_fn f = (nccl_coll_fn)sym(nccl, "ncclAllReduce");
            char buf[8];
            for (long i = 0; i < n; i++)
                f(buf, buf, 1024, 7, 0, NULL, NULL);
        } else {
            printf("error unknown bench %s\n", kind);
            fflush(stdout);
            return 0;
        }
        long long t1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        double calls = n ? (double)n : 1.0;
        printf("ok %.3f %.3f\n", (double)(t1 - t0) / calls, (double)(c1 - c0) / calls);
        fflush(stdout);
        return 0;
    } else if (!strcmp(what, "sayparts")) {
        char *text = line + 8;
        while (*text == ' ')
            text++;
        for (char *part = strtok(text, "|"); part; part = strtok(NULL, "|")) {
            char out[4096];
            size_t o = 0;
            for (const char *p = part; *p && o < sizeof out; p++) {
                if (p[0] == '\\' && p[1] == 'r') {
                    out[o++] = '\r';
                    p++;
                } else {
                    out[o++] = *p;
                }
            }
            if (write(2, out, o) < 0)
                return 0;
        }
        if (write(2, "\n", 1) < 0)
            return 0;
    } else if (!strcmp(what, "saylong") && sscanf(line, "%*s %ld", &n) == 1) {
        char *out = malloc((size_t)n + 1);
        memset(out, 'x', (size_t)n);
        out[n] = '\n';
        ssize_t written = write(2, out, (size_t)n + 1);
        free(out);
        if (written < 0)
            return 0;
    } else if (!strcmp(what, "saynonl")) {
        const char *text = line + 7;
        while (*text == ' ')
            text++;
        if (write(2, text, strlen(text)) < 0)
            return 0;
    } else if (!strcmp(what, "say")) {
        const char *text = line + 3;
        while (*text == ' ')
            text++;
        fprintf(stderr, "%s\n", text);
    } else {
        printf("error bad command: %s\n", line);
        fflush(stdout);
        return 0;
    }
    printf("ok\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: driver LIBDIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/libcuda.so.1", argv[1]);
    cuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    snprintf(path, sizeof path, "%s/libnccl.so.2", argv[1]);
    nccl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cuda || !nccl) {
        fprintf(stderr, "driver: dlopen failed: %s\n", dlerror());
        return 3;
    }
    cuda_delay = (unsigned int *)sym(cuda, "fake_delay_us");
    nccl_delay = (unsigned int *)sym(nccl, "fake_delay_us");
    cu_launch = (launch_fn)sym(cuda, "cuLaunchKernel");
    setvbuf(stderr, NULL, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (do_command(line))
            break;
    }
    return 0;
}
