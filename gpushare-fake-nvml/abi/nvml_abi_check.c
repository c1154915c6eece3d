/*
 * ABI cross-check of the gpushare mock libnvidia-ml against NVIDIA's own nvml.h.
 *
 * Compiled by tests/c_abi.rs:
 *   cc -std=c11 -I<dir of nvml.h> -DRUST_...=<layout of the Rust structs> nvml_abi_check.c \
 *      -L<dir with libnvidia-ml.so> -lnvidia-ml
 * and run with LD_LIBRARY_PATH=<that dir> and GPUSHARE_FAKE_NVML_STATE=<scenario>.
 *
 * 1. _Static_asserts pin the header's struct layouts, version macro and return codes, and
 *    compare them with the layout of the Rust mirrors (src/abi.rs), passed in as -DRUST_* macros.
 * 2. The program calls the library through the header's prototypes (nvmlInit -> nvmlInit_v2,
 *    nvmlDeviceGetComputeRunningProcesses -> _v3, ...) and prints a canonical text that the
 *    Rust test compares with what the scenario implies. Unexpected return codes are printed as
 *    "error ..." lines and make the exit status 1. A failed init prints "init <rc> <text>" and
 *    exits with 3.
 *
 * -DGPUSHARE_ABI_SELFTEST_BREAK reads the process records through a deliberately wrong local
 * layout (16-byte stride, the v1 record), to prove that the comparison notices a layout error.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml.h"

/* --- the header as we know it ------------------------------------------------------------ */
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t (v2) is 24 bytes");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t is 24 bytes");
_Static_assert(offsetof(nvmlProcessInfo_t, pid) == 0, "pid");
_Static_assert(offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8, "usedGpuMemory");
_Static_assert(offsetof(nvmlProcessInfo_t, gpuInstanceId) == 16, "gpuInstanceId");
_Static_assert(offsetof(nvmlProcessInfo_t, computeInstanceId) == 20, "computeInstanceId");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t is 16 bytes");
_Static_assert(offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == 8, "v1 usedGpuMemory");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");
_Static_assert(offsetof(nvmlMemory_t, free) == 8 && offsetof(nvmlMemory_t, used) == 16, "nvmlMemory_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t is 40 bytes");
_Static_assert(offsetof(nvmlMemory_v2_t, total) == 8, "v2 total");
_Static_assert(offsetof(nvmlMemory_v2_t, reserved) == 16, "v2 reserved");
_Static_assert(offsetof(nvmlMemory_v2_t, free) == 24, "v2 free");
_Static_assert(offsetof(nvmlMemory_v2_t, used) == 32, "v2 used");
_Static_assert(nvmlMemory_v2 == 0x02000028, "nvmlMemory_v2 version macro");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t");
_Static_assert(offsetof(nvmlUtilization_t, memory) == 4, "nvmlUtilization_t.memory");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t is 32 bytes");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, timeStamp) == 8, "timeStamp");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, smUtil) == 16, "smUtil");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, decUtil) == 28, "decUtil");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == 40, "nvmlProcessUtilizationInfo_v1_t is 40 bytes");
_Static_assert(offsetof(nvmlProcessUtilizationInfo_v1_t, pid) == 8, "nvmlProcessUtilizationInfo_v1_t.pid");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_t) == 24, "nvmlProcessesUtilizationInfo_t is 24 bytes");
_Static_assert(offsetof(nvmlProcessesUtilizationInfo_t, lastSeenTimeStamp) == 8, "lastSeenTimeStamp");
_Static_assert(nvmlProcessesUtilizationInfo_v1 == 0x01000018, "nvmlProcessesUtilizationInfo_v1 version macro");
_Static_assert(NVML_CLOCK_GRAPHICS == 0 && NVML_CLOCK_SM == 1 && NVML_CLOCK_VIDEO == 3, "nvmlClockType_t");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(offsetof(nvmlPciInfo_t, domain) == 16, "nvmlPciInfo_t.domain");
_Static_assert(offsetof(nvmlPciInfo_t, pciSubSystemId) == 32, "nvmlPciInfo_t.pciSubSystemId");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId");
_Static_assert(NVML_VALUE_NOT_AVAILABLE == -1, "NVML_VALUE_NOT_AVAILABLE");
_Static_assert(NVML_SUCCESS == 0 && NVML_ERROR_UNINITIALIZED == 1 && NVML_ERROR_INVALID_ARGUMENT == 2 &&
                   NVML_ERROR_NOT_SUPPORTED == 3 && NVML_ERROR_NOT_FOUND == 6 &&
                   NVML_ERROR_INSUFFICIENT_SIZE == 7 && NVML_ERROR_DRIVER_NOT_LOADED == 9 &&
                   NVML_ERROR_GPU_IS_LOST == 15 && NVML_ERROR_ARGUMENT_VERSION_MISMATCH == 25 &&
                   NVML_ERROR_UNKNOWN == 999,
               "return codes");
_Static_assert(NVML_BRAND_NVIDIA == 14 && NVML_DEVICE_ARCH_HOPPER == 9, "enums");
/* Driver-enforced per-cgroup limits (nvml.h of CUDA 13.4+): no version field in either struct. */
_Static_assert(sizeof(nvmlSetMemoryLimits_v1_t) == 24, "nvmlSetMemoryLimits_v1_t is 24 bytes");
_Static_assert(offsetof(nvmlSetMemoryLimits_v1_t, nameSpace) == 0, "nameSpace");
_Static_assert(offsetof(nvmlSetMemoryLimits_v1_t, softLimit) == 8, "softLimit");
_Static_assert(offsetof(nvmlSetMemoryLimits_v1_t, hardLimit) == 16, "hardLimit");
_Static_assert(sizeof(nvmlGetMemoryLimits_v1_t) == 32, "nvmlGetMemoryLimits_v1_t is 32 bytes");
_Static_assert(offsetof(nvmlGetMemoryLimits_v1_t, currentUsed) == 24, "currentUsed");
_Static_assert(NVML_DEVICE_MEMORY_LIMIT_MAX == 0xFFFFFFFFFFFFFFFFull, "NVML_DEVICE_MEMORY_LIMIT_MAX");
_Static_assert(NVML_ERROR_OPERATING_SYSTEM == 17, "NVML_ERROR_OPERATING_SYSTEM");

/* --- the Rust mirrors agree with the header ----------------------------------------------- */
#ifdef RUST_SIZEOF_PROCESS_INFO_V2
_Static_assert(sizeof(nvmlProcessInfo_t) == RUST_SIZEOF_PROCESS_INFO_V2, "Rust ProcessInfoV2 size");
_Static_assert(offsetof(nvmlProcessInfo_t, usedGpuMemory) == RUST_OFFSET_PROCESS_INFO_V2_USED, "Rust ProcessInfoV2.used");
_Static_assert(offsetof(nvmlProcessInfo_t, gpuInstanceId) == RUST_OFFSET_PROCESS_INFO_V2_GI, "Rust ProcessInfoV2.gi");
_Static_assert(offsetof(nvmlProcessInfo_t, computeInstanceId) == RUST_OFFSET_PROCESS_INFO_V2_CI, "Rust ProcessInfoV2.ci");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == RUST_SIZEOF_PROCESS_INFO_V1, "Rust ProcessInfoV1 size");
_Static_assert(sizeof(nvmlMemory_t) == RUST_SIZEOF_MEMORY, "Rust Memory size");
_Static_assert(sizeof(nvmlMemory_v2_t) == RUST_SIZEOF_MEMORY_V2, "Rust MemoryV2 size");
_Static_assert(offsetof(nvmlMemory_v2_t, reserved) == RUST_OFFSET_MEMORY_V2_RESERVED, "Rust MemoryV2.reserved");
_Static_assert(offsetof(nvmlMemory_v2_t, used) == RUST_OFFSET_MEMORY_V2_USED, "Rust MemoryV2.used");
_Static_assert(nvmlMemory_v2 == RUST_MEMORY_V2_VERSION, "Rust MEMORY_V2_VERSION");
_Static_assert(sizeof(nvmlUtilization_t) == RUST_SIZEOF_UTILIZATION, "Rust Utilization size");
_Static_assert(sizeof(nvmlPciInfo_t) == RUST_SIZEOF_PCI_INFO, "Rust PciInfo size");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == RUST_SIZEOF_PROCESS_UTILIZATION, "Rust ProcessUtilizationSample size");
_Static_assert(offsetof(nvmlProcessUtilizationSample_t, smUtil) == RUST_OFFSET_PROCESS_UTILIZATION_SM, "Rust ProcessUtilizationSample.sm_util");
_Static_assert(sizeof(nvmlProcessUtilizationInfo_v1_t) == RUST_SIZEOF_PROCESS_UTILIZATION_INFO, "Rust ProcessUtilizationInfoV1 size");
_Static_assert(sizeof(nvmlProcessesUtilizationInfo_t) == RUST_SIZEOF_PROCESSES_UTILIZATION_INFO, "Rust ProcessesUtilizationInfoV1 size");
_Static_assert(nvmlProcessesUtilizationInfo_v1 == RUST_PROCESSES_UTILIZATION_INFO_VERSION, "Rust PROCESSES_UTILIZATION_INFO_V1_VERSION");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == RUST_OFFSET_PCI_INFO_BUS_ID, "Rust PciInfo.bus_id");
_Static_assert(sizeof(nvmlSetMemoryLimits_v1_t) == RUST_SIZEOF_SET_MEMORY_LIMITS, "Rust SetMemoryLimitsV1 size");
_Static_assert(offsetof(nvmlSetMemoryLimits_v1_t, hardLimit) == RUST_OFFSET_SET_MEMORY_LIMITS_HARD, "Rust SetMemoryLimitsV1.hard_limit");
_Static_assert(sizeof(nvmlGetMemoryLimits_v1_t) == RUST_SIZEOF_GET_MEMORY_LIMITS, "Rust GetMemoryLimitsV1 size");
_Static_assert(offsetof(nvmlGetMemoryLimits_v1_t, currentUsed) == RUST_OFFSET_GET_MEMORY_LIMITS_USED, "Rust GetMemoryLimitsV1.current_used");
#endif

static int failures = 0;

static void unexpected(const char *what, unsigned int index, nvmlReturn_t rc) {
    printf("error %s device=%u rc=%d %s\n", what, index, (int)rc, nvmlErrorString(rc));
    failures++;
}

static void print_used(unsigned long long used) {
    if (used == (unsigned long long)NVML_VALUE_NOT_AVAILABLE) {
        printf("n/a");
    } else {
        printf("%llu", used);
    }
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);

/* The two-call protocol: size query with NULL, then a buffer of exactly that many records. */
static void list_processes(const char *kind, list_fn fn, nvmlDevice_t h, unsigned int index) {
    unsigned int count = 0;
    nvmlReturn_t rc = fn(h, &count, NULL);
    if (rc == NVML_SUCCESS) {
        if (count != 0) unexpected("size query: SUCCESS with count != 0", index, rc);
        return;
    }
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
        unexpected(kind, index, rc);
        return;
    }
    /* Room for `count` real records (plus one), whatever layout we read them with. */
    void *buffer = calloc((size_t)count + 1, sizeof(nvmlProcessInfo_t));
    if (buffer == NULL) abort();
    unsigned int capacity = count;
    rc = fn(h, &capacity, (nvmlProcessInfo_t *)buffer);
    if (rc != NVML_SUCCESS) {
        unexpected(kind, index, rc);
        free(buffer);
        return;
    }
    if (capacity != count) printf("error %s device=%u count %u then %u\n", kind, index, count, capacity);
#ifdef GPUSHARE_ABI_SELFTEST_BREAK
    struct wrong_layout {
        unsigned int pid;
        unsigned long long used;
    } *records = buffer;
#else
    nvmlProcessInfo_t *records = buffer;
#endif
    for (unsigned int k = 0; k < capacity; k++) {
#ifdef GPUSHARE_ABI_SELFTEST_BREAK
        unsigned long long used = records[k].used;
#else
        unsigned long long used = records[k].usedGpuMemory;
        if (records[k].gpuInstanceId != 0xFFFFFFFFu || records[k].computeInstanceId != 0xFFFFFFFFu) {
            printf("error %s device=%u record %u has MIG ids %u/%u\n", kind, index, k,
                   records[k].gpuInstanceId, records[k].computeInstanceId);
            failures++;
        }
#endif
        printf("%s %u pid=%u used=", kind, index, records[k].pid);
        print_used(used);
        printf("\n");
    }
    free(buffer);
}

int main(void) {
    nvmlReturn_t rc = nvmlInit(); /* nvmlInit_v2 */
    printf("init %d %s\n", (int)rc, nvmlErrorString(rc));
    if (rc != NVML_SUCCESS) return 3;

    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    rc = nvmlSystemGetDriverVersion(driver, sizeof driver);
    if (rc != NVML_SUCCESS) unexpected("nvmlSystemGetDriverVersion", 0, rc);
    else printf("driver %s\n", driver);

    unsigned int n = 0;
    rc = nvmlDeviceGetCount(&n); /* _v2 */
    if (rc != NVML_SUCCESS) unexpected("nvmlDeviceGetCount", 0, rc);
    printf("count %u\n", n);

    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t h;
        rc = nvmlDeviceGetHandleByIndex(i, &h); /* _v2 */
        if (rc != NVML_SUCCESS) {
            printf("device %u handle %d %s\n", i, (int)rc, nvmlErrorString(rc));
            continue;
        }
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        if ((rc = nvmlDeviceGetUUID(h, uuid, sizeof uuid)) != NVML_SUCCESS) unexpected("uuid", i, rc);
        if ((rc = nvmlDeviceGetName(h, name, sizeof name)) != NVML_SUCCESS) unexpected("name", i, rc);

        nvmlDevice_t again;
        if ((rc = nvmlDeviceGetHandleByUUID(uuid, &again)) != NVML_SUCCESS) unexpected("by uuid", i, rc);
        else if (again != h) printf("error device=%u handle by uuid differs\n", i), failures++;
        unsigned int idx = 12345;
        if ((rc = nvmlDeviceGetIndex(h, &idx)) != NVML_SUCCESS) unexpected("index", i, rc);
        else if (idx != i) printf("error device=%u index %u\n", i, idx), failures++;

        nvmlMemory_t m1;
        if ((rc = nvmlDeviceGetMemoryInfo(h, &m1)) != NVML_SUCCESS) unexpected("memory v1", i, rc);
        nvmlMemory_v2_t m2;
        memset(&m2, 0, sizeof m2);
        m2.version = nvmlMemory_v2;
        if ((rc = nvmlDeviceGetMemoryInfo_v2(h, &m2)) != NVML_SUCCESS) unexpected("memory v2", i, rc);
        nvmlMemory_v2_t bad;
        memset(&bad, 0, sizeof bad);
        bad.version = (unsigned int)(sizeof(nvmlMemory_v2_t) | (1u << 24));
        rc = nvmlDeviceGetMemoryInfo_v2(h, &bad);
        if (rc != NVML_ERROR_ARGUMENT_VERSION_MISMATCH) unexpected("memory v2 with version 1", i, rc);

        nvmlPciInfo_t pci;
        if ((rc = nvmlDeviceGetPciInfo(h, &pci)) != NVML_SUCCESS) unexpected("pci", i, rc); /* _v3 */
        nvmlUtilization_t u;
        if ((rc = nvmlDeviceGetUtilizationRates(h, &u)) != NVML_SUCCESS) unexpected("utilization", i, rc);

        printf("device %u uuid=%s pci=%s total=%llu free=%llu used=%llu"
               " v2_total=%llu v2_reserved=%llu v2_free=%llu v2_used=%llu util=%u/%u name=%s\n",
               i, uuid, pci.busId, m1.total, m1.free, m1.used, m2.total, m2.reserved, m2.free, m2.used,
               u.gpu, u.memory, name);

        list_processes("compute", nvmlDeviceGetComputeRunningProcesses, h, i);   /* _v3 */
        list_processes("graphics", nvmlDeviceGetGraphicsRunningProcesses, h, i); /* _v3 */

        /* Per-process utilization: the size query, then the samples since timestamp 0. */
        unsigned int cnt = 0;
        rc = nvmlDeviceGetProcessUtilization(h, NULL, &cnt, 0);
        if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
            nvmlProcessUtilizationSample_t *samples = calloc(cnt, sizeof *samples);
            rc = nvmlDeviceGetProcessUtilization(h, samples, &cnt, 0);
            printf("procutil %u rc=%d\n", i, (int)rc);
            for (unsigned int k = 0; rc == NVML_SUCCESS && k < cnt; k++)
                printf("procutil %u pid=%u ts=%llu sm=%u mem=%u enc=%u dec=%u\n", i, samples[k].pid,
                       samples[k].timeStamp, samples[k].smUtil, samples[k].memUtil, samples[k].encUtil,
                       samples[k].decUtil);
            free(samples);
        } else {
            printf("procutil %u rc=%d\n", i, (int)rc);
        }
        /* The same through the versioned struct: the size query, the samples, a wrong version. */
        nvmlProcessesUtilizationInfo_t info = {nvmlProcessesUtilizationInfo_v1, 0, 0, NULL};
        rc = nvmlDeviceGetProcessesUtilizationInfo(h, &info);
        if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
            info.procUtilArray = calloc(info.processSamplesCount, sizeof *info.procUtilArray);
            rc = nvmlDeviceGetProcessesUtilizationInfo(h, &info);
            printf("procutilinfo %u rc=%d\n", i, (int)rc);
            for (unsigned int k = 0; rc == NVML_SUCCESS && k < info.processSamplesCount; k++)
                printf("procutilinfo %u pid=%u ts=%llu sm=%u mem=%u enc=%u dec=%u\n", i,
                       info.procUtilArray[k].pid, info.procUtilArray[k].timeStamp, info.procUtilArray[k].smUtil,
                       info.procUtilArray[k].memUtil, info.procUtilArray[k].encUtil, info.procUtilArray[k].decUtil);
            free(info.procUtilArray);
        } else {
            printf("procutilinfo %u rc=%d\n", i, (int)rc);
        }
        nvmlProcessesUtilizationInfo_t v2 = {(unsigned int)(sizeof(nvmlProcessesUtilizationInfo_t) | (2u << 24)), 0, 0, NULL};
        rc = nvmlDeviceGetProcessesUtilizationInfo(h, &v2);
        if (rc != NVML_ERROR_ARGUMENT_VERSION_MISMATCH) unexpected("processes utilization info with version 2", i, rc);
        unsigned int sm = 0;
        rc = nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM, &sm);
        printf("smclock %u rc=%d mhz=%u\n", i, (int)rc, sm);
    }

    if (n > 0) {
        /* Driver-enforced limits, through the header's prototypes (any existing directory
         * stands for a cgroup in the mock). */
        nvmlDevice_t h;
        nvmlSetMemoryLimits_v1_t set = {"/tmp", 1ull << 20, 2ull << 20};
        nvmlGetMemoryLimits_v1_t get = {"/tmp", 0, 0, 7};
        nvmlReturn_t s1 = nvmlDeviceGetHandleByIndex(0, &h);
        nvmlReturn_t s2 = nvmlDeviceSetMemoryLimits_v1(h, &set);
        nvmlReturn_t s3 = nvmlDeviceGetMemoryLimits_v1(h, &get);
        printf("limits %d %d %d soft=%llu hard=%llu used=%llu\n", (int)s1, (int)s2, (int)s3, get.softLimit,
               get.hardLimit, get.currentUsed);
        set.softLimit = 0;
        set.hardLimit = NVML_DEVICE_MEMORY_LIMIT_MAX;
        s2 = nvmlDeviceSetMemoryLimits_v1(h, &set);
        s3 = nvmlDeviceGetMemoryLimits_v1(h, &get);
        printf("limits clear %d %d\n", (int)s2, (int)s3);
    }

    rc = nvmlShutdown();
    nvmlReturn_t again = nvmlShutdown();
    printf("shutdown %d %d\n", (int)rc, (int)again);
    return failures == 0 ? 0 : 1;
}
