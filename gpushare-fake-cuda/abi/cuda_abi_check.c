/*
 * ABI cross-check of the gpushare mock libcuda against NVIDIA's own cuda.h / cudaTypedefs.h.
 *
 * Compiled by tests/c_abi.rs:
 *   cc -std=c11 -I<dir of cuda.h> -DRUST_...=<layout of the Rust mirrors> cuda_abi_check.c \
 *      -L<dir with libcuda.so> -lcuda
 * and run as `cuda_abi_check <pid in the scenario> <pid not in it>` with LD_LIBRARY_PATH=<that
 * dir> and GPUSHARE_FAKE_NVML_STATE=<scenario>.
 *
 * 1. _Static_asserts pin the header's checkpoint structs, CUprocessState values, the CUresult
 *    codes the agent tells apart and the cuGetProcAddress enums, and compare them with the Rust
 *    mirrors (gpushare-fake-cuda/src/abi.rs, gpushare-fake-driver/src/cuda.rs) passed in as
 *    -DRUST_* macros. The PFN_*_v12080 typedefs pin the ABI version the agent asks for.
 * 2. The program calls the library through the header's prototypes (cuGetProcAddress is
 *    cuGetProcAddress_v2) and prints a canonical text that the Rust test compares with what the
 *    scenario implies. Without a usable scenario it prints "init <rc> <name>" and exits 3.
 *
 * -DGPUSHARE_ABI_SELFTEST_BREAK passes the lock's timeout through a deliberately wrong local
 * layout (timeoutMs after 8 reserved bytes), to prove that the comparison notices a layout error.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaTypedefs.h" /* includes cuda.h */

/* --- the header as we know it ------------------------------------------------------------ */
_Static_assert(CUDA_VERSION >= 12080, "the checkpoint API is in CUDA 12.8 and later");
_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");
_Static_assert(offsetof(CUcheckpointLockArgs, timeoutMs) == 0, "timeoutMs");
_Static_assert(offsetof(CUcheckpointLockArgs, reserved0) == 4, "reserved0");
_Static_assert(offsetof(CUcheckpointLockArgs, reserved1) == 8, "reserved1");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "CUcheckpointCheckpointArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "CUcheckpointUnlockArgs is 64 bytes");
#if CUDA_VERSION >= 13040
/* Words that were reserved in 12.8 and have a meaning since (the mock requires them zero). */
_Static_assert(offsetof(CUcheckpointCheckpointArgs, customStorageInfo_out) == 0, "custom storage");
_Static_assert(offsetof(CUcheckpointRestoreArgs, gpuPairs) == 0, "gpuPairs");
_Static_assert(offsetof(CUcheckpointRestoreArgs, gpuPairsCount) == 8, "gpuPairsCount");
_Static_assert(offsetof(CUcheckpointRestoreArgs, customStorageInfo_out) == 16, "restore custom storage");
_Static_assert(sizeof(CUcheckpointGpuPair) == 32, "CUcheckpointGpuPair");
_Static_assert(CU_PROCESS_STATE_CHECKPOINTING == 4 && CU_PROCESS_STATE_RESTORING == 5, "13.4 states");
#endif
_Static_assert(sizeof(CUprocessState) == sizeof(int), "CUprocessState is an int-sized enum");
_Static_assert(CU_PROCESS_STATE_RUNNING == 0 && CU_PROCESS_STATE_LOCKED == 1 &&
                   CU_PROCESS_STATE_CHECKPOINTED == 2 && CU_PROCESS_STATE_FAILED == 3,
               "CUprocessState values");
_Static_assert(CUDA_SUCCESS == 0 && CUDA_ERROR_INVALID_VALUE == 1 && CUDA_ERROR_OUT_OF_MEMORY == 2 &&
                   CUDA_ERROR_NOT_INITIALIZED == 3 && CUDA_ERROR_NO_DEVICE == 100 &&
                   CUDA_ERROR_OPERATING_SYSTEM == 304 && CUDA_ERROR_ILLEGAL_STATE == 401 &&
                   CUDA_ERROR_NOT_FOUND == 500 && CUDA_ERROR_NOT_READY == 600 &&
                   CUDA_ERROR_NOT_SUPPORTED == 801 && CUDA_ERROR_TIMEOUT == 909 &&
                   CUDA_ERROR_UNKNOWN == 999,
               "CUresult codes");
_Static_assert(CU_GET_PROC_ADDRESS_DEFAULT == 0 && CU_GET_PROC_ADDRESS_SUCCESS == 0 &&
                   CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND == 1 &&
                   CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT == 2,
               "cuGetProcAddress enums");

/* The prototypes the agent and the mock use are cuda.h's, at the CUDA 12.8 ABI. */
static PFN_cuCheckpointProcessGetState_v12080 pfn_get_state = cuCheckpointProcessGetState;
static PFN_cuCheckpointProcessLock_v12080 pfn_lock = cuCheckpointProcessLock;
static PFN_cuCheckpointProcessCheckpoint_v12080 pfn_checkpoint = cuCheckpointProcessCheckpoint;
static PFN_cuCheckpointProcessRestore_v12080 pfn_restore = cuCheckpointProcessRestore;
static PFN_cuCheckpointProcessUnlock_v12080 pfn_unlock = cuCheckpointProcessUnlock;
static PFN_cuGetProcAddress_v12000 pfn_proc_address = cuGetProcAddress; /* = cuGetProcAddress_v2 */

/* --- the Rust mirrors agree with the header ----------------------------------------------- */
#ifdef RUST_SIZEOF_LOCK_ARGS
_Static_assert(sizeof(CUcheckpointLockArgs) == RUST_SIZEOF_LOCK_ARGS, "Rust LockArgs size");
_Static_assert(offsetof(CUcheckpointLockArgs, timeoutMs) == RUST_OFFSET_LOCK_ARGS_TIMEOUT, "Rust LockArgs.timeout_ms");
_Static_assert(offsetof(CUcheckpointLockArgs, reserved0) == RUST_OFFSET_LOCK_ARGS_RESERVED0, "Rust LockArgs.reserved0");
_Static_assert(offsetof(CUcheckpointLockArgs, reserved1) == RUST_OFFSET_LOCK_ARGS_RESERVED1, "Rust LockArgs.reserved1");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == RUST_SIZEOF_RESERVED_ARGS, "Rust CheckpointArgs size");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == RUST_SIZEOF_RESERVED_ARGS, "Rust RestoreArgs size");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == RUST_SIZEOF_RESERVED_ARGS, "Rust UnlockArgs size");
_Static_assert(CU_PROCESS_STATE_RUNNING == RUST_PROCESS_STATE_RUNNING && CU_PROCESS_STATE_LOCKED == RUST_PROCESS_STATE_LOCKED &&
                   CU_PROCESS_STATE_CHECKPOINTED == RUST_PROCESS_STATE_CHECKPOINTED &&
                   CU_PROCESS_STATE_FAILED == RUST_PROCESS_STATE_FAILED,
               "Rust process states");
_Static_assert(CUDA_ERROR_INVALID_VALUE == RUST_CUDA_ERROR_INVALID_VALUE && CUDA_ERROR_OUT_OF_MEMORY == RUST_CUDA_ERROR_OUT_OF_MEMORY &&
                   CUDA_ERROR_NOT_INITIALIZED == RUST_CUDA_ERROR_NOT_INITIALIZED && CUDA_ERROR_NO_DEVICE == RUST_CUDA_ERROR_NO_DEVICE &&
                   CUDA_ERROR_OPERATING_SYSTEM == RUST_CUDA_ERROR_OPERATING_SYSTEM &&
                   CUDA_ERROR_ILLEGAL_STATE == RUST_CUDA_ERROR_ILLEGAL_STATE && CUDA_ERROR_NOT_FOUND == RUST_CUDA_ERROR_NOT_FOUND &&
                   CUDA_ERROR_NOT_READY == RUST_CUDA_ERROR_NOT_READY && CUDA_ERROR_NOT_SUPPORTED == RUST_CUDA_ERROR_NOT_SUPPORTED &&
                   CUDA_ERROR_TIMEOUT == RUST_CUDA_ERROR_TIMEOUT && CUDA_ERROR_UNKNOWN == RUST_CUDA_ERROR_UNKNOWN,
               "Rust CUresult codes");
_Static_assert(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND == RUST_PROC_ADDRESS_SYMBOL_NOT_FOUND &&
                   CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT == RUST_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
               "Rust cuGetProcAddress status values");
#endif

static const char *name(CUresult rc) {
    const char *s = NULL;
    return cuGetErrorName(rc, &s) == CUDA_SUCCESS && s ? s : "?";
}

static void state(const char *what, int pid) {
    CUprocessState st = (CUprocessState)-1;
    CUresult rc = pfn_get_state(pid, &st);
    printf("%s state rc=%d %s state=%d\n", what, (int)rc, name(rc), rc == CUDA_SUCCESS ? (int)st : -1);
}

static void result(const char *what, CUresult rc) { printf("%s rc=%d %s\n", what, (int)rc, name(rc)); }

static CUresult lock(int pid, unsigned int timeout_ms) {
#ifdef GPUSHARE_ABI_SELFTEST_BREAK
    struct wrong_layout {
        unsigned long long reserved;
        unsigned int timeoutMs;
        char rest[52];
    } args;
    memset(&args, 0, sizeof args);
    args.timeoutMs = timeout_ms;
    return pfn_lock(pid, (CUcheckpointLockArgs *)(void *)&args);
#else
    CUcheckpointLockArgs args;
    memset(&args, 0, sizeof args);
    args.timeoutMs = timeout_ms;
    return pfn_lock(pid, &args);
#endif
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int pid = atoi(argv[1]), stranger = atoi(argv[2]);
    int version = 0;
    CUresult rc = cuDriverGetVersion(&version);
    printf("version rc=%d %d\n", (int)rc, version);
    if (rc != CUDA_SUCCESS) {
        rc = cuInit(0);
        printf("init %d %s\n", (int)rc, name(rc));
        return 3;
    }

    /* Entry points through cuGetProcAddress, as the agent takes them. */
    const char *names[] = {"cuCheckpointProcessGetState", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                           "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"};
    void *direct[] = {(void *)pfn_get_state, (void *)pfn_lock, (void *)pfn_checkpoint, (void *)pfn_restore,
                      (void *)pfn_unlock};
    for (int i = 0; i < 5; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult status = (CUdriverProcAddressQueryResult)-1;
        rc = pfn_proc_address(names[i], &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        printf("procaddress %s rc=%d status=%d same=%d\n", names[i], (int)rc, (int)status, p == direct[i]);
        p = NULL;
        rc = pfn_proc_address(names[i], &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        printf("procaddress %s@12000 rc=%d status=%d null=%d\n", names[i], (int)rc, (int)status, p == NULL);
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult status = (CUdriverProcAddressQueryResult)-1;
    rc = pfn_proc_address("cuNoSuchFunction", &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    printf("procaddress cuNoSuchFunction rc=%d status=%d null=%d\n", (int)rc, (int)status, p == NULL);
    rc = pfn_proc_address("cuInit", &p, version + 10, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    result("procaddress newer-than-driver", rc);

    /* Refusals while RUNNING, and a pid without CUDA. */
    state("start", pid);
    result("checkpoint-running", pfn_checkpoint(pid, NULL));
    result("restore-running", pfn_restore(pid, NULL));
    result("unlock-running", pfn_unlock(pid, NULL));
    state("stranger", stranger);
    result("lock-stranger", lock(stranger, 10));

    /* RUNNING -> LOCKED -> CHECKPOINTED; restore needs cuInit; -> LOCKED -> RUNNING. */
    result("lock", lock(pid, 100));
    state("locked", pid);
    CUcheckpointCheckpointArgs cargs;
    memset(&cargs, 0, sizeof cargs);
    result("checkpoint", pfn_checkpoint(pid, &cargs));
    state("checkpointed", pid);
    result("unlock-checkpointed", pfn_unlock(pid, NULL));
    result("restore-before-init", pfn_restore(pid, NULL));
    result("init", cuInit(0));
    CUcheckpointRestoreArgs rargs;
    memset(&rargs, 0, sizeof rargs);
    result("restore", pfn_restore(pid, &rargs));
    state("restored", pid);
    CUcheckpointUnlockArgs uargs;
    memset(&uargs, 0, sizeof uargs);
    result("unlock", pfn_unlock(pid, &uargs));
    state("end", pid);

    /* Reserved words must be zero. */
    CUcheckpointLockArgs bad;
    memset(&bad, 0, sizeof bad);
    bad.reserved0 = 1;
    result("lock-reserved", pfn_lock(pid, &bad));

    const char *text = NULL;
    rc = cuGetErrorString(CUDA_ERROR_ILLEGAL_STATE, &text);
    printf("string 401 rc=%d %s\n", (int)rc, text ? text : "(null)");
    text = "x";
    rc = cuGetErrorString((CUresult)12345, &text);
    printf("string 12345 rc=%d null=%d\n", (int)rc, text == NULL);
    return 0;
}
