//! Which expert each device slot holds, and which slots serve.
//!
//! A slot is a place for one expert in the tier's device pages (global ids: the primary
//! device's slots first, then a second device's). It is free, loading (promoted: its upload is under way and it does not serve yet), or serving.
//! An expert serves from the step after its upload completed (`settle`). Evicting a serving
//! slot frees it at once: the tier joins every batch within its step, so no batch reads a
//! slot when the host decides.
//!
//! Must not: touch the device (the tier does), or choose what to evict (the tier asks
//! `coldest` and applies `heat::beats`).

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Free,
    /// Promoted, its upload not yet complete: (layer, expert).
    Loading(u32, u32),
    /// Resident and serving: (layer, expert).
    Serving(u32, u32),
}

/// The slot table.
#[derive(Clone, Debug)]
pub struct Slots {
    experts: usize,
    state: Vec<SlotState>,
    /// Per (layer, expert): its slot, loading or serving.
    slot_of: Vec<Option<u32>>,
    /// Free slots; the lowest is taken first, so the primary device fills first.
    free: std::collections::BTreeSet<u32>,
}

impl Slots {
    /// `slots` free slots for `layers x experts` experts.
    pub fn new(slots: usize, layers: usize, experts: usize) -> Slots {
        Slots {
            experts,
            state: vec![SlotState::Free; slots],
            slot_of: vec![None; layers * experts],
            free: (0..slots as u32).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    pub fn state(&self, slot: usize) -> SlotState {
        self.state[slot]
    }

    /// The slot expert `e` of layer `l` serves from, if it serves.
    pub fn serving(&self, l: usize, e: usize) -> Option<usize> {
        let s = self.slot_of[l * self.experts + e]? as usize;
        matches!(self.state[s], SlotState::Serving(..)).then_some(s)
    }

    /// Whether expert `e` of layer `l` has a slot (loading or serving).
    pub fn holds(&self, l: usize, e: usize) -> bool {
        self.slot_of[l * self.experts + e].is_some()
    }

    /// Slots serving.
    pub fn resident(&self) -> usize {
        self.state.iter().filter(|s| matches!(s, SlotState::Serving(..))).count()
    }

    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Takes the lowest free slot for expert `e` of layer `l` (loading); `None` when every slot
    /// is used.
    pub fn take_free(&mut self, l: usize, e: usize) -> Option<usize> {
        debug_assert!(!self.holds(l, e));
        let s = self.free.pop_first()?;
        self.state[s as usize] = SlotState::Loading(l as u32, e as u32);
        self.slot_of[l * self.experts + e] = Some(s);
        Some(s as usize)
    }

    /// The serving slot of least `heat(layer, expert)`, with that heat.
    pub fn coldest(&self, heat: impl Fn(usize, usize) -> f32) -> Option<(usize, f32)> {
        self.coldest_in(0..self.state.len(), heat)
    }

    /// `coldest` among the slots of `range` (a level: the device's slots, or the host pool's).
    pub fn coldest_in(
        &self,
        range: std::ops::Range<usize>,
        heat: impl Fn(usize, usize) -> f32,
    ) -> Option<(usize, f32)> {
        let mut best: Option<(usize, f32)> = None;
        let start = range.start;
        for (s, st) in self.state.get(range).unwrap_or(&[]).iter().enumerate() {
            let s = s + start;
            if let SlotState::Serving(l, e) = *st {
                let h = heat(l as usize, e as usize);
                if best.is_none_or(|(_, b)| h < b) {
                    best = Some((s, h));
                }
            }
        }
        best
    }

    /// Gives `slot` (serving) to expert `e` of layer `l` (loading); returns who held it.
    pub fn replace(&mut self, slot: usize, l: usize, e: usize) -> Option<(usize, usize)> {
        let old = match self.state[slot] {
            SlotState::Serving(ol, oe) | SlotState::Loading(ol, oe) => {
                self.slot_of[ol as usize * self.experts + oe as usize] = None;
                Some((ol as usize, oe as usize))
            }
            SlotState::Free => {
                self.free.remove(&(slot as u32));
                None
            }
        };
        self.state[slot] = SlotState::Loading(l as u32, e as u32);
        self.slot_of[l * self.experts + e] = Some(slot as u32);
        old
    }

    /// The upload into `slot` completed: it serves from now on.
    pub fn settle(&mut self, slot: usize) {
        if let SlotState::Loading(l, e) = self.state[slot] {
            self.state[slot] = SlotState::Serving(l, e);
        }
    }

    /// The upload into `slot` failed: the slot is free again and its expert on the CPU.
    pub fn abandon(&mut self, slot: usize) {
        if let SlotState::Loading(l, e) | SlotState::Serving(l, e) = self.state[slot] {
            self.slot_of[l as usize * self.experts + e as usize] = None;
            self.state[slot] = SlotState::Free;
            self.free.insert(slot as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expert_serves_only_after_it_settles() {
        let mut s = Slots::new(2, 2, 4);
        let a = s.take_free(1, 3).unwrap();
        assert!(s.holds(1, 3));
        assert_eq!(s.serving(1, 3), None);
        s.settle(a);
        assert_eq!(s.serving(1, 3), Some(a));
        assert_eq!(s.resident(), 1);
    }

    #[test]
    fn replacing_the_coldest_moves_the_slot_to_the_newcomer() {
        let mut s = Slots::new(2, 1, 4);
        for e in [0, 1] {
            let x = s.take_free(0, e).unwrap();
            s.settle(x);
        }
        assert!(!s.has_free());
        assert_eq!(s.take_free(0, 2), None);
        let heat = |_: usize, e: usize| [5.0, 1.0, 9.0, 0.0][e];
        let (slot, h) = s.coldest(heat).unwrap();
        assert_eq!((s.state(slot), h), (SlotState::Serving(0, 1), 1.0));
        assert_eq!(s.replace(slot, 0, 2), Some((0, 1)));
        assert!(!s.holds(0, 1));
        assert_eq!(s.serving(0, 2), None);
        s.settle(slot);
        assert_eq!(s.serving(0, 2), Some(slot));
        s.abandon(slot);
        assert!(!s.holds(0, 2) && s.has_free());
    }

    #[test]
    fn the_lowest_free_slot_is_taken_first() {
        let mut s = Slots::new(4, 1, 8);
        assert_eq!((s.take_free(0, 0), s.take_free(0, 1), s.take_free(0, 2)), (Some(0), Some(1), Some(2)));
        s.abandon(1);
        // Slot 1 (the primary's, say) before slot 3 (the second device's).
        assert_eq!(s.take_free(0, 5), Some(1));
        assert_eq!(s.take_free(0, 6), Some(3));
        assert_eq!(s.take_free(0, 7), None);
    }
}
