//! Program rewrites that keep behaviour: moving constants out into a `.ptd` file.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::{FormatError, Result};
use crate::ptd::TensorLayout;
use crate::scalar::tensor_nbytes;
use crate::schema::executorch_flatbuffer as et;
use crate::write::{DataEntry, ProgramImage, WriteOptions};

/// Alignment of tensors in the written `.ptd` (upstream uses 16 for constants).
const EXTERNAL_TENSOR_ALIGNMENT: u64 = 16;

impl<'a> ProgramImage<'a> {
    /// Moves every constant tensor of every method out of the program, returning the
    /// entries of the `.ptd` file that must accompany it.
    ///
    /// Each constant becomes an `EXTERNAL` tensor keyed by its fully qualified name when
    /// the program records one, otherwise by the stable key `constant_<index>` (index in
    /// the constant segment; `constant_<index>_<n>` when one buffer backs tensors of
    /// different layouts). The `.ptd` layouts match the tensors exactly, as upstream's
    /// loader requires. The constant segment is left holding only its placeholder.
    pub fn externalize_constants(&mut self, options: &WriteOptions) -> Result<Vec<DataEntry<'a>>> {
        self.move_inline_data_to_segments(options)?;
        let Some(constants) = self.program.constant_segment.as_deref() else {
            return Ok(Vec::new());
        };
        let segment_index = constants.segment_index as usize;
        let offsets = constants.offsets.clone().unwrap_or_default();
        let segment = self.segments.get(segment_index).ok_or_else(|| {
            FormatError::out_of_bounds(
                "constant_segment.segment_index",
                segment_index as u64,
                self.segments.len() as u64,
            )
        })?;
        let data: Cow<'a, [u8]> = segment.data.clone();

        let mut entries: Vec<DataEntry<'a>> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for (pi, plan) in self.program.execution_plan.iter_mut().flatten().enumerate() {
            for (vi, value) in plan.values.iter_mut().flatten().enumerate() {
                let Some(et::KernelTypes::Tensor(tensor)) = value.val.as_mut() else {
                    continue;
                };
                let is_external = tensor
                    .extra_tensor_info
                    .as_ref()
                    .is_some_and(|e| e.location == et::TensorDataLocation::External);
                if tensor.data_buffer_idx == 0 || tensor.allocation_info.is_some() || is_external {
                    continue;
                }
                let field = format!("execution_plan[{pi}].values[{vi}]");
                let idx = tensor.data_buffer_idx as usize;
                let layout = TensorLayout {
                    scalar_type: tensor.scalar_type,
                    sizes: tensor.sizes.clone().unwrap_or_default(),
                    dim_order: tensor.dim_order.clone().unwrap_or_default(),
                };
                let nbytes = tensor_nbytes(
                    layout.scalar_type,
                    layout.sizes.iter().map(|&s| i64::from(s)),
                    &field,
                )?;
                let start = *offsets.get(idx).ok_or_else(|| {
                    FormatError::out_of_bounds(
                        format!("{field}.data_buffer_idx"),
                        idx as u64,
                        offsets.len() as u64,
                    )
                })?;
                let end = start
                    .checked_add(nbytes as u64)
                    .filter(|&e| e <= data.len() as u64)
                    .ok_or_else(|| {
                        FormatError::out_of_bounds(
                            format!("{field} constant data end"),
                            start.saturating_add(nbytes as u64),
                            data.len() as u64,
                        )
                    })?;
                // In bounds: `end <= data.len()` was checked above.
                let range = start as usize..end as usize;
                let bytes = match &data {
                    Cow::Borrowed(d) => Cow::Borrowed(d.get(range).unwrap_or_default()),
                    Cow::Owned(d) => Cow::Owned(d.get(range).unwrap_or_default().to_vec()),
                };

                let fqn = tensor
                    .extra_tensor_info
                    .as_ref()
                    .and_then(|e| e.fully_qualified_name.clone())
                    .filter(|n| !n.is_empty());
                let base_key = fqn.unwrap_or_else(|| format!("constant_{idx}"));
                let mut key = base_key.clone();
                let mut n = 0;
                loop {
                    match by_key.get(&key) {
                        None => {
                            by_key.insert(key.clone(), entries.len());
                            entries.push(DataEntry {
                                key: key.clone(),
                                layout: Some(layout.clone()),
                                data: bytes.clone(),
                                alignment: EXTERNAL_TENSOR_ALIGNMENT,
                            });
                            break;
                        }
                        Some(&e)
                            if entries.get(e).is_some_and(|entry| {
                                entry.layout.as_ref() == Some(&layout) && entry.data == bytes
                            }) =>
                        {
                            break
                        }
                        Some(_) => {
                            n += 1;
                            key = format!("{base_key}_{n}");
                        }
                    }
                }
                tensor.data_buffer_idx = 0;
                let info = tensor
                    .extra_tensor_info
                    .get_or_insert_with(Default::default);
                info.fully_qualified_name = Some(key);
                info.location = et::TensorDataLocation::External;
            }
        }
        if let Some(c) = self.program.constant_segment.as_deref_mut() {
            c.offsets = Some(vec![0]);
        }
        if let Some(s) = self.segments.get_mut(segment_index) {
            s.data = Cow::Borrowed(&[]);
        }
        Ok(entries)
    }
}
