//! Writing `.pte` and `.ptd` files that upstream's runtime loads.
//!
//! A [`ProgramImage`] is an owned program plus the bytes of its segments. Writing lays the
//! segments out after the flatbuffer with the requested alignment, inserts the `eh00`
//! header when (and only when) there is segment data, and first moves any inline constant
//! buffers and non-empty inline delegate blobs into segments, as upstream's serializer does.

use std::borrow::Cow;

use crate::error::{FormatError, Result};
use crate::header::{align_up, insert_header, DataHeader, ProgramHeader};
use crate::ptd::{TensorLayout, DATA_IDENTIFIER};
use crate::pte::{Pte, PROGRAM_IDENTIFIER};
use crate::schema::executorch_flatbuffer as et;
use crate::schema::flat_tensor_flatbuffer as ft;

/// Layout choices for written files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Alignment of the segment base and of every segment (upstream default 128; use 4096
    /// to make segments page-aligned for mmap).
    pub segment_alignment: u64,
    /// Padding between tensors packed into the constant segment (upstream default 16).
    pub constant_tensor_alignment: u64,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            segment_alignment: 128,
            constant_tensor_alignment: 16,
        }
    }
}

impl WriteOptions {
    fn check(&self) -> Result<()> {
        for (field, v) in [
            ("segment_alignment", self.segment_alignment),
            ("constant_tensor_alignment", self.constant_tensor_alignment),
        ] {
            if !v.is_power_of_two() {
                return Err(FormatError::invalid(
                    field,
                    format!("{v} is not a power of two"),
                ));
            }
        }
        Ok(())
    }
}

/// Bytes of one segment and the alignment its content needs (on top of the file's segment
/// alignment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    /// The segment's bytes, without padding.
    pub data: Cow<'a, [u8]>,
    /// Alignment the content needs; the segment starts at a multiple of
    /// `lcm(segment_alignment, alignment)`.
    pub alignment: u64,
}

impl<'a> Segment<'a> {
    /// A segment with no alignment need of its own.
    pub fn new(data: impl Into<Cow<'a, [u8]>>) -> Self {
        Segment {
            data: data.into(),
            alignment: 1,
        }
    }
}

/// An owned program with its segment bytes, ready to be edited and written.
///
/// `segments[i]` holds the bytes that `program.segments[i]` describes; writing recomputes
/// every offset and size.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramImage<'a> {
    /// The program table.
    pub program: et::Program,
    /// Segment bytes, index-aligned with `program.segments`.
    pub segments: Vec<Segment<'a>>,
}

impl<'a> ProgramImage<'a> {
    /// Copies a verified program into an editable image; segment bytes stay borrowed.
    pub fn from_pte(pte: &Pte<'a>) -> Result<Self> {
        let program = et::Program::try_from(pte.program())?;
        let segments = (0..pte.num_segments())
            .map(|i| pte.segment(i).map(Segment::new))
            .collect::<Result<_>>()?;
        Ok(ProgramImage { program, segments })
    }

    /// Parses, verifies and copies a `.pte` file.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        Self::from_pte(&Pte::parse(bytes)?)
    }

    /// Appends a segment and returns its index.
    pub fn push_segment(&mut self, segment: Segment<'a>) -> u32 {
        self.segments.push(segment);
        let list = self.program.segments.get_or_insert_with(Vec::new);
        list.push(et::DataSegment { offset: 0, size: 0 });
        (list.len() - 1) as u32
    }

    /// Adds an entry to the program's named data (data for delegates), in a segment of
    /// its own.
    pub fn add_named_data(&mut self, key: &str, data: impl Into<Cow<'a, [u8]>>, alignment: u64) {
        let segment_index = self.push_segment(Segment {
            data: data.into(),
            alignment,
        });
        self.program
            .named_data
            .get_or_insert_with(Vec::new)
            .push(et::NamedData {
                key: Some(key.to_owned()),
                segment_index,
            });
    }

    /// Moves inline constants (the deprecated `constant_buffer`) into a packed constant
    /// segment, and non-empty inline delegate blobs into segments of their own (identical
    /// blobs share one). Writing does this implicitly.
    pub fn move_inline_data_to_segments(&mut self, options: &WriteOptions) -> Result<()> {
        options.check()?;
        self.pack_constant_buffer(options.constant_tensor_alignment)?;
        self.extract_delegate_blobs()
    }

    fn pack_constant_buffer(&mut self, alignment: u64) -> Result<()> {
        let Some(buffers) = self.program.constant_buffer.as_mut() else {
            return Ok(());
        };
        if buffers.is_empty() {
            return Ok(());
        }
        if self
            .program
            .constant_segment
            .as_ref()
            .is_some_and(|c| c.offsets.as_ref().is_some_and(|o| o.len() > 1))
        {
            return Err(FormatError::invalid(
                "Program.constant_buffer",
                "both constant_buffer and constant_segment hold constants",
            ));
        }
        let buffers = std::mem::take(buffers);
        let mut data = Vec::new();
        let mut offsets = Vec::with_capacity(buffers.len());
        let last = buffers.len() - 1;
        for (i, b) in buffers.into_iter().enumerate() {
            offsets.push(data.len() as u64);
            data.extend_from_slice(b.storage.as_deref().unwrap_or(&[]));
            if i != last {
                let padded = align_up(data.len() as u64, alignment)
                    .ok_or_else(|| FormatError::overflow("constant segment"))?;
                data.resize(padded as usize, 0);
            }
        }
        let segment_index = self.push_segment(Segment::new(data));
        self.program.constant_segment = Some(Box::new(et::SubsegmentOffsets {
            segment_index,
            offsets: Some(offsets),
        }));
        Ok(())
    }

    fn extract_delegate_blobs(&mut self) -> Result<()> {
        let Some(inline) = self.program.backend_delegate_data.take() else {
            return Ok(());
        };
        // For every old inline index: where its bytes live now.
        let mut moved = Vec::with_capacity(inline.len());
        let mut kept = Vec::new();
        let mut blob_segments: Vec<(usize, u32)> = Vec::new();
        for (i, blob) in inline.iter().enumerate() {
            let data = blob.data.as_deref().unwrap_or(&[]);
            if data.is_empty() {
                moved.push((et::DataLocation::Inline, kept.len() as u32));
                kept.push(blob.clone());
                continue;
            }
            let same = blob_segments
                .iter()
                .find(|(j, _)| inline.get(*j).and_then(|b| b.data.as_deref()) == Some(data));
            let segment = match same {
                Some(&(_, seg)) => seg,
                None => {
                    let seg = self.push_segment(Segment {
                        data: Cow::Owned(data.to_vec()),
                        alignment: 1,
                    });
                    blob_segments.push((i, seg));
                    seg
                }
            };
            moved.push((et::DataLocation::Segment, segment));
        }
        for (pi, plan) in self.program.execution_plan.iter_mut().flatten().enumerate() {
            for (di, delegate) in plan.delegates.iter_mut().flatten().enumerate() {
                let Some(processed) = delegate.processed.as_mut() else {
                    continue;
                };
                if processed.location != et::DataLocation::Inline {
                    continue;
                }
                let &(location, index) = moved.get(processed.index as usize).ok_or_else(|| {
                    FormatError::out_of_bounds(
                        format!("execution_plan[{pi}].delegates[{di}].processed.index"),
                        processed.index.into(),
                        moved.len() as u64,
                    )
                })?;
                processed.location = location;
                processed.index = index;
            }
        }
        self.program.backend_delegate_data = Some(kept);
        Ok(())
    }

    /// Serializes the program: flatbuffer, then (if any segment has bytes) the `eh00`
    /// header and the aligned segments.
    pub fn write(mut self, options: &WriteOptions) -> Result<Vec<u8>> {
        self.move_inline_data_to_segments(options)?;
        let seg_count = self.program.segments.as_ref().map_or(0, Vec::len);
        if seg_count != self.segments.len() {
            return Err(FormatError::invalid(
                "Program.segments",
                format!(
                    "{seg_count} entries but the image holds {} segments",
                    self.segments.len()
                ),
            ));
        }
        let layout = layout_segments(&self.segments, options.segment_alignment)?;
        if let Some(list) = self.program.segments.as_mut() {
            for (entry, &(offset, size)) in list.iter_mut().zip(&layout.entries) {
                *entry = et::DataSegment { offset, size };
            }
        }
        let fb = finish_flatbuffer(&self.program, PROGRAM_IDENTIFIER)?;
        if layout.data_size == 0 {
            return Ok(fb);
        }
        let header_len = ProgramHeader::LENGTH as u64;
        let program_size = fb.len() as u64 + header_len;
        let base = align_up(program_size, options.segment_alignment)
            .ok_or_else(|| FormatError::overflow("segment_base_offset"))?;
        let header = ProgramHeader {
            length: ProgramHeader::LENGTH,
            program_size,
            segment_base_offset: base,
            segment_data_size: Some(layout.data_size),
        };
        let mut out = insert_header(&fb, &header.to_bytes())?;
        append_segments(&mut out, base, &self.segments, &layout)?;
        Ok(out)
    }

    /// Like [`ProgramImage::write`], leaving the image as it is.
    pub fn to_bytes(&self, options: &WriteOptions) -> Result<Vec<u8>> {
        self.clone().write(options)
    }
}

/// Serializes a root table with a file identifier at bytes 4..8.
///
/// planus 1.3 mangles the identifier when asked to write one, so we finish without it and
/// insert the identifier plus four bytes of padding after the root offset: moving the body
/// by 8 keeps every field at its alignment.
pub fn finish_flatbuffer<T>(
    root: &impl planus::WriteAsOffset<T>,
    identifier: &str,
) -> Result<Vec<u8>> {
    let mut builder = planus::Builder::new();
    let bare = builder.finish(root, None);
    let (root, body) = bare
        .split_first_chunk::<4>()
        .ok_or_else(|| FormatError::missing("flatbuffer root offset"))?;
    let root_offset = u32::from_le_bytes(*root)
        .checked_add(8)
        .ok_or_else(|| FormatError::overflow("root offset"))?;
    let mut out = Vec::with_capacity(bare.len() + 8);
    out.extend_from_slice(&root_offset.to_le_bytes());
    out.extend_from_slice(identifier.as_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(body);
    Ok(out)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> Option<u64> {
    (a / gcd(a, b)).checked_mul(b)
}

struct SegmentLayout {
    /// (offset relative to the base, size) per segment.
    entries: Vec<(u64, u64)>,
    /// End of the last segment relative to the base.
    data_size: u64,
}

fn layout_segments(segments: &[Segment<'_>], alignment: u64) -> Result<SegmentLayout> {
    let mut end = 0u64;
    let mut entries = Vec::with_capacity(segments.len());
    for (i, s) in segments.iter().enumerate() {
        let field = || format!("segments[{i}]");
        if s.alignment == 0 {
            return Err(FormatError::invalid(field(), "alignment 0"));
        }
        let align = lcm(alignment, s.alignment).ok_or_else(|| FormatError::overflow(field()))?;
        let offset = align_up(end, align).ok_or_else(|| FormatError::overflow(field()))?;
        let size = s.data.len() as u64;
        end = offset
            .checked_add(size)
            .ok_or_else(|| FormatError::overflow(field()))?;
        entries.push((offset, size));
    }
    Ok(SegmentLayout {
        entries,
        data_size: end,
    })
}

fn append_segments(
    out: &mut Vec<u8>,
    base: u64,
    segments: &[Segment<'_>],
    layout: &SegmentLayout,
) -> Result<()> {
    let total = base
        .checked_add(layout.data_size)
        .and_then(|t| usize::try_from(t).ok())
        .ok_or_else(|| FormatError::overflow("file size"))?;
    out.reserve(total.saturating_sub(out.len()));
    out.resize(base as usize, 0);
    for (s, &(offset, _)) in segments.iter().zip(&layout.entries) {
        out.resize((base + offset) as usize, 0);
        out.extend_from_slice(&s.data);
    }
    Ok(())
}

/// One named entry to write into a `.ptd` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataEntry<'a> {
    /// Lookup key.
    pub key: String,
    /// Tensor layout, for tensor entries.
    pub layout: Option<TensorLayout>,
    /// The bytes.
    pub data: Cow<'a, [u8]>,
    /// Alignment the bytes need inside the file.
    pub alignment: u64,
}

/// Writes a `.ptd` file. Entries with identical bytes share one segment.
pub fn write_ptd(entries: &[DataEntry<'_>], options: &WriteOptions) -> Result<Vec<u8>> {
    options.check()?;
    let mut segments: Vec<Segment<'_>> = Vec::new();
    let mut named = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        if entries.iter().take(i).any(|p| p.key == e.key) {
            return Err(FormatError::invalid(
                format!("entries[{i}].key"),
                format!("duplicate key {:?}", e.key),
            ));
        }
        if let Some(layout) = &e.layout {
            let nbytes = layout.nbytes()?;
            if nbytes > e.data.len() {
                return Err(FormatError::out_of_bounds(
                    format!("entries[{i}] ({}) layout byte size", e.key),
                    nbytes as u64,
                    e.data.len() as u64,
                ));
            }
        }
        let index = match segments
            .iter_mut()
            .enumerate()
            .find(|(_, s)| s.data == e.data)
        {
            Some((j, s)) => {
                s.alignment = lcm(s.alignment, e.alignment.max(1))
                    .ok_or_else(|| FormatError::overflow("alignment"))?;
                j
            }
            None => {
                segments.push(Segment {
                    data: Cow::Borrowed(&e.data),
                    alignment: e.alignment.max(1),
                });
                segments.len() - 1
            }
        };
        named.push(ft::NamedData {
            key: Some(e.key.clone()),
            segment_index: index as u32,
            tensor_layout: e.layout.as_ref().map(|l| {
                Box::new(ft::TensorLayout {
                    scalar_type: l.scalar_type,
                    sizes: Some(l.sizes.clone()),
                    dim_order: Some(l.dim_order.clone()),
                })
            }),
        });
    }
    let layout = layout_segments(&segments, options.segment_alignment)?;
    let root = ft::FlatTensor {
        version: 0,
        segments: Some(
            layout
                .entries
                .iter()
                .map(|&(offset, size)| ft::DataSegment { offset, size })
                .collect(),
        ),
        named_data: Some(named),
    };
    let fb = finish_flatbuffer(&root, DATA_IDENTIFIER)?;
    // The 40-byte header is padded to 48 so the flatbuffer keeps its 16-byte alignment.
    let padded_len = u64::from(DataHeader::LENGTH).next_multiple_of(16);
    let base = align_up(fb.len() as u64 + padded_len, options.segment_alignment)
        .ok_or_else(|| FormatError::overflow("segment_base_offset"))?;
    let header = DataHeader {
        length: DataHeader::LENGTH,
        flatbuffer_offset: padded_len,
        flatbuffer_size: fb.len() as u64,
        segment_base_offset: base,
        segment_data_size: layout.data_size,
    };
    let mut padded = header.to_bytes().to_vec();
    padded.resize(padded_len as usize, 0);
    let mut out = insert_header(&fb, &padded)?;
    append_segments(&mut out, base, &segments, &layout)?;
    Ok(out)
}
