//! A mock `libcuda.so.1`: the CUDA checkpoint driver API (`cuCheckpointProcess*`, CUDA 12.8,
//! NVIDIA driver r570+) and the few entry points a client needs around it (`cuInit`,
//! `cuDriverGetVersion`, `cuGetErrorName`, `cuGetErrorString`, `cuGetProcAddress_v2`), driven by
//! the mock NVML's scenario file (`GPUSHARE_FAKE_NVML_STATE`, its `cuda` section).
//!
//! Process states live in `cuda-state.json` beside the scenario, so a checkpoint made through
//! this library is seen by every process that loads the mock NVML: the checkpointed process
//! disappears from the process lists and its memory from the GPU's used memory until it is
//! restored. See README.md.

pub mod abi;
mod driver;
mod ffi;
pub mod install;

pub use gpushare_fake_driver::CUDA_FUNCTIONS as EXPORTED_FUNCTIONS;
pub use install::{LIB_NAME, LINK_NAME, install_into};
