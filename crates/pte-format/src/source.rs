//! Bytes of a file, memory-mapped or owned, that views borrow from.

use std::fs::File;
use std::path::Path;

use crate::error::{FormatError, Result};

/// The whole contents of a file: memory-mapped by default, or an owned buffer.
pub enum FileBytes {
    /// A read-only mapping of the file.
    Mapped(memmap2::Mmap),
    /// Bytes read into memory.
    Owned(Vec<u8>),
}

impl FileBytes {
    /// Maps a file read-only. Empty files are read instead (they cannot be mapped).
    pub fn map(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| FormatError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            return Ok(FileBytes::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and private to this process. As with every
        // memory-mapped reader, another process truncating or rewriting the file while it
        // is mapped is outside of what this crate can guard against.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(FileBytes::Mapped(map))
    }

    /// Reads a whole file into memory.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        std::fs::read(path)
            .map(FileBytes::Owned)
            .map_err(|source| FormatError::Io {
                path: path.to_owned(),
                source,
            })
    }
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
