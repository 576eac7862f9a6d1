//! Full verification of a flatbuffer before anything reads it.
//!
//! planus checks each access on its own, so walking every field of every table once
//! proves the whole buffer sound: offsets, lengths, vtables, UTF-8, enum values and union
//! tags. The walk charges a budget proportional to the file size, because a hostile
//! flatbuffer can point many offsets at the same large sub-object and make a naive walk
//! (or a conversion to owned objects) take time and memory far beyond its size.

use crate::error::{FormatError, Result};
use crate::schema::bundled_program_flatbuffer as bp;
use crate::schema::executorch_flatbuffer as et;
use crate::schema::flat_tensor_flatbuffer as ft;

/// Budget units a file may use per byte of its size, plus a floor for tiny files.
const UNITS_PER_BYTE: u64 = 4;
const MIN_BUDGET: u64 = 1 << 20;
/// A table costs this many units: owned copies of tables are far larger than their bytes.
const TABLE_COST: u64 = 16;

struct Walker {
    left: u64,
    budget: u64,
    len: u64,
}

enum Stop {
    Fb(planus::Error),
    Budget,
}

impl From<planus::Error> for Stop {
    fn from(e: planus::Error) -> Self {
        Stop::Fb(e)
    }
}

type Walk = std::result::Result<(), Stop>;

impl Walker {
    fn new(len: usize) -> Self {
        let len = len as u64;
        let budget = len.saturating_mul(UNITS_PER_BYTE).max(MIN_BUDGET);
        Walker {
            left: budget,
            budget,
            len,
        }
    }

    fn charge(&mut self, units: u64) -> Walk {
        self.left = self.left.checked_sub(units).ok_or(Stop::Budget)?;
        Ok(())
    }

    fn table(&mut self) -> Walk {
        self.charge(TABLE_COST)
    }

    fn bytes(&mut self, b: Option<&[u8]>) -> Walk {
        self.charge(b.map_or(0, |b| b.len() as u64))
    }

    fn str(&mut self, s: Option<&str>) -> Walk {
        self.charge(s.map_or(0, |s| s.len() as u64))
    }

    fn vec<T>(&mut self, v: Option<planus::Vector<'_, T>>) -> Walk {
        self.charge(v.map_or(0, |v| v.len() as u64))
    }

    fn finish(self, walk: Walk) -> Result<()> {
        match walk {
            Ok(()) => Ok(()),
            Err(Stop::Fb(e)) => Err(e.into()),
            Err(Stop::Budget) => Err(FormatError::TooComplex {
                budget: self.budget,
                len: self.len,
            }),
        }
    }
}

/// Visits every element of an optional vector of tables.
macro_rules! each {
    ($w:expr, $vec:expr, |$x:ident| $body:expr) => {
        if let Some(v) = $vec {
            $w.charge(v.len() as u64)?;
            for $x in v.iter() {
                let $x = $x?;
                $body;
            }
        }
    };
}

/// Verifies a `.pte` program flatbuffer.
pub fn program(root: et::ProgramRef<'_>, file_len: usize) -> Result<()> {
    let mut w = Walker::new(file_len);
    let walk = walk_program(&mut w, root);
    w.finish(walk)
}

fn walk_program(w: &mut Walker, p: et::ProgramRef<'_>) -> Walk {
    w.table()?;
    p.version()?;
    each!(w, p.execution_plan()?, |plan| walk_plan(w, plan)?);
    each!(w, p.constant_buffer()?, |b| {
        w.table()?;
        w.bytes(b.storage()?)?
    });
    each!(w, p.backend_delegate_data()?, |d| {
        w.table()?;
        w.bytes(d.data()?)?
    });
    each!(w, p.segments()?, |s| {
        w.table()?;
        s.offset()?;
        s.size()?
    });
    if let Some(c) = p.constant_segment()? {
        walk_subsegment(w, c)?;
    }
    each!(w, p.mutable_data_segments()?, |s| walk_subsegment(w, s)?);
    each!(w, p.named_data()?, |n| {
        w.table()?;
        w.str(n.key()?)?;
        n.segment_index()?
    });
    Ok(())
}

fn walk_subsegment(w: &mut Walker, s: et::SubsegmentOffsetsRef<'_>) -> Walk {
    w.table()?;
    s.segment_index()?;
    w.vec(s.offsets()?)
}

fn walk_plan(w: &mut Walker, plan: et::ExecutionPlanRef<'_>) -> Walk {
    w.table()?;
    w.str(plan.name()?)?;
    if let Some(c) = plan.container_meta_type()? {
        w.table()?;
        w.str(c.encoded_inp_str()?)?;
        w.str(c.encoded_out_str()?)?;
    }
    each!(w, plan.values()?, |v| {
        w.table()?;
        if let Some(val) = v.val()? {
            walk_value(w, val)?
        }
    });
    w.vec(plan.inputs()?)?;
    w.vec(plan.outputs()?)?;
    each!(w, plan.chains()?, |c| walk_chain(w, c)?);
    each!(w, plan.operators()?, |o| {
        w.table()?;
        w.str(o.name()?)?;
        w.str(o.overload()?)?
    });
    each!(w, plan.delegates()?, |d| {
        w.table()?;
        w.str(d.id()?)?;
        if let Some(r) = d.processed()? {
            w.table()?;
            r.location()?;
            r.index()?;
        }
        each!(w, d.compile_specs()?, |s| {
            w.table()?;
            w.str(s.key()?)?;
            w.bytes(s.value()?)?
        })
    });
    w.vec(plan.non_const_buffer_sizes()?)?;
    each!(w, plan.non_const_buffer_device()?, |d| {
        w.table()?;
        d.buffer_idx()?;
        d.device_type()?;
        d.device_index()?
    });
    Ok(())
}

fn walk_value(w: &mut Walker, v: et::KernelTypesRef<'_>) -> Walk {
    use et::KernelTypesRef as K;
    w.table()?;
    match v {
        K::Null(_) => {}
        K::Int(i) => {
            i.int_val()?;
        }
        K::Bool(b) => {
            b.bool_val()?;
        }
        K::Double(d) => {
            d.double_val()?;
        }
        K::String(s) => w.str(s.string_val()?)?,
        K::Tensor(t) => walk_tensor(w, t)?,
        K::IntList(l) => w.vec(l.items()?)?,
        K::DoubleList(l) => w.vec(l.items()?)?,
        K::BoolList(l) => w.vec(l.items()?)?,
        K::TensorList(l) => w.vec(l.items()?)?,
        K::OptionalTensorList(l) => w.vec(l.items()?)?,
    }
    Ok(())
}

fn walk_tensor(w: &mut Walker, t: et::TensorRef<'_>) -> Walk {
    t.scalar_type()?;
    t.storage_offset()?;
    w.vec(t.sizes()?)?;
    w.bytes(t.dim_order()?)?;
    t.requires_grad()?;
    t.data_buffer_idx()?;
    if let Some(a) = t.allocation_info()? {
        w.table()?;
        a.memory_id()?;
        a.memory_offset_low()?;
        a.memory_offset_high()?;
    }
    t.layout()?;
    t.shape_dynamism()?;
    if let Some(e) = t.extra_tensor_info()? {
        w.table()?;
        e.mutable_data_segments_idx()?;
        w.str(e.fully_qualified_name()?)?;
        e.location()?;
        e.device_type()?;
        e.device_index()?;
    }
    Ok(())
}

fn walk_chain(w: &mut Walker, c: et::ChainRef<'_>) -> Walk {
    use et::InstructionArgumentsRef as I;
    w.table()?;
    w.vec(c.inputs()?)?;
    w.vec(c.outputs()?)?;
    each!(w, c.instructions()?, |i| {
        w.table()?;
        if let Some(args) = i.instr_args()? {
            w.table()?;
            match args {
                I::KernelCall(k) => {
                    k.op_index()?;
                    w.vec(k.args()?)?
                }
                I::DelegateCall(d) => {
                    d.delegate_index()?;
                    w.vec(d.args()?)?
                }
                I::MoveCall(m) => {
                    m.move_from()?;
                    m.move_to()?;
                }
                I::JumpFalseCall(j) => {
                    j.cond_value_index()?;
                    j.destination_instruction()?;
                }
                I::FreeCall(f) => {
                    f.value_index()?;
                }
            }
        }
    });
    each!(w, c.stacktrace()?, |frames| {
        w.table()?;
        each!(w, frames.items()?, |f| {
            w.table()?;
            w.str(f.filename()?)?;
            f.lineno()?;
            w.str(f.name()?)?;
            w.str(f.context()?)?
        })
    });
    Ok(())
}

/// Verifies a `.ptd` FlatTensor flatbuffer.
pub fn flat_tensor(root: ft::FlatTensorRef<'_>, file_len: usize) -> Result<()> {
    let mut w = Walker::new(file_len);
    let walk = (|| -> Walk {
        w.table()?;
        root.version()?;
        each!(w, root.segments()?, |s| {
            w.table()?;
            s.offset()?;
            s.size()?
        });
        each!(w, root.named_data()?, |n| {
            w.table()?;
            w.str(n.key()?)?;
            n.segment_index()?;
            if let Some(l) = n.tensor_layout()? {
                w.table()?;
                l.scalar_type()?;
                w.vec(l.sizes()?)?;
                w.bytes(l.dim_order()?)?;
            }
        });
        Ok(())
    })();
    w.finish(walk)
}

/// Verifies a `.bpte` bundled-program flatbuffer (the embedded program is verified on its
/// own when it is opened).
pub fn bundled_program(root: bp::BundledProgramRef<'_>, file_len: usize) -> Result<()> {
    let mut w = Walker::new(file_len);
    let walk = (|| -> Walk {
        w.table()?;
        root.version()?;
        each!(w, root.method_test_suites()?, |suite| {
            w.table()?;
            w.str(suite.method_name()?)?;
            each!(w, suite.test_cases()?, |case| {
                w.table()?;
                each!(w, case.inputs()?, |v| walk_bundled_value(&mut w, v)?);
                each!(w, case.expected_outputs()?, |v| walk_bundled_value(
                    &mut w, v
                )?);
            });
        });
        w.bytes(root.program()?)?;
        Ok(())
    })();
    w.finish(walk)
}

fn walk_bundled_value(w: &mut Walker, v: bp::ValueRef<'_>) -> Walk {
    use bp::ValueUnionRef as V;
    w.table()?;
    if let Some(val) = v.val()? {
        w.table()?;
        match val {
            V::Tensor(t) => {
                t.scalar_type()?;
                w.vec(t.sizes()?)?;
                w.bytes(t.data()?)?;
                w.bytes(t.dim_order()?)?;
            }
            V::Int(i) => {
                i.int_val()?;
            }
            V::Bool(b) => {
                b.bool_val()?;
            }
            V::Double(d) => {
                d.double_val()?;
            }
        }
    }
    Ok(())
}
