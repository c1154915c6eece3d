//! Fake nvidia device nodes: char devices with /dev/null's numbers (1:3), named `/dev/nvidia*` so
//! the eBPF open probe sees them. ioctls on them fail with ENOTTY after the tracepoint has fired.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

/// A fake nvidia device node, removed on drop.
pub struct FakeDeviceNode {
    path: PathBuf,
}

impl FakeDeviceNode {
    /// Creates `/dev/nvidia-gpushare-test-<name>`.
    pub fn create(name: &str) -> Result<Self> {
        Self::create_at(PathBuf::from(format!("/dev/nvidia-gpushare-test-{name}")))
    }

    /// Creates a node at `path`.
    pub fn create_at(path: PathBuf) -> Result<Self> {
        let _ = std::fs::remove_file(&path);
        let c = CString::new(path.as_os_str().as_encoded_bytes())?;
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        if rc != 0 {
            bail!(
                "mknod {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(Self { path })
    }

    /// The node's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FakeDeviceNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
