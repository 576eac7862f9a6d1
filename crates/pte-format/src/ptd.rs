//! Zero-copy, verified view of a `.ptd` FlatTensor data file.

use std::ops::Range;

use planus::ReadAsRoot;

use crate::error::{FormatError, Result};
use crate::header::{check_identifier, DataHeader};
use crate::pte::Verified;
use crate::scalar::{check_dim_order, tensor_nbytes};
use crate::schema::executorch_flatbuffer::ScalarType;
use crate::schema::flat_tensor_flatbuffer::{FlatTensorRef, NamedDataRef};
use crate::verify;

/// The `.ptd` file identifier.
pub const DATA_IDENTIFIER: &str = "FT01";

/// Layout of a tensor stored in a `.ptd` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// Element type.
    pub scalar_type: ScalarType,
    /// Sizes in logical (not memory) order.
    pub sizes: Vec<i32>,
    /// Memory order of the dimensions, outermost first.
    pub dim_order: Vec<u8>,
}

impl TensorLayout {
    /// Byte size of the tensor, overflow-checked.
    pub fn nbytes(&self) -> Result<usize> {
        tensor_nbytes(
            self.scalar_type,
            self.sizes.iter().map(|&s| i64::from(s)),
            "tensor_layout.sizes",
        )
    }
}

/// One named entry of a `.ptd` file.
#[derive(Clone, Debug)]
pub struct NamedEntry<'a> {
    /// The lookup key (a fully qualified name for tensors exported by upstream).
    pub key: &'a str,
    /// Index into the file's segments.
    pub segment_index: usize,
    /// The tensor layout, when the entry is a tensor.
    pub layout: Option<TensorLayout>,
    /// The entry's bytes (the whole segment; a tensor uses its first `nbytes`).
    pub data: &'a [u8],
}

/// A verified `.ptd` file borrowing the file's bytes.
#[derive(Clone, Copy)]
pub struct Ptd<'a> {
    file: &'a [u8],
    header: DataHeader,
    root: FlatTensorRef<'a>,
}

impl std::fmt::Debug for Ptd<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ptd")
            .field("len", &self.file.len())
            .field("header", &self.header)
            .finish()
    }
}

impl<'a> Ptd<'a> {
    /// Parses and verifies a data file, including every segment range and tensor layout.
    pub fn parse(file: &'a [u8]) -> Result<Self> {
        let ptd = Self::open(file)?;
        let fb_len = ptd.header.flatbuffer_offset + ptd.header.flatbuffer_size;
        verify::flat_tensor(ptd.root, fb_len as usize)?;
        ptd.check()?;
        Ok(ptd)
    }

    /// Views a data file that [`Ptd::parse`] verified before, in constant time; see
    /// [`crate::Pte::reopen`].
    pub fn reopen(file: &'a [u8], verified: Verified) -> Result<Self> {
        if verified.names(file) {
            Self::open(file)
        } else {
            Self::parse(file)
        }
    }

    /// The token with which [`Ptd::reopen`] views these bytes again without verifying them.
    pub fn verified(&self) -> Verified {
        Verified::of(self.file)
    }

    /// Checks the identifier and header and finds the root table, without the walk.
    fn open(file: &'a [u8]) -> Result<Self> {
        check_identifier(file, DATA_IDENTIFIER, "a .ptd data file")?;
        let header = DataHeader::parse(file)?;
        let len = file.len() as u64;
        let fb_end = header
            .flatbuffer_offset
            .checked_add(header.flatbuffer_size)
            .ok_or_else(|| FormatError::overflow("FH01.flatbuffer_offset + flatbuffer_size"))?;
        if fb_end > len {
            return Err(FormatError::out_of_bounds(
                "FH01.flatbuffer_offset + flatbuffer_size",
                fb_end,
                len,
            ));
        }
        let data_end = header
            .segment_base_offset
            .checked_add(header.segment_data_size)
            .ok_or_else(|| FormatError::overflow("FH01.segment_base_offset + segment_data_size"))?;
        if data_end > len {
            return Err(FormatError::out_of_bounds(
                "FH01.segment_base_offset + segment_data_size",
                data_end,
                len,
            ));
        }
        let fb = file.get(..fb_end as usize).unwrap_or(file);
        let root = FlatTensorRef::read_as_root(fb)?;
        Ok(Ptd { file, header, root })
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.file
    }

    /// The FH01 header.
    pub fn header(&self) -> &DataHeader {
        &self.header
    }

    /// The verified FlatTensor table.
    pub fn root(&self) -> FlatTensorRef<'a> {
        self.root
    }

    /// The bytes of segment `index`.
    pub fn segment(&self, index: usize) -> Result<&'a [u8]> {
        let range = self.segment_range(index)?;
        let limit = self.file.len() as u64;
        self.file.get(range.clone()).ok_or_else(|| {
            FormatError::out_of_bounds(format!("segments[{index}] end"), range.end as u64, limit)
        })
    }

    /// Number of segments.
    pub fn num_segments(&self) -> usize {
        self.root.segments().ok().flatten().map_or(0, |s| s.len())
    }

    /// Absolute byte range of segment `index`.
    pub fn segment_range(&self, index: usize) -> Result<Range<usize>> {
        let segments = self
            .root
            .segments()?
            .ok_or_else(|| FormatError::missing("FlatTensor.segments"))?;
        let seg = segments.get(index).ok_or_else(|| {
            FormatError::out_of_bounds("segment index", index as u64, segments.len() as u64)
        })??;
        let field = || format!("segments[{index}]");
        let start = self
            .header
            .segment_base_offset
            .checked_add(seg.offset()?)
            .ok_or_else(|| FormatError::overflow(field()))?;
        let end = start
            .checked_add(seg.size()?)
            .ok_or_else(|| FormatError::overflow(field()))?;
        let limit = self.header.segment_base_offset + self.header.segment_data_size;
        if end > limit {
            return Err(FormatError::out_of_bounds(
                format!("{} end", field()),
                end,
                limit,
            ));
        }
        Ok(start as usize..end as usize)
    }

    /// Number of named entries.
    pub fn len(&self) -> usize {
        self.root.named_data().ok().flatten().map_or(0, |n| n.len())
    }

    /// True when the file has no named entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All named entries in file order.
    pub fn entries(&self) -> Result<Vec<NamedEntry<'a>>> {
        let Some(named) = self.root.named_data()? else {
            return Ok(Vec::new());
        };
        named
            .iter()
            .enumerate()
            .map(|(i, n)| self.entry(i, n?))
            .collect()
    }

    /// Looks an entry up by exact key.
    pub fn get(&self, key: &str) -> Result<Option<NamedEntry<'a>>> {
        let Some(named) = self.root.named_data()? else {
            return Ok(None);
        };
        for (i, n) in named.iter().enumerate() {
            let n = n?;
            if n.key()? == Some(key) {
                return self.entry(i, n).map(Some);
            }
        }
        Ok(None)
    }

    fn entry(&self, i: usize, n: NamedDataRef<'a>) -> Result<NamedEntry<'a>> {
        let key = n
            .key()?
            .ok_or_else(|| FormatError::missing(format!("named_data[{i}].key")))?;
        let segment_index = n.segment_index()? as usize;
        if segment_index >= self.num_segments() {
            return Err(FormatError::out_of_bounds(
                format!("named_data[{i}].segment_index"),
                segment_index as u64,
                self.num_segments() as u64,
            ));
        }
        let data = self.segment(segment_index)?;
        let layout = match n.tensor_layout()? {
            Some(l) => {
                let field = format!("named_data[{i}].tensor_layout");
                let sizes: Vec<i32> = l
                    .sizes()?
                    .ok_or_else(|| FormatError::missing(format!("{field}.sizes")))?
                    .iter()
                    .collect();
                let dim_order = l
                    .dim_order()?
                    .ok_or_else(|| FormatError::missing(format!("{field}.dim_order")))?
                    .to_vec();
                check_dim_order(&dim_order, sizes.len(), &field)?;
                let layout = TensorLayout {
                    scalar_type: l.scalar_type()?,
                    sizes,
                    dim_order,
                };
                let nbytes = layout.nbytes()?;
                if nbytes > data.len() {
                    return Err(FormatError::out_of_bounds(
                        format!("{field} byte size ({key})"),
                        nbytes as u64,
                        data.len() as u64,
                    ));
                }
                Some(layout)
            }
            None => None,
        };
        Ok(NamedEntry {
            key,
            segment_index,
            layout,
            data,
        })
    }

    fn check(&self) -> Result<()> {
        for i in 0..self.num_segments() {
            self.segment_range(i)?;
        }
        self.entries().map(drop)
    }
}
