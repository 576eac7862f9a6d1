#!/usr/bin/env python3
"""Fits the degree-5 polynomial of pte-compute's `math::exp_nonpositive`.

e^r ~ 1 + r + r^2 * (c2 + c3 r + c4 r^2 + c5 r^3) on |r| <= ln 2 / 2, minimizing the
relative error: least squares on Chebyshev nodes, reweighted towards the largest errors
(a near-minimax fit). Prints the float32 coefficients and their relative error measured
on a dense grid. Needs numpy only (the reference environment has it).

    .venv-ref/bin/python tools/fit_exp_poly.py
"""

import numpy as np


def main() -> None:
    lo, hi = -np.log(2) / 2, np.log(2) / 2
    n = 2000
    k = np.arange(n)
    r = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)
    # Relative error of 1 + r + r^2 q(r) against e^r, linear in q's coefficients.
    scale = r**2 / np.exp(r)
    a = np.vstack([r**j for j in range(4)]).T * scale[:, None]
    b = (np.exp(r) - 1 - r) / r**2 * scale
    w = np.ones(n)
    for _ in range(60):
        c, *_ = np.linalg.lstsq(a * w[:, None], b * w, rcond=None)
        err = np.abs(a @ c - b)
        w = w * (err / err.max()) ** 0.3 + 1e-12
        w /= w.max()
    c32 = c.astype(np.float32)
    grid = np.linspace(lo, hi, 200_001).astype(np.float32).astype(np.float64)
    q = c32[0] + grid * (c32[1] + grid * (c32[2] + grid * c32[3]))
    rel = np.abs((1 + grid + grid**2 * q) / np.exp(grid) - 1).max()
    print("c2..c5:", ", ".join(repr(float(x)) for x in c32))
    print(f"max relative error: {rel:.3g}")


if __name__ == "__main__":
    main()
