//! The op slab: a preallocated table of in-flight operations, keyed by index, with a free
//! list threaded through the vacant slots.
//!
//! `user_data` of every SQE the ring submits for a caller operation is
//! `generation << 32 | index`. The generation changes each time a slot is reused, so a
//! cancel aimed at an operation that has already completed cannot hit the next operation
//! in the same slot. Index `u32::MAX` is never a slot: it marks the ring's internal SQEs.
//!
//! Insert, lookup and remove are O(1) and allocate nothing unless more operations are in
//! flight than ever before (then the vector grows).

/// `user_data` low half reserved for the ring's internal operations.
pub(crate) const INTERNAL_INDEX: u32 = u32::MAX;

/// Packs a slot key into `user_data`.
pub(crate) fn user_data(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

/// Splits `user_data` into `(index, generation)`.
#[expect(clippy::cast_possible_truncation, reason = "user_data is two u32 halves by construction")]
pub(crate) fn split(user_data: u64) -> (u32, u32) {
    (user_data as u32, (user_data >> 32) as u32)
}

enum Entry<T> {
    /// Free; `next` is the next free slot (or `INTERNAL_INDEX` for none).
    Vacant { next: u32 },
    /// In flight.
    Busy(T),
}

struct Slot<T> {
    generation: u32,
    entry: Entry<T>,
}

/// A table of `T` indexed by `u32`, with generations.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: u32,
    busy: usize,
}

impl<T> Slab<T> {
    /// A slab with `capacity` slots preallocated.
    pub(crate) fn with_capacity(capacity: usize) -> Slab<T> {
        let mut slab = Slab { slots: Vec::with_capacity(capacity), free: INTERNAL_INDEX, busy: 0 };
        slab.grow_to(capacity);
        slab
    }

    fn grow_to(&mut self, capacity: usize) {
        assert!(capacity < INTERNAL_INDEX as usize, "op slab limit: fewer than 2^32-1 operations in flight");
        // Push in reverse so the free list hands out low indices first.
        let start = self.slots.len();
        self.slots.reserve(capacity.saturating_sub(start));
        self.slots
            .resize_with(capacity.max(start), || Slot { generation: 0, entry: Entry::Vacant { next: INTERNAL_INDEX } });
        for index in (start..capacity).rev() {
            let index = u32::try_from(index).expect("checked above");
            self.slots[index as usize].entry = Entry::Vacant { next: self.free };
            self.free = index;
        }
    }

    /// Number of busy slots.
    pub(crate) fn len(&self) -> usize {
        self.busy
    }

    /// Number of slots (busy and free).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Stores `value`, returning its `user_data` key.
    pub(crate) fn insert(&mut self, value: T) -> u64 {
        if self.free == INTERNAL_INDEX {
            let grown = (self.slots.len() * 2).max(16);
            self.grow_to(grown);
        }
        let index = self.free;
        let slot = &mut self.slots[index as usize];
        let Entry::Vacant { next } = slot.entry else {
            panic!("op slab free list points at busy slot {index}");
        };
        self.free = next;
        slot.generation = slot.generation.wrapping_add(1);
        slot.entry = Entry::Busy(value);
        self.busy += 1;
        user_data(index, slot.generation)
    }

    /// The value stored under `key`, if that slot is busy with that generation.
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        let (index, generation) = split(key);
        match self.slots.get_mut(index as usize) {
            Some(Slot { generation: g, entry: Entry::Busy(value) }) if *g == generation => Some(value),
            _ => None,
        }
    }

    /// Frees the slot under `key` and returns its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<T> {
        let (index, generation) = split(key);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.generation != generation || matches!(slot.entry, Entry::Vacant { .. }) {
            return None;
        }
        let entry = std::mem::replace(&mut slot.entry, Entry::Vacant { next: self.free });
        self.free = index;
        self.busy -= 1;
        match entry {
            Entry::Busy(value) => Some(value),
            Entry::Vacant { .. } => unreachable!("checked busy above"),
        }
    }

    /// Calls `f(key, value)` for every busy slot (control path: scans every slot).
    pub(crate) fn for_each_busy_mut(&mut self, mut f: impl FnMut(u64, &mut T)) {
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if let Entry::Busy(value) = &mut slot.entry {
                let index = u32::try_from(index).expect("slab index fits u32");
                f(user_data(index, slot.generation), value);
            }
        }
    }

    /// Removes every value without returning it to the free list (used when the ring must
    /// leak buffers the kernel may still touch).
    pub(crate) fn take_all(&mut self) -> Vec<T> {
        let mut values = Vec::with_capacity(self.busy);
        for slot in &mut self.slots {
            if let Entry::Busy(_) = slot.entry {
                let entry = std::mem::replace(&mut slot.entry, Entry::Vacant { next: INTERNAL_INDEX });
                if let Entry::Busy(value) = entry {
                    values.push(value);
                }
            }
        }
        self.busy = 0;
        // The free list now misses these slots; the next insert grows past them.
        self.free = INTERNAL_INDEX;
        values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_round_trip() {
        let mut slab = Slab::with_capacity(2);
        let a = slab.insert("a");
        let b = slab.insert("b");
        assert_eq!(slab.len(), 2);
        assert_eq!(slab.get_mut(a).copied(), Some("a"));
        assert_eq!(slab.remove(b), Some("b"));
        assert_eq!(slab.remove(b), None, "double remove");
        assert_eq!(slab.len(), 1);
    }

    #[test]
    fn reused_slot_gets_a_new_generation() {
        let mut slab = Slab::with_capacity(1);
        let first = slab.insert(1);
        slab.remove(first);
        let second = slab.insert(2);
        assert_eq!(split(first).0, split(second).0, "same slot");
        assert_ne!(first, second);
        assert!(slab.get_mut(first).is_none(), "stale key misses");
        assert_eq!(slab.get_mut(second).copied(), Some(2));
    }

    #[test]
    fn grows_only_past_the_high_water_mark() {
        let mut slab = Slab::with_capacity(4);
        let keys: Vec<_> = (0..4).map(|i| slab.insert(i)).collect();
        assert_eq!(slab.capacity(), 4);
        for key in &keys {
            slab.remove(*key);
        }
        let _again: Vec<_> = (0..4).map(|i| slab.insert(i)).collect();
        assert_eq!(slab.capacity(), 4, "no growth when reusing");
        slab.insert(5);
        assert_eq!(slab.capacity(), 16);
    }

    #[test]
    fn for_each_busy_visits_busy_slots_and_take_all_empties() {
        let mut slab = Slab::with_capacity(4);
        slab.insert(10);
        let k = slab.insert(20);
        let mut seen = Vec::new();
        slab.for_each_busy_mut(|key, value| {
            *value += 1;
            seen.push(key);
        });
        assert_eq!(seen.len(), 2);
        assert_eq!(slab.get_mut(k).copied(), Some(21));
        assert_eq!(slab.take_all().len(), 2);
        assert_eq!(slab.len(), 0);
    }
}
