//! Zero-copy, verified view of a `.pte` program file.

use std::ops::Range;

use planus::ReadAsRoot;

use crate::error::{FormatError, Result};
use crate::header::{check_identifier, ProgramHeader};
use crate::schema::executorch_flatbuffer::{
    BackendDelegateDataReferenceRef, DataLocation, ProgramRef, SubsegmentOffsetsRef,
};
use crate::verify;

/// The `.pte` file identifier.
pub const PROGRAM_IDENTIFIER: &str = "ET12";

/// A verified `.pte` program borrowing the file's bytes.
///
/// Opening checks everything that can be checked without running the program: the
/// identifier and extended header, every flatbuffer offset, length, enum and union tag,
/// every segment range against the file, every sub-segment offset against its segment,
/// and every index that names a segment or an inline delegate blob.
#[derive(Clone, Copy)]
pub struct Pte<'a> {
    file: &'a [u8],
    header: Option<ProgramHeader>,
    program: ProgramRef<'a>,
}

impl std::fmt::Debug for Pte<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pte")
            .field("len", &self.file.len())
            .field("header", &self.header)
            .finish()
    }
}

impl<'a> Pte<'a> {
    /// Parses and verifies a program.
    pub fn parse(file: &'a [u8]) -> Result<Self> {
        let pte = Self::open(file)?;
        verify::program(pte.program, pte.flatbuffer_len())?;
        pte.check_indices()?;
        Ok(pte)
    }

    /// Views a program that [`Pte::parse`] verified before, in constant time: `verified`
    /// (from [`Pte::verified`]) must name these very bytes, else they are parsed and
    /// verified again. Readers stay bounds-checked either way; skipping the walk only
    /// relies on the bytes not having changed since, which holds for any immutable buffer
    /// (a memory map must keep the promise of [`crate::FileBytes::map`]).
    pub fn reopen(file: &'a [u8], verified: Verified) -> Result<Self> {
        if verified.names(file) {
            Self::open(file)
        } else {
            Self::parse(file)
        }
    }

    /// The token with which [`Pte::reopen`] views these bytes again without verifying them.
    pub fn verified(&self) -> Verified {
        Verified::of(self.file)
    }

    /// Checks the identifier and header and finds the root table, without the walk.
    fn open(file: &'a [u8]) -> Result<Self> {
        check_identifier(file, PROGRAM_IDENTIFIER, "a .pte program")?;
        let len = file.len() as u64;
        let header = ProgramHeader::parse(file)?;
        let program_size = match &header {
            Some(h) => {
                if h.program_size > len {
                    return Err(FormatError::out_of_bounds(
                        "eh00.program_size",
                        h.program_size,
                        len,
                    ));
                }
                if h.segment_base_offset != 0 && h.segment_base_offset < h.program_size {
                    return Err(FormatError::invalid(
                        "eh00.segment_base_offset",
                        format!(
                            "{} lies inside the program data (program_size {})",
                            h.segment_base_offset, h.program_size
                        ),
                    ));
                }
                if let Some(data) = h.segment_data_size {
                    let end = h
                        .segment_base_offset
                        .checked_add(data)
                        .ok_or_else(|| FormatError::overflow("eh00.segment_data_size"))?;
                    if end > len {
                        return Err(FormatError::out_of_bounds(
                            "eh00.segment_base_offset + segment_data_size",
                            end,
                            len,
                        ));
                    }
                }
                h.program_size as usize
            }
            None => file.len(),
        };
        let fb = file.get(..program_size).unwrap_or(file);
        let program = ProgramRef::read_as_root(fb)?;
        Ok(Pte {
            file,
            header,
            program,
        })
    }

    fn flatbuffer_len(&self) -> usize {
        self.header
            .map_or(self.file.len(), |h| h.program_size as usize)
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.file
    }

    /// The extended header, if the file has one.
    pub fn header(&self) -> Option<&ProgramHeader> {
        self.header.as_ref()
    }

    /// The verified program table.
    pub fn program(&self) -> ProgramRef<'a> {
        self.program
    }

    /// Absolute offset of segment data; 0 without a header.
    pub fn segment_base_offset(&self) -> u64 {
        self.header.map_or(0, |h| h.segment_base_offset)
    }

    /// Number of entries in `Program.segments`.
    pub fn num_segments(&self) -> usize {
        self.program
            .segments()
            .ok()
            .flatten()
            .map_or(0, |s| s.len())
    }

    /// Absolute byte range of segment `index` in the file.
    pub fn segment_range(&self, index: usize) -> Result<Range<usize>> {
        let field = || format!("segments[{index}]");
        let segments = self
            .program
            .segments()?
            .ok_or_else(|| FormatError::missing("Program.segments"))?;
        let seg = segments.get(index).ok_or_else(|| {
            FormatError::out_of_bounds("segment index", index as u64, segments.len() as u64)
        })??;
        let (offset, size) = (seg.offset()?, seg.size()?);
        if size == 0 {
            return Ok(0..0);
        }
        let base = match self.header {
            Some(h) if h.segment_base_offset != 0 => h.segment_base_offset,
            _ => {
                return Err(FormatError::invalid(
                    field(),
                    "the program has segment data but no eh00 header giving its base offset",
                ))
            }
        };
        let start = base
            .checked_add(offset)
            .ok_or_else(|| FormatError::overflow(field()))?;
        let end = start
            .checked_add(size)
            .ok_or_else(|| FormatError::overflow(field()))?;
        let limit = match self.header.and_then(|h| h.segment_data_size) {
            Some(data) => base.saturating_add(data).min(self.file.len() as u64),
            None => self.file.len() as u64,
        };
        if end > limit {
            return Err(FormatError::out_of_bounds(
                format!("{} end (offset {offset} + size {size})", field()),
                end,
                limit,
            ));
        }
        Ok(start as usize..end as usize)
    }

    /// The bytes of segment `index`.
    pub fn segment(&self, index: usize) -> Result<&'a [u8]> {
        let range = self.segment_range(index)?;
        let limit = self.file.len() as u64;
        self.file.get(range.clone()).ok_or_else(|| {
            FormatError::out_of_bounds(format!("segments[{index}] end"), range.end as u64, limit)
        })
    }

    /// The constant segment, when the program stores its constants in one.
    pub fn constant_segment(&self) -> Result<Option<SubSegments<'a>>> {
        match self.program.constant_segment()? {
            Some(c) => Ok(Some(self.sub_segments(c, "constant_segment")?)),
            None => Ok(None),
        }
    }

    /// Sub-segments of `mutable_data_segments[index]` (the runtime only ever uses entry 0).
    pub fn mutable_data(&self, index: usize) -> Result<Option<SubSegments<'a>>> {
        let Some(list) = self.program.mutable_data_segments()? else {
            return Ok(None);
        };
        match list.get(index) {
            Some(s) => Ok(Some(
                self.sub_segments(s?, &format!("mutable_data_segments[{index}]"))?,
            )),
            None => Ok(None),
        }
    }

    fn sub_segments(&self, s: SubsegmentOffsetsRef<'a>, field: &str) -> Result<SubSegments<'a>> {
        let index = s.segment_index()? as usize;
        let data = self.segment(index)?;
        let offsets = s
            .offsets()?
            .ok_or_else(|| FormatError::missing(format!("{field}.offsets")))?;
        Ok(SubSegments {
            data,
            offsets,
            field: if field == "constant_segment" {
                "constant_segment"
            } else {
                "mutable_data_segments"
            },
        })
    }

    /// Bytes of a delegate's processed payload, inline or in a segment.
    pub fn delegate_data(
        &self,
        processed: BackendDelegateDataReferenceRef<'a>,
    ) -> Result<&'a [u8]> {
        let index = processed.index()? as usize;
        match processed.location()? {
            DataLocation::Segment => self.segment(index),
            DataLocation::Inline => {
                let inline = self
                    .program
                    .backend_delegate_data()?
                    .ok_or_else(|| FormatError::missing("Program.backend_delegate_data"))?;
                let blob = inline.get(index).ok_or_else(|| {
                    FormatError::out_of_bounds(
                        "inline delegate data index",
                        index as u64,
                        inline.len() as u64,
                    )
                })??;
                Ok(blob.data()?.unwrap_or(&[]))
            }
        }
    }

    /// Every entry of the program's own named data, key and bytes, in file order.
    pub fn named_data_entries(&self) -> Result<Vec<(&'a str, &'a [u8])>> {
        let Some(named) = self.program.named_data()? else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::with_capacity(named.len());
        for (i, entry) in named.iter().enumerate() {
            let entry = entry?;
            let key = entry
                .key()?
                .ok_or_else(|| FormatError::missing(format!("named_data[{i}].key")))?;
            entries.push((key, self.segment(entry.segment_index()? as usize)?));
        }
        Ok(entries)
    }

    /// Checks, once at open, every index and offset that names another part of the file.
    fn check_indices(&self) -> Result<()> {
        let p = self.program;
        for i in 0..self.num_segments() {
            self.segment_range(i)?;
        }
        if let Some(c) = self.constant_segment()? {
            c.check()?;
            if p.constant_buffer()?.is_some_and(|b| !b.is_empty()) && c.len() > 1 {
                return Err(FormatError::invalid(
                    "Program.constant_buffer",
                    "both constant_buffer and constant_segment hold constants",
                ));
            }
        }
        if let Some(list) = p.mutable_data_segments()? {
            for i in 0..list.len() {
                if let Some(m) = self.mutable_data(i)? {
                    m.check()?;
                }
            }
        }
        if let Some(named) = p.named_data()? {
            for (i, entry) in named.iter().enumerate() {
                let index = entry?.segment_index()? as usize;
                if index >= self.num_segments() {
                    return Err(FormatError::out_of_bounds(
                        format!("named_data[{i}].segment_index"),
                        index as u64,
                        self.num_segments() as u64,
                    ));
                }
            }
        }
        for (pi, plan) in p.execution_plan()?.into_iter().flatten().enumerate() {
            for (di, d) in plan?.delegates()?.into_iter().flatten().enumerate() {
                let processed = d?.processed()?.ok_or_else(|| {
                    FormatError::missing(format!("execution_plan[{pi}].delegates[{di}].processed"))
                })?;
                self.delegate_data(processed).map_err(|e| match e {
                    FormatError::OutOfBounds { value, limit, .. } => FormatError::out_of_bounds(
                        format!("execution_plan[{pi}].delegates[{di}].processed.index"),
                        value,
                        limit,
                    ),
                    e => e,
                })?;
            }
        }
        Ok(())
    }
}

/// Names a byte buffer that a parser verified (by address and length), so that
/// [`Pte::reopen`] and [`crate::Ptd::reopen`] can view it again without verifying it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    addr: usize,
    len: usize,
}

impl Verified {
    pub(crate) fn of(bytes: &[u8]) -> Self {
        Verified {
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    pub(crate) fn names(&self, bytes: &[u8]) -> bool {
        *self == Self::of(bytes)
    }
}

/// A segment split at a list of offsets: the constant segment or a mutable-data segment.
/// Entry 0 is the reserved placeholder.
#[derive(Clone, Copy)]
pub struct SubSegments<'a> {
    data: &'a [u8],
    offsets: planus::Vector<'a, u64>,
    field: &'static str,
}

impl<'a> SubSegments<'a> {
    /// Number of offsets, placeholder included.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// True when there are no offsets at all.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// The whole segment.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Start offset of entry `index` inside the segment.
    pub fn offset(&self, index: usize) -> Result<u64> {
        self.offsets.get(index).ok_or_else(|| {
            FormatError::out_of_bounds(
                format!("{} index", self.field),
                index as u64,
                self.offsets.len() as u64,
            )
        })
    }

    /// The `nbytes` bytes of entry `index`, bounds-checked against the segment.
    pub fn get(&self, index: usize, nbytes: usize) -> Result<&'a [u8]> {
        let start = self.offset(index)?;
        let end = start
            .checked_add(nbytes as u64)
            .ok_or_else(|| FormatError::overflow(format!("{}[{index}]", self.field)))?;
        if end > self.data.len() as u64 {
            return Err(FormatError::out_of_bounds(
                format!(
                    "{}[{index}] end (offset {start} + {nbytes} bytes)",
                    self.field
                ),
                end,
                self.data.len() as u64,
            ));
        }
        self.slice(start, end, index)
    }

    fn slice(&self, start: u64, end: u64, index: usize) -> Result<&'a [u8]> {
        let limit = self.data.len() as u64;
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.data.get(s..e))
            .ok_or_else(|| {
                FormatError::out_of_bounds(format!("{}[{index}] end", self.field), end, limit)
            })
    }

    /// The bytes from entry `index` to the next entry (or the segment end), padding
    /// included.
    pub fn entry(&self, index: usize) -> Result<&'a [u8]> {
        let start = self.offset(index)?;
        let end = match index.checked_add(1).and_then(|next| self.offsets.get(next)) {
            Some(next) => next,
            None => self.data.len() as u64,
        };
        if start > end || end > self.data.len() as u64 {
            return Err(FormatError::out_of_bounds(
                format!("{}.offsets[{index}]", self.field),
                start,
                end.min(self.data.len() as u64),
            ));
        }
        self.slice(start, end, index)
    }

    fn check(&self) -> Result<()> {
        for (i, off) in self.offsets.iter().enumerate() {
            if off > self.data.len() as u64 {
                return Err(FormatError::out_of_bounds(
                    format!("{}.offsets[{i}]", self.field),
                    off,
                    self.data.len() as u64,
                ));
            }
        }
        Ok(())
    }
}
