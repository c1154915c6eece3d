//! Device handles: pointers into a static table, validated on every call.

use crate::scenario::MAX_DEVICES;

/// What an `nvmlDevice_t` points at. Opaque to callers.
#[repr(C)]
pub struct DeviceSlot {
    index: u32,
}

static SLOTS: [DeviceSlot; MAX_DEVICES] = make_slots();

const fn make_slots() -> [DeviceSlot; MAX_DEVICES] {
    let mut slots = [const { DeviceSlot { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        slots[i].index = i as u32;
        i += 1;
    }
    slots
}

/// The handle of device `index` (`index < MAX_DEVICES`, guaranteed by scenario validation).
pub fn handle_for(index: usize) -> *const DeviceSlot {
    SLOTS
        .get(index)
        .map_or(std::ptr::null(), |s| s as *const DeviceSlot)
}

/// The index a handle stands for, or None when it does not point at a slot.
/// Only the address is inspected until it is known to lie inside the table.
pub fn index_of(handle: *const DeviceSlot) -> Option<usize> {
    let base = SLOTS.as_ptr() as usize;
    let offset = (handle as usize).checked_sub(base)?;
    let size = std::mem::size_of::<DeviceSlot>();
    if offset % size != 0 {
        return None;
    }
    let slot = SLOTS.get(offset / size)?;
    Some(slot.index as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_foreign_pointers_are_rejected() {
        for i in [0, 1, MAX_DEVICES - 1] {
            assert_eq!(index_of(handle_for(i)), Some(i));
        }
        assert!(handle_for(MAX_DEVICES).is_null());
        assert_eq!(index_of(std::ptr::null()), None);
        let local = DeviceSlot { index: 0 };
        assert_eq!(index_of(&local), None);
        let misaligned = (handle_for(1) as usize + 1) as *const DeviceSlot;
        assert_eq!(index_of(misaligned), None);
        let past_end = (handle_for(MAX_DEVICES - 1) as usize + 4) as *const DeviceSlot;
        assert_eq!(index_of(past_end), None);
    }
}
