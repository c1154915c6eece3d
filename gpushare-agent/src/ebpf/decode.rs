//! Pure decoding of ring-buffer records into [`KernelEvent`]s. No I/O.

use gpushare_common::{Event, EventKind};

/// An event from the eBPF programs, decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// What happened.
    pub kind: EventKind,
    /// The process (thread-group id).
    pub tgid: u32,
    /// cgroup v2 id of the task when the event fired.
    pub cgroup_id: u64,
    /// CLOCK_BOOTTIME ns when the event fired.
    pub ktime_boot_ns: u64,
    /// Kind-specific argument (see [`Event::arg`]).
    pub arg: u64,
    /// The task's comm.
    pub comm: String,
}

/// Why a record could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is not the size of an [`Event`].
    #[error("ring-buffer record of {0} bytes, expected {expected}", expected = size_of::<Event>())]
    BadSize(usize),
    /// The kind number is not one this build knows.
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<KernelEvent, DecodeError> {
    if bytes.len() != size_of::<Event>() {
        return Err(DecodeError::BadSize(bytes.len()));
    }
    // SAFETY: the length is checked; Event is plain old data and read unaligned.
    let raw: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let kind = EventKind::from_u32(raw.kind).ok_or(DecodeError::UnknownKind(raw.kind))?;
    Ok(KernelEvent {
        kind,
        tgid: raw.tgid,
        cgroup_id: raw.cgroup_id,
        ktime_boot_ns: raw.ktime_boot_ns,
        arg: raw.arg,
        comm: comm_to_string(&raw.comm),
    })
}

/// A NUL-padded kernel comm as a string (lossy for non-UTF-8 bytes).
pub fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32) -> Vec<u8> {
        let mut ev = Event::zeroed();
        ev.kind = kind;
        ev.tgid = 42;
        ev.cgroup_id = 7;
        ev.ktime_boot_ns = 99;
        ev.arg = 0xc030_462b;
        ev.comm[..6].copy_from_slice(b"python");
        let ptr = (&ev as *const Event).cast::<u8>();
        unsafe { std::slice::from_raw_parts(ptr, size_of::<Event>()) }.to_vec()
    }

    #[test]
    fn decodes_every_field() {
        let ev = decode(&record(EventKind::AllocIoctl as u32)).unwrap();
        assert_eq!(
            ev,
            KernelEvent {
                kind: EventKind::AllocIoctl,
                tgid: 42,
                cgroup_id: 7,
                ktime_boot_ns: 99,
                arg: 0xc030_462b,
                comm: "python".into()
            }
        );
    }

    #[test]
    fn rejects_unknown_kinds_and_bad_sizes() {
        assert_eq!(decode(&record(77)), Err(DecodeError::UnknownKind(77)));
        let short = &record(1)[..10];
        assert_eq!(decode(short), Err(DecodeError::BadSize(10)));
        assert_eq!(decode(&[]), Err(DecodeError::BadSize(0)));
    }

    #[test]
    fn comm_stops_at_the_first_nul_and_survives_bad_utf8() {
        assert_eq!(comm_to_string(b"abc\0def"), "abc");
        assert_eq!(comm_to_string(b"0123456789abcdef"), "0123456789abcdef");
        assert_eq!(comm_to_string(&[0xff, b'a', 0]), "\u{fffd}a");
    }
}
