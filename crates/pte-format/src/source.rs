//! Bytes of a file, read into memory or memory-mapped, that views borrow from.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::aligned::AlignedBuf;
use crate::error::{FormatError, Result};

/// The whole contents of a file, 16-byte aligned.
///
/// [`FileBytes::read`] is the safe default: the bytes are a private copy that nothing can
/// change. [`FileBytes::map`] avoids the copy and is `unsafe`, because the operating
/// system lets other processes change a mapped file under the mapping.
pub enum FileBytes {
    /// A read-only mapping of the file.
    Mapped(memmap2::Mmap),
    /// Bytes read into memory.
    Owned(AlignedBuf),
}

impl FileBytes {
    /// Reads a whole file into aligned memory.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| FormatError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let len = usize::try_from(len).map_err(|_| FormatError::Overflow {
            field: format!("size of {}", path.display()),
        })?;
        let mut buf = AlignedBuf::try_zeroed(len)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, e)))?;
        file.read_exact(buf.as_mut_bytes()).map_err(io)?;
        // A file that grew since its size was read is read up to that size, as a
        // snapshot; a file that shrank fails `read_exact` above.
        Ok(FileBytes::Owned(buf))
    }

    /// Maps a file read-only, without copying it. Empty files are read instead (they
    /// cannot be mapped).
    ///
    /// # Safety
    /// The file must not be truncated or modified, by this process or another, while the
    /// returned value (or anything borrowing from it) is alive. Truncation makes reads of
    /// the lost pages fault (SIGBUS); modification changes bytes that were verified,
    /// which breaks the assumptions of readers that rely on that verification. Use
    /// [`FileBytes::read`] for files that others may write.
    pub unsafe fn map(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| FormatError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            return Ok(FileBytes::Owned(AlignedBuf::default()));
        }
        // SAFETY: the caller guarantees that the file stays unchanged while mapped; the
        // mapping is read-only and private to this process. Pages are page-aligned.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(FileBytes::Mapped(map))
    }

    /// Gives the whole pages inside `range` back to the system when the file is
    /// mapped, so that they no longer count as this process's resident memory. The
    /// bytes do not change: a later read faults them in again from the file (or the
    /// page cache). Bytes read into memory stay where they are (dropping those pages
    /// would lose them). For bytes that were copied elsewhere (packed weights) and are
    /// rarely or never read again.
    #[cfg(unix)]
    pub fn release_pages(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let FileBytes::Mapped(map) = self else {
            return;
        };
        let base = map.as_ptr() as usize;
        let (Some(start), Some(end)) = (
            base.checked_add(range.start)
                .and_then(|a| a.checked_next_multiple_of(PAGE)),
            base.checked_add(range.end.min(map.len())),
        ) else {
            return;
        };
        let end = end / PAGE * PAGE;
        if end > start {
            // SAFETY: the mapping is private and read-only, so it holds no page of its
            // own that dropping could lose: `MADV_DONTNEED` only unmaps file pages,
            // which the next read maps again with the same bytes (the file must not
            // change while mapped: the contract of `FileBytes::map`). The range lies
            // inside the mapping. A refusal (another page size) leaves the pages
            // resident, which changes nothing but memory.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start - base,
                    end - start,
                )
            };
        }
    }

    /// See the Unix version: elsewhere the pages stay resident.
    #[cfg(not(unix))]
    pub fn release_pages(&self, _range: std::ops::Range<usize>) {}
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}
