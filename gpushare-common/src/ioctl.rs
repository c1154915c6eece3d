//! The shape of nvidia ioctl requests (open-gpu-kernel-modules, `nv-ioctl-numbers.h`).
//!
//! The driver dispatches on `_IOC_NR(cmd)` for requests of type `'F'`. `NV_ESC_IOCTL_XFER_CMD` wraps a
//! request whose real number and argument live in an [`IoctlXfer`] the ioctl argument points at.

/// ioctl type ("magic") of the nvidia driver.
pub const NV_IOCTL_MAGIC: u32 = b'F' as u32;
/// RM object allocation: the moment GPU memory may grow.
pub const NV_ESC_RM_ALLOC: u32 = 0x2B;
/// RM free.
pub const NV_ESC_RM_FREE: u32 = 0x29;
/// RM control.
pub const NV_ESC_RM_CONTROL: u32 = 0x2A;
/// RM memory allocation (system memory).
pub const NV_ESC_RM_ALLOC_MEMORY: u32 = 0x27;
/// Wraps another escape: the argument is an [`IoctlXfer`].
pub const NV_ESC_IOCTL_XFER_CMD: u32 = 211;

/// `nv_ioctl_xfer_t`: `{ NvU32 cmd; NvU32 size; NvP64 ptr; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlXfer {
    /// The wrapped escape number (an `_IOC_NR`).
    pub cmd: u32,
    /// Size of the wrapped argument.
    pub size: u32,
    /// Pointer to the wrapped argument.
    pub ptr: u64,
}

/// `_IOC_TYPE(cmd)`.
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}

/// `_IOC_NR(cmd)`.
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// `_IOC(dir, type, nr, size)` as Linux builds it (x86_64 / arm64 layout).
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (ty << 8) | nr
}

/// `_IOWR('F', nr, size)`: how the nvidia userspace library encodes escapes.
pub const fn nv_iowr(nr: u32, size: u32) -> u32 {
    ioc(3, NV_IOCTL_MAGIC, nr, size)
}

/// Whether `cmd` is an nvidia request with escape number `nr` (not looking inside XFER).
pub const fn is_nv_escape(cmd: u32, nr: u32) -> bool {
    ioc_type(cmd) == NV_IOCTL_MAGIC && ioc_nr(cmd) == nr
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn rm_alloc_request_is_recognised_and_others_are_not() {
        // 0xc030462b: what libcuda issues for NV_ESC_RM_ALLOC with a 0x30-byte argument.
        let alloc = nv_iowr(NV_ESC_RM_ALLOC, 0x30);
        assert_eq!(alloc, 0xc030_462b);
        assert!(is_nv_escape(alloc, NV_ESC_RM_ALLOC));
        assert!(!is_nv_escape(
            nv_iowr(NV_ESC_RM_CONTROL, 0x20),
            NV_ESC_RM_ALLOC
        ));
        // TCGETS (0x5401) has type 'T', never 'F'.
        assert!(!is_nv_escape(0x5401, NV_ESC_RM_ALLOC));
        assert!(is_nv_escape(
            nv_iowr(NV_ESC_IOCTL_XFER_CMD, 16),
            NV_ESC_IOCTL_XFER_CMD
        ));
    }

    #[test]
    fn xfer_layout_matches_the_driver() {
        assert_eq!(core::mem::size_of::<IoctlXfer>(), 16);
        assert_eq!(core::mem::offset_of!(IoctlXfer, ptr), 8);
    }
}
