"""Lists what real NVML clients see through the gpushare mock; prints one JSON object.

Run by tests/pyclients.rs with the project venv's python, LD_LIBRARY_PATH pointing at the
installed mock (libnvidia-ml.so.1) and GPUSHARE_FAKE_NVML_STATE naming the scenario:

- nvidia-ml-py (pynvml): devices, memory v1 and v2, compute/graphics processes (the _v3
  functions with the two-call protocol), PCI bus id, handle by UUID, error strings;
- nvitop's Device API: the same listing as nvitop's UI builds it; nvitop decides the process
  record layout from the exported symbols, and logs every NVML function it could not find
  (reported here as "nvitop_unknown_functions", which must stay empty).
"""

import json
import logging
import sys

import pynvml


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def used(value):
    # pynvml maps NVML_VALUE_NOT_AVAILABLE to None.
    return None if value is None else int(value)


def with_pynvml():
    pynvml.nvmlInit()
    out = {
        "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion(),
        "error_string_15": text(pynvml.nvmlErrorString(15)),
        "devices": [],
    }
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = text(pynvml.nvmlDeviceGetUUID(h))
        m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        out["devices"].append(
            {
                "index": pynvml.nvmlDeviceGetIndex(h),
                "index_by_uuid": pynvml.nvmlDeviceGetIndex(by_uuid),
                "uuid": uuid,
                "name": text(pynvml.nvmlDeviceGetName(h)),
                "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                "memory_v1": {"total": m1.total, "free": m1.free, "used": m1.used},
                "memory_v2": {
                    "total": m2.total,
                    "reserved": m2.reserved,
                    "free": m2.free,
                    "used": m2.used,
                },
                "compute": [
                    {"pid": p.pid, "used": used(p.usedGpuMemory)}
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                ],
                "graphics": [
                    {"pid": p.pid, "used": used(p.usedGpuMemory)}
                    for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)
                ],
            }
        )
    pynvml.nvmlShutdown()
    return out


def with_nvitop():
    import nvitop
    from nvitop.api import libnvml

    devices = []
    for d in nvitop.Device.all():
        mem = d.memory_info()
        devices.append(
            {
                "index": d.index,
                "uuid": d.uuid(),
                "name": d.name(),
                "bus_id": d.bus_id(),
                "memory_total": mem.total,
                "memory_used": mem.used,
                "memory_free": mem.free,
                "processes": {
                    str(pid): {
                        "gpu_memory": p.gpu_memory() if isinstance(p.gpu_memory(), int) else None,
                        "type": p.type,
                    }
                    for pid, p in sorted(d.processes().items())
                },
            }
        )
    unknown = sorted(str(k) for k in libnvml.UNKNOWN_FUNCTIONS)
    return {"devices": devices, "unknown_functions": unknown}


def main():
    # nvitop logs missing NVML functions through `logging`; keep them off stdout.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    result = {"pynvml": with_pynvml(), "nvitop": with_nvitop()}
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
