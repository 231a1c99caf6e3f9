//! The ring of card buffers that streams host experts through the card during a prompt pass.
//! Each buffer goes round: filled from the experts' weights, copied to the card, read by the
//! products, then free again. Buffers are taken in order, so with two the copy of the next unit
//! overlaps the products of the current one; a buffer is never refilled while its copy or
//! products may still read it. A unit (`K`) is whatever one buffer holds: one expert, or the host
//! experts of one layer as the CUDA engine streams them.

use std::fmt::Debug;

use super::ExpertId;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stage<K = ExpertId> {
    Free,
    Filling(K),
    Copying(K),
    /// On the card, waiting for its product.
    Ready(K),
    /// Its product is running.
    InUse(K),
}

#[derive(Debug, PartialEq)]
pub struct RingError(pub String);

pub struct Ring<K = ExpertId> {
    stages: Vec<Stage<K>>,
    next: usize,
}

impl<K: Copy + Debug + PartialEq> Ring<K> {
    pub fn new(n_buffers: usize) -> Ring<K> {
        Ring {
            stages: vec![Stage::Free; n_buffers.max(1)],
            next: 0,
        }
    }

    pub fn stage(&self, buf: usize) -> Option<Stage<K>> {
        self.stages.get(buf).copied()
    }

    /// The next buffer in turn for `id`, if it is free; `None` means wait for its product.
    pub fn acquire(&mut self, id: K) -> Option<usize> {
        let b = self.next;
        if self.stages[b] != Stage::Free {
            return None;
        }
        self.stages[b] = Stage::Filling(id);
        self.next = (b + 1) % self.stages.len();
        Some(b)
    }

    /// Moves `buf` from the stage `from` makes to the one `to` makes; `expected` names `from`
    /// for the error.
    fn advance(
        &mut self,
        buf: usize,
        (from, expected): (fn(K) -> Stage<K>, &str),
        to: fn(K) -> Stage<K>,
    ) -> Result<K, RingError> {
        let stage = self
            .stages
            .get(buf)
            .copied()
            .ok_or_else(|| RingError(format!("no buffer {buf}")))?;
        let id = match stage {
            Stage::Filling(id) | Stage::Copying(id) | Stage::Ready(id) | Stage::InUse(id)
                if stage == from(id) =>
            {
                id
            }
            other => {
                return Err(RingError(format!(
                    "buffer {buf} is {other:?}, not {expected}"
                )))
            }
        };
        self.stages[buf] = to(id);
        Ok(id)
    }

    /// The host finished writing `buf`; its copy to the card starts.
    pub fn filled(&mut self, buf: usize) -> Result<(), RingError> {
        self.advance(buf, (Stage::Filling, "filling"), Stage::Copying)
            .map(|_| ())
    }

    /// The copy of `buf` landed.
    pub fn copied(&mut self, buf: usize) -> Result<(), RingError> {
        self.advance(buf, (Stage::Copying, "copying"), Stage::Ready)
            .map(|_| ())
    }

    /// The product that reads `buf` starts; returns the expert it holds.
    pub fn start(&mut self, buf: usize) -> Result<K, RingError> {
        self.advance(buf, (Stage::Ready, "ready"), Stage::InUse)
    }

    /// The product that read `buf` finished: the buffer may be refilled.
    pub fn release(&mut self, buf: usize) -> Result<(), RingError> {
        self.advance(buf, (Stage::InUse, "in use"), |_| Stage::Free)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_buffers_overlap_the_next_copy_with_the_current_product() {
        let mut r: Ring = Ring::new(2);
        let (a, b, c) = (
            ExpertId::new(0, 0),
            ExpertId::new(0, 1),
            ExpertId::new(0, 2),
        );
        let ba = r.acquire(a).unwrap();
        r.filled(ba).unwrap();
        r.copied(ba).unwrap();
        assert_eq!(r.start(ba), Ok(a));
        // while a's product runs, b streams into the other buffer
        let bb = r.acquire(b).unwrap();
        assert_ne!(ba, bb);
        r.filled(bb).unwrap();
        // c must wait: its buffer in turn is a's, still read by a's product
        assert_eq!(r.acquire(c), None);
        r.release(ba).unwrap();
        assert_eq!(r.acquire(c), Some(ba));
        r.copied(bb).unwrap();
        assert_eq!(r.start(bb), Ok(b));
    }

    #[test]
    fn stages_cannot_be_skipped_or_repeated() {
        let mut r: Ring = Ring::new(1);
        let b = r.acquire(ExpertId::new(1, 3)).unwrap();
        assert_eq!(
            r.copied(b),
            Err(RingError(
                "buffer 0 is Filling(ExpertId { layer: 1, expert: 3 }), not copying".into()
            )),
            "not filled yet"
        );
        assert!(r.start(b).is_err());
        r.filled(b).unwrap();
        assert!(r.filled(b).is_err(), "filled twice");
        r.copied(b).unwrap();
        assert!(r.release(b).is_err(), "never used");
        r.start(b).unwrap();
        r.release(b).unwrap();
        assert_eq!(r.stage(b), Some(Stage::Free));
        assert!(r.release(7).is_err(), "no such buffer");
    }

    #[test]
    fn a_whole_layer_streams_in_order_through_any_ring() {
        for n in 1..4 {
            let mut r: Ring = Ring::new(n);
            let experts: Vec<ExpertId> = (0..7).map(|e| ExpertId::new(2, e)).collect();
            let mut done = Vec::new();
            let mut pending = std::collections::VecDeque::new();
            let mut i = 0;
            while done.len() < experts.len() {
                // stream ahead as far as the ring allows, then run the oldest product
                while i < experts.len() {
                    match r.acquire(experts[i]) {
                        Some(b) => {
                            r.filled(b).unwrap();
                            r.copied(b).unwrap();
                            pending.push_back(b);
                            i += 1;
                        }
                        None => break,
                    }
                }
                let b = pending.pop_front().expect("something is in flight");
                done.push(r.start(b).unwrap());
                r.release(b).unwrap();
            }
            assert_eq!(done, experts, "ring of {n}");
        }
    }
}
