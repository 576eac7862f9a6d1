//! A byte buffer aligned for any element type, allocated fallibly.

/// An allocation that could not be made: the system refused `bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate {bytes} bytes")]
pub struct AllocError {
    /// The size asked for.
    pub bytes: usize,
}

/// A byte buffer whose start is aligned to a cache line (64 bytes), so that it can be
/// viewed as any element type (upstream requires program and tensor data to be aligned
/// to `max_align_t`) and 512-bit vectors at 64-byte offsets never straddle two lines
/// (the allocator's 16-byte alignment split every such load and store in two).
///
/// Every constructor that takes a size is fallible: a size that comes from a file or an
/// input must never abort the process. A large buffer is a fresh mapping, zeroed by the
/// system as its pages are first touched (see `pte_alloc`).
#[derive(Clone, Default)]
pub struct AlignedBuf {
    bytes: pte_alloc::Zeroed<u8>,
    len: usize,
}

fn zeroed(bytes: usize) -> Result<pte_alloc::Zeroed<u8>, AllocError> {
    pte_alloc::Zeroed::try_new(bytes).ok_or(AllocError { bytes })
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn try_zeroed(len: usize) -> Result<Self, AllocError> {
        Ok(AlignedBuf {
            bytes: zeroed(len)?,
            len,
        })
    }

    /// A zeroed buffer of `len` bytes whose pages the system backs only as they are
    /// first touched, in ordinary pages (see `pte_alloc::Zeroed::try_sparse`): for
    /// memory of which only a part may ever be used.
    pub fn try_sparse(len: usize) -> Result<Self, AllocError> {
        Ok(AlignedBuf {
            bytes: pte_alloc::Zeroed::try_sparse(len).ok_or(AllocError { bytes: len })?,
            len,
        })
    }

    /// A copy of `bytes`.
    pub fn try_from_bytes(bytes: &[u8]) -> Result<Self, AllocError> {
        let mut b = Self::try_zeroed(bytes.len())?;
        b.as_mut_bytes().copy_from_slice(bytes);
        Ok(b)
    }

    /// Sets the length to `len` bytes, keeping the contents that fit. Growing past the
    /// allocation reallocates (new bytes are zero); shrinking keeps the allocation.
    pub fn try_resize(&mut self, len: usize) -> Result<(), AllocError> {
        if len > self.bytes.len() {
            let mut grown = zeroed(len)?;
            if let Some(head) = grown.get_mut(..self.bytes.len()) {
                head.copy_from_slice(&self.bytes);
            }
            self.bytes = grown;
        }
        self.len = len;
        Ok(())
    }

    /// Gives the allocation back; the buffer becomes empty.
    pub fn release(&mut self) {
        *self = AlignedBuf::default();
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated (at least `len`).
    pub fn capacity(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }

    /// The bytes, mutably.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        // `len` never exceeds the allocation; `try_resize` keeps it so.
        let end = self.len.min(self.bytes.len());
        self.bytes.get_mut(..end).unwrap_or_default()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_keeps_contents_and_alignment() {
        let mut b = AlignedBuf::try_from_bytes(&[1, 2, 3]).unwrap();
        b.try_resize(40).unwrap();
        assert_eq!(&b[..4], &[1, 2, 3, 0]);
        assert_eq!(b.as_bytes().as_ptr() as usize % 64, 0);
        // Large enough for the allocator to map pages (whose blocks start 16 bytes in).
        b.try_resize(4 << 20).unwrap();
        assert_eq!(&b[..4], &[1, 2, 3, 0]);
        assert_eq!(b.as_bytes().as_ptr() as usize % 64, 0);
        b.try_resize(2).unwrap();
        assert_eq!(b.as_bytes(), &[1, 2]);
        assert!(b.capacity() >= 4 << 20);
        b.release();
        assert_eq!(b.capacity(), 0);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        assert_eq!(
            AlignedBuf::try_zeroed(usize::MAX).unwrap_err(),
            AllocError { bytes: usize::MAX }
        );
        assert!(AlignedBuf::try_zeroed(1 << 60).is_err());
    }
}
