#!/usr/bin/env python3
"""Fits the rational function of pte-compute's `math::gelu` (erf form).

2Φ(x) - 1 = erf(x/√2) ~ x · P(x²) / Q(x²) on 0 <= x <= CLAMP (odd in x, so the fit on
the positive half serves both signs; beyond CLAMP erf(x/√2) rounds to ±1 in float32),
with Q(0) = 1, minimizing the absolute error: linearized least squares (Loeb's
iteration, dividing by the previous Q) on Chebyshev nodes, reweighted towards the
largest errors (a near-minimax fit, Lawson). Prints the float32 coefficients and the
error of the float32 evaluation against math.erf on a dense grid. Needs numpy only.

    .venv-ref/bin/python tools/fit_gelu_rational.py [P degree] [Q degree]
"""

import math
import sys

import numpy as np

# erfc(CLAMP/√2) < 2^-25: erf(x/√2) of a larger x rounds to 1 in float32.
CLAMP = 5.6


def main() -> None:
    dp = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dq = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    n = 4000
    k = np.arange(n)
    x = CLAMP / 2 + CLAMP / 2 * np.cos(np.pi * (k + 0.5) / n)
    f = np.array([math.erf(v / math.sqrt(2)) for v in x])
    u = x * x
    # Unknowns: p0..p_dp, q1..q_dq. Residual x P(u) - f Q(u), linear in them.
    a = np.hstack([np.vstack([x * u**j for j in range(dp + 1)]).T,
                   np.vstack([-f * u**j for j in range(1, dq + 1)]).T])
    q_prev = np.ones(n)
    w = np.ones(n)
    for _ in range(200):
        s = w / q_prev
        c, *_ = np.linalg.lstsq(a * s[:, None], f * s, rcond=None)
        p, q = c[: dp + 1], np.concatenate([[1.0], c[dp + 1:]])
        q_prev = np.polyval(q[::-1], u)
        err = np.abs(x * np.polyval(p[::-1], u) / q_prev - f)
        w = w * (err / err.max()) ** 0.25 + 1e-12
        w /= w.max()
    print(f"max |erf error| (float64 fit): {err.max():.3g}")
    # Rounding the coefficients costs more than the fit's error: round Q, refit P
    # against it (least squares, the same weights), then round P.
    q32 = q.astype(np.float32)
    qv = np.polyval(q32.astype(np.float64)[::-1], u)
    ap = np.vstack([x * u**j for j in range(dp + 1)]).T / qv[:, None]
    p, *_ = np.linalg.lstsq(ap * w[:, None], f * w, rcond=None)
    p32 = p.astype(np.float32)
    # The float32 evaluation as the kernel does it: Horner's scheme with fused
    # multiply-adds (one rounding per step), then the quotient.
    f32 = lambda v: np.asarray(v, np.float64).astype(np.float32).astype(np.float64)
    grid = f32(np.linspace(0, CLAMP, 400_001))
    uu = f32(grid * grid)
    pp = np.full_like(uu, float(p32[-1]))
    for cf in p32[-2::-1]:
        pp = f32(pp * uu + float(cf))
    qq = np.full_like(uu, float(q32[-1]))
    for cf in q32[-2::-1]:
        qq = f32(qq * uu + float(cf))
    got = f32(grid * f32(pp / qq))
    want = np.array([math.erf(float(v) / math.sqrt(2)) for v in grid])
    print("P:", ", ".join(repr(float(v)) for v in p32))
    print("Q:", ", ".join(repr(float(v)) for v in q32))
    print(f"max |erf error| (float32 evaluation): {np.abs(got - want).max():.3g}")
    print(f"at the clamp: 1 - erf = {1 - got[-1]:.3g}")
    print(f"min Q: {qq.min():.3g}")


if __name__ == "__main__":
    main()
