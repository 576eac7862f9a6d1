//! Complex elementwise arithmetic (`add`, `sub`, `mul`, `div` and `abs`, as upstream
//! supports): operands broadcast, real operands and scalars taken as complex numbers
//! with no imaginary part, computed in `f64` and rounded to the output's parts.

use num_complex::Complex;
use pte_runtime::{Arg, Args, Dims, KernelError, KernelResult};
use smallvec::SmallVec;

use super::engine::Operand;
use crate::layout::{Dense, Vals};
use crate::num::Elem;
use crate::util::{broadcast_shapes, broadcast_strides, complex_part, for_each_broadcast, oob};

type C = Complex<f64>;

/// True when a tensor operand or the output at `out` is complex.
pub fn involved(args: &Args<'_>, operands: &[Operand], out: usize) -> KernelResult<bool> {
    let mut any = args.info(out)?.dtype.is_complex();
    for op in operands {
        if let Operand::Tensor(i) = *op {
            any |= args.info(i)?.dtype.is_complex();
        }
    }
    Ok(any)
}

/// An operand's element `i` (row-major) as a complex number.
fn element(v: Vals<'_>, complex: bool, i: usize) -> KernelResult<C> {
    if complex {
        Ok(C::new(v.at(2 * i)?, v.at(2 * i + 1)?))
    } else {
        Ok(C::new(v.at(i)?, 0.0))
    }
}

/// An operand's values: a tensor's (complex or not) or a scalar.
#[derive(Clone, Copy)]
enum Source<'a> {
    Tensor(Vals<'a>, bool),
    Scalar(C),
}

/// `out = f(a, b)` over complex numbers, `a` and `b` tensors or scalars.
pub fn binary(
    args: &mut Args<'_>,
    operands: [Operand; 2],
    out: usize,
    f: impl Fn(C, C) -> C,
) -> KernelResult {
    let od = args.info(out)?.dtype;
    if !od.is_complex() {
        return Err(KernelError::invalid(format!(
            "a complex result cannot be written to an output of type {od}"
        )));
    }
    let mut shape = Dims::new();
    let mut reads: SmallVec<[Arg; 2]> = SmallVec::new();
    let mut sizes: [Option<Dims>; 2] = [None, None];
    for (op, size) in operands.iter().zip(sizes.iter_mut()) {
        if let Operand::Tensor(i) = *op {
            let t = args.info(i)?;
            shape = broadcast_shapes(&shape, &t.sizes)?;
            *size = Some(t.sizes.clone());
            reads.push(Arg::At(i));
        }
    }
    args.resize(out, &shape)?;
    let strides = sizes.map(|s| s.map(|s| broadcast_strides(&s, &shape)));
    let mut io = Dense::io(args, &reads, &[out.into()], &[])?;
    let mut next = 0;
    let mut sources: SmallVec<[Source<'_>; 2]> = SmallVec::new();
    for op in operands {
        sources.push(match op {
            Operand::Tensor(_) => {
                let (info, _) = io.inputs.get(next).ok_or_else(oob)?;
                let complex = info.dtype.is_complex();
                let v = Vals::input(&io, next)?;
                next += 1;
                Source::Tensor(v, complex)
            }
            Operand::Scalar(s) => Source::Scalar(C::new(s.to_f64(), 0.0)),
        });
    }
    let value = |k: usize, at: usize| -> KernelResult<C> {
        match *sources.get(k).ok_or_else(oob)? {
            Source::Tensor(v, complex) => element(v, complex, at),
            Source::Scalar(c) => Ok(c),
        }
    };
    let zero: Dims = smallvec::smallvec![0; shape.len()];
    let [sa, sb] = strides.map(|s| s.unwrap_or_else(|| zero.clone()));
    crate::dispatch_types!(od, P => {
        let mut parts = io.output::<P>(0)?.chunks_exact_mut(2);
        let mut result = Ok(());
        for_each_broadcast(&shape, [&sa, &sb], |_, [i, j]| {
            let v = value(0, i).and_then(|a| Ok(f(a, value(1, j)?)));
            match (parts.next(), v) {
                (Some([re, im]), Ok(v)) => {
                    *re = P::from_f64(v.re);
                    *im = P::from_f64(v.im);
                }
                (_, Err(e)) => result = Err(e),
                _ => result = Err(oob()),
            }
        });
        result?;
    }, return Err(KernelError::dtypes(&[od])), [C32 => half::f16, C64 => f32, C128 => f64]);
    io.finish()
}

/// `abs.out(self, out)` of a complex tensor: the magnitudes, in the parts' type.
pub fn abs(args: &mut Args<'_>) -> KernelResult {
    let x = args.tensor(0)?;
    let od = args.info(1)?.dtype;
    if od != complex_part(x.dtype) {
        return Err(KernelError::dtypes(&[x.dtype, od]));
    }
    args.resize(1, &x.sizes)?;
    let mut io = Dense::io(args, &[0.into()], &[1.into()], &[])?;
    let v = Vals::input(&io, 0)?;
    crate::dispatch_float!(od, T => {
        for (i, o) in io.output::<T>(0)?.iter_mut().enumerate() {
            *o = T::from_f64(element(v, true, i)?.norm());
        }
    }, return Err(KernelError::dtypes(&[od])));
    io.finish()
}
