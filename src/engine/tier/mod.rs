//! The expert tier's policy, kept apart from any device so CI tests it: routing heat per expert
//! (`heat`), which experts hold the card's expert slots and what to swap between steps
//! (`residency`), and the pinned staging ring that streams host experts through the card during a
//! prompt pass (`ring`). The engine drives these once it executes split plans (issue 10); they
//! allocate nothing and copy nothing themselves.

pub mod heat;
pub mod residency;
pub mod ring;

/// One expert of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertId {
    pub layer: u32,
    pub expert: u32,
}

impl ExpertId {
    pub fn new(layer: u32, expert: u32) -> ExpertId {
        ExpertId { layer, expert }
    }
}
