//! One memory budget for everything a method allocates: planned buffers, tensors that are
//! not memory-planned, copies and working memory of kernels, state that kernels and
//! delegates prepare at load.
//!
//! Every allocation whose size comes from a file or an input is charged to the budget
//! before it is made, and is made fallibly, so that a hostile size is an error naming what
//! asked for how much, never an abort.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pte_format::AlignedBuf;

/// Why memory could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The allocation would take the method past its memory budget.
    #[error(
        "needs {requested} more bytes, but the method's memory budget has {} of {limit} bytes left \
         (raise it with LoadOptions::memory_limit or --memory-limit)",
        limit.saturating_sub(*used)
    )]
    OverBudget {
        requested: u64,
        used: u64,
        limit: u64,
    },
    /// The system refused an allocation that the budget allowed.
    #[error("the system refused to allocate {requested} bytes")]
    AllocFailed { requested: u64 },
}

struct State {
    limit: u64,
    used: AtomicU64,
}

/// A memory budget, shared by the allocations charged to it (cloning shares it).
#[derive(Clone)]
pub struct MemoryBudget {
    state: Arc<State>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryBudget({} of {} bytes used)",
            self.used(),
            self.limit()
        )
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        MemoryBudget {
            state: Arc::new(State {
                limit,
                used: AtomicU64::new(0),
            }),
        }
    }

    /// The most bytes that may be charged at once.
    pub fn limit(&self) -> u64 {
        self.state.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.state.used.load(Ordering::Relaxed)
    }

    /// Charges `bytes`, or says why not. The charge is given back when dropped.
    pub fn charge(&self, bytes: u64) -> Result<Charge, MemoryError> {
        let mut charge = Charge {
            budget: self.clone(),
            bytes: 0,
        };
        charge.grow(bytes)?;
        Ok(charge)
    }

    fn take(&self, bytes: u64) -> Result<(), MemoryError> {
        let limit = self.state.limit;
        self.state
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .map(|_| ())
            .map_err(|used| MemoryError::OverBudget {
                requested: bytes,
                used,
                limit,
            })
    }

    fn give(&self, bytes: u64) {
        // Never more than was taken: `Charge` gives back exactly its own bytes.
        let _ = self
            .state
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// A zeroed buffer of `len` bytes charged to this budget.
    pub fn buffer(&self, len: usize) -> Result<Buffer, MemoryError> {
        let mut b = Buffer::new(self);
        b.resize(len)?;
        Ok(b)
    }

    /// A zeroed buffer of `len` bytes charged to this budget, whose pages are resident
    /// only once touched (see [`AlignedBuf::try_sparse`]): for a memory plan, part of
    /// which holds values that fused kernels never write.
    pub fn sparse_buffer(&self, len: usize) -> Result<Buffer, MemoryError> {
        let mut b = Buffer::new(self);
        b.reset_sparse(len)?;
        Ok(b)
    }
}

/// Bytes charged to a budget, given back when dropped.
pub struct Charge {
    budget: MemoryBudget,
    bytes: u64,
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Grows the charge to `bytes` (no change if it holds that much already).
    pub fn grow(&mut self, bytes: u64) -> Result<(), MemoryError> {
        if bytes > self.bytes {
            self.budget.take(bytes - self.bytes)?;
            self.bytes = bytes;
        }
        Ok(())
    }

    /// Gives back everything but `bytes`.
    pub fn shrink(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.give(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

/// A cache-line (64-byte) aligned byte buffer whose allocation is charged to a budget:
/// grows fallibly, never past the budget, and gives its memory back when released or
/// dropped.
#[derive(Debug)]
pub struct Buffer {
    buf: AlignedBuf,
    charge: Charge,
}

impl Buffer {
    /// An empty buffer charged to `budget` once it grows.
    pub fn new(budget: &MemoryBudget) -> Self {
        Buffer {
            buf: AlignedBuf::default(),
            charge: Charge {
                budget: budget.clone(),
                bytes: 0,
            },
        }
    }

    /// Sets the length to `len` bytes, keeping the contents that fit. Growing past the
    /// allocation charges the budget first, then allocates (new bytes are zero);
    /// shrinking keeps the allocation.
    pub fn resize(&mut self, len: usize) -> Result<(), MemoryError> {
        if len > self.buf.capacity() {
            let capacity = len.div_ceil(16).saturating_mul(16);
            self.charge.grow(capacity as u64)?;
            if let Err(e) = self.buf.try_resize(len) {
                self.charge.shrink(self.buf.capacity() as u64);
                return Err(MemoryError::AllocFailed {
                    requested: e.bytes as u64,
                });
            }
        } else {
            // Within the allocation: cannot fail.
            let _ = self.buf.try_resize(len);
        }
        Ok(())
    }

    /// Replaces the buffer with `len` zeroed bytes whose pages are resident only once
    /// touched (see [`AlignedBuf::try_sparse`]), charged to the budget first.
    pub fn reset_sparse(&mut self, len: usize) -> Result<(), MemoryError> {
        self.release();
        self.charge.grow(len as u64)?;
        match AlignedBuf::try_sparse(len) {
            Ok(buf) => {
                self.buf = buf;
                Ok(())
            }
            Err(e) => {
                self.charge.shrink(0);
                Err(MemoryError::AllocFailed {
                    requested: e.bytes as u64,
                })
            }
        }
    }

    /// Gives the allocation back to the system and the budget; the buffer becomes empty.
    pub fn release(&mut self) {
        self.buf.release();
        self.charge.shrink(0);
    }

    /// The first `len` elements of `T`, growing the buffer when it is shorter. Contents
    /// are whatever was left there (zero when new).
    pub fn slice_mut<T: bytemuck::Pod>(&mut self, len: usize) -> Result<&mut [T], MemoryError> {
        let nbytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(MemoryError::AllocFailed {
                requested: u64::MAX,
            })?;
        if self.buf.len() < nbytes {
            self.resize(nbytes)?;
        }
        let bytes = self
            .buf
            .as_mut_bytes()
            .get_mut(..nbytes)
            .unwrap_or_default();
        // The buffer is 64-byte aligned and `T` (a tensor element type) needs at most
        // 16; a misfit would only yield an empty slice, never undefined behaviour.
        Ok(bytemuck::try_cast_slice_mut(bytes).unwrap_or_default())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    /// The bytes, mutably.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.buf.as_mut_bytes()
    }
}

/// The memory budget a method gets unless [`crate::LoadOptions::memory_limit`] says
/// otherwise: half of the memory this process may use (physical memory, or the cgroup's
/// limit when lower), or 4 GiB where neither can be read.
///
/// Read from `/proc/meminfo` and the cgroup files directly: the one number needed does
/// not justify a system-information crate and its dependencies.
pub fn default_memory_limit() -> u64 {
    let physical = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024));
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .find_map(|v| v.trim().parse::<u64>().ok());
    match (physical, cgroup) {
        (Some(p), Some(c)) => p.min(c) / 2,
        (Some(m), None) | (None, Some(m)) => m / 2,
        (None, None) => 4 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_counted_and_given_back() {
        let budget = MemoryBudget::new(1000);
        let mut a = budget.buffer(100).unwrap();
        assert_eq!(budget.used(), 112);
        let err = budget.buffer(900).unwrap_err();
        assert!(
            matches!(
                err,
                MemoryError::OverBudget {
                    requested: 912,
                    used: 112,
                    limit: 1000
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("888 of 1000"), "{err}");
        a.resize(50).unwrap();
        assert_eq!(budget.used(), 112, "shrinking keeps the allocation");
        a.release();
        assert_eq!(budget.used(), 0);
        let b = budget.buffer(992).unwrap();
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_failed_growth_leaves_the_buffer_as_it_was() {
        let budget = MemoryBudget::new(64);
        let mut a = budget.buffer(10).unwrap();
        a.as_mut_bytes().fill(7);
        assert!(a.resize(100).is_err());
        assert_eq!(a.as_bytes(), &[7; 10]);
        assert_eq!(budget.used(), 16);
        assert!(a.slice_mut::<f32>(usize::MAX).is_err());
    }

    #[test]
    fn the_default_limit_is_positive() {
        assert!(default_memory_limit() > 0);
    }
}
