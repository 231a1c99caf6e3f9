//! The expert tier's policy, kept apart from any device so CI tests it: routing heat per expert
//! (`heat`), which experts hold the card's expert slots and what to swap between steps
//! (`residency`), and the ring of card buffers that host experts stream through during a prompt
//! pass (`ring`; the CUDA engine streams one layer's host experts per buffer). They allocate
//! nothing and copy nothing themselves. How uneven routing is (`skew`) says whether residency can
//! pay. The CPU engine counts routes into a [`heat::Heat`] when asked (`Forward::count_routes`).
//! `live` drives residency while serving: the CUDA engine reports each small step's routing to it
//! and starts the copies it plans between steps; how many slots each layer has stays the plan's.
//! `split` shares each small step's host experts between the CPU and the card's copy engine.

pub mod heat;
pub mod live;
pub mod residency;
pub mod ring;
pub mod skew;
pub mod split;

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
