//! Working memory shared by the delegate calls of one method.
//!
//! A method runs its instructions one at a time, so its delegate calls never overlap:
//! what one call leaves in its working memory is dead when the next begins. One
//! [`Workspace`] per method, sized for the largest call, replaces an arena per call;
//! a program partitioned into many delegates (a transformer lowered to XNNPACK has
//! dozens) then holds and first touches the memory of one call instead of all.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::budget::{Buffer, MemoryBudget, MemoryError};

/// The two buffers of a delegate call's working memory.
#[derive(Debug)]
pub struct WorkBuffers {
    /// The values of the call's graph that live from one node to another.
    pub arena: Buffer,
    /// One node's temporaries (packed panels, column buffers).
    pub scratch: Buffer,
}

/// Working memory shared by the delegate calls of one method (cheap to clone: clones
/// share the buffers). Contents do not survive from one call to the next.
#[derive(Clone, Debug)]
pub struct Workspace(Arc<Mutex<WorkBuffers>>);

impl Workspace {
    /// Empty buffers, charged to `budget` as they grow.
    pub fn new(budget: &MemoryBudget) -> Self {
        Workspace(Arc::new(Mutex::new(WorkBuffers {
            arena: Buffer::new(budget),
            scratch: Buffer::new(budget),
        })))
    }

    /// Grows the buffers to at least `arena` and `scratch` bytes. Contents are
    /// discarded when a buffer grows (nothing is copied: the new memory is untouched
    /// until a call writes it). Their pages are resident only once touched: the
    /// scratch is sized for the hungriest node, and the arena gives room to values that
    /// fused nodes never write (XNNPACK mobilenet_v2: a 3.7 MiB scratch held 4 MiB in
    /// huge pages, 0.6 MiB in ordinary ones).
    pub fn reserve(&self, arena: usize, scratch: usize) -> Result<(), MemoryError> {
        let mut guard = self.lock();
        let w = &mut *guard;
        for (b, len) in [(&mut w.arena, arena), (&mut w.scratch, scratch)] {
            if len > b.len() {
                b.reset_sparse(len)?;
            }
        }
        Ok(())
    }

    /// The buffers, for one call. A call never holds them while another runs; a kernel
    /// that panicked while holding them left nothing that matters (contents are dead
    /// between calls), so a poisoned lock is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, WorkBuffers> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_buffers_that_only_grow() {
        let budget = MemoryBudget::new(1 << 20);
        let w = Workspace::new(&budget);
        let other = w.clone();
        w.reserve(1000, 10).unwrap();
        other.reserve(500, 4000).unwrap();
        let b = w.lock();
        assert_eq!((b.arena.len(), b.scratch.len()), (1000, 4000));
        drop(b);
        assert!(budget.used() >= 5000);
    }

    #[test]
    fn growth_past_the_budget_is_refused() {
        let budget = MemoryBudget::new(4096);
        let w = Workspace::new(&budget);
        assert!(w.reserve(1 << 20, 0).is_err());
        w.reserve(1024, 1024).unwrap();
    }
}
