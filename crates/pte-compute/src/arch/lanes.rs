//! Vectors of f32 lanes for kernels written once, generic over [`Lanes`], and
//! compiled for each instruction set: arithmetic that LLVM does not vectorize on its
//! own (a tile of values transformed in registers, where arrays of f32 would round
//! trip through the stack).
//!
//! [`Scalar`] is the portable one-lane version. [`Avx2`] is eight lanes in a 256-bit
//! register; a value of it exists only once the CPU has been checked for AVX2 and FMA
//! ([`Avx2::new`]), which is what makes its intrinsics sound to call.

/// One instruction set's vector of f32 lanes, and its operations.
pub(crate) trait Lanes: Copy {
    /// The vector.
    type V: Copy;
    /// Lanes per vector.
    const LANES: usize;
    /// The first `LANES` values of `s`, zeros past its end.
    fn load(self, s: &[f32]) -> Self::V;
    /// Stores the first `d.len()` lanes (at most `LANES`).
    fn store(self, v: Self::V, d: &mut [f32]);
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a · k + c`, fused where the instruction set has it.
    fn mul_add(self, a: Self::V, k: f32, c: Self::V) -> Self::V;
    /// `min(max(v, lo), hi)`, NaN passing through (as `elementwise::clamp`).
    fn clamp(self, v: Self::V, lo: f32, hi: f32) -> Self::V;
}

/// One lane, portable.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalar;

impl Lanes for Scalar {
    type V = f32;
    const LANES: usize = 1;

    #[inline(always)]
    fn load(self, s: &[f32]) -> f32 {
        s.first().copied().unwrap_or(0.0)
    }

    #[inline(always)]
    fn store(self, v: f32, d: &mut [f32]) {
        if let Some(d) = d.first_mut() {
            *d = v;
        }
    }

    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f32 {
        a + b
    }

    #[inline(always)]
    fn sub(self, a: f32, b: f32) -> f32 {
        a - b
    }

    #[inline(always)]
    fn mul_add(self, a: f32, k: f32, c: f32) -> f32 {
        a * k + c
    }

    #[inline(always)]
    fn clamp(self, v: f32, lo: f32, hi: f32) -> f32 {
        crate::elementwise::clamp(v, lo, hi)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::Avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Lanes;
    use crate::arch::Isa;

    /// Eight lanes of AVX2 with FMA. The private field keeps [`Avx2::new`] the only
    /// way to make one.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx2(());

    impl Avx2 {
        /// The vector type, if this CPU has AVX2 and FMA.
        #[inline(always)]
        pub(crate) fn new() -> Option<Self> {
            Isa::Avx2.is_available().then_some(Avx2(()))
        }

        /// Runs `f` compiled with AVX2 and FMA enabled, so that the `Lanes` operations
        /// inlined into it become single instructions.
        #[inline(always)]
        pub(crate) fn vectorize<R>(self, f: impl FnOnce() -> R) -> R {
            #[target_feature(enable = "avx2,fma")]
            fn enabled<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: `self` proves AVX2 and FMA.
            unsafe { enabled(f) }
        }
    }

    impl Lanes for Avx2 {
        type V = __m256;
        const LANES: usize = 8;

        #[inline(always)]
        fn load(self, s: &[f32]) -> __m256 {
            match s.first_chunk::<8>() {
                // SAFETY: eight values in bounds; `self` proves AVX2 (see `Avx2::new`).
                Some(v) => unsafe { _mm256_loadu_ps(v.as_ptr()) },
                None => load_short(s),
            }
        }

        #[inline(always)]
        fn store(self, v: __m256, d: &mut [f32]) {
            match d.first_chunk_mut::<8>() {
                // SAFETY: as in `load`.
                Some(d) => unsafe { _mm256_storeu_ps(d.as_mut_ptr(), v) },
                None => store_short(v, d),
            }
        }

        #[inline(always)]
        fn add(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: `self` proves AVX2.
            unsafe { _mm256_add_ps(a, b) }
        }

        #[inline(always)]
        fn sub(self, a: __m256, b: __m256) -> __m256 {
            // SAFETY: `self` proves AVX2.
            unsafe { _mm256_sub_ps(a, b) }
        }

        #[inline(always)]
        fn mul_add(self, a: __m256, k: f32, c: __m256) -> __m256 {
            // SAFETY: `self` proves AVX2 and FMA.
            unsafe { _mm256_fmadd_ps(a, _mm256_set1_ps(k), c) }
        }

        #[inline(always)]
        fn clamp(self, v: __m256, lo: f32, hi: f32) -> __m256 {
            // SAFETY: `self` proves AVX2. `max(lo, v)` and `min(hi, ·)` return their
            // second operand when a lane is NaN.
            unsafe { _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v)) }
        }
    }

    /// The short paths of `load` and `store`, out of line: inlined, LLVM merges both
    /// paths into one variable-length `memcpy` call.
    #[cold]
    #[inline(never)]
    fn load_short(s: &[f32]) -> __m256 {
        let mut v = [0.0f32; 8];
        v.iter_mut().zip(s).for_each(|(d, &x)| *d = x);
        // SAFETY: `__m256` and `[f32; 8]` have the same size, any bits are valid.
        unsafe { std::mem::transmute::<[f32; 8], __m256>(v) }
    }

    #[cold]
    #[inline(never)]
    fn store_short(v: __m256, d: &mut [f32]) {
        // SAFETY: as in `load_short`.
        let v = unsafe { std::mem::transmute::<__m256, [f32; 8]>(v) };
        d.iter_mut().zip(v).for_each(|(d, x)| *d = x);
    }
}
