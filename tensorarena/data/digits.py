"""Generated handwriting-like digits: the embedded default data set (nothing downloaded).

Each image starts from a 5x7 bitmap glyph of its digit, is scaled, sheared,
shifted and stroked with a random thickness onto a 16x16 canvas, then gets
pixel noise. Every sample is a pure function of the seed, so train/test
splits are reproducible on any machine.
"""

from __future__ import annotations

import numpy as np

SIZE = 16
NUM_CLASSES = 10

# 5 columns x 7 rows per digit; '#' is ink.
_GLYPHS = {
    0: (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    1: ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    2: (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    3: ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    4: ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    5: ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    6: ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    7: ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    8: (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    9: (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
}


def _ink_points(digit: int) -> np.ndarray:
    """Centres of the glyph's ink cells in glyph units, centred on the origin. Shape: (K, 2) as (row, col)."""
    rows = _GLYPHS[digit]
    pts = [(r, c) for r, line in enumerate(rows) for c, ch in enumerate(line) if ch == "#"]
    return np.asarray(pts, dtype=np.float64) - np.array([3.0, 2.0])


_CHUNK = 64  # images per block: its (64, ink points, 16, 16) float64 distances are ~2 MiB, under the (count, 256)
# float64 noise array drawn after, so generating a set peaks no higher than before


def make_digits(count: int, *, seed: int = 0, noise: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """`count` images (count, 256) float32 in [0, 1]-ish with labels (count,) int64."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"count must be an integer, got {type(count).__name__} {count!r}")
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    # NaN noise would return images that are all NaN; a negative one is no standard deviation.
    if not 0.0 <= noise < np.inf:
        raise ValueError(f"noise must be finite and non-negative (the pixel noise's standard deviation), got {noise}")
    if seed is not None:  # None: fresh entropy, as np.random.default_rng(None)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be a non-negative integer, got {type(seed).__name__} {seed!r}")
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=count)
    # Each image draws five uniforms in turn (scale, shear, the centre's row and column shift, stroke radius):
    # one (count, 5) draw takes the same doubles in the same order, and `low + (high - low) * u` is how
    # Generator.uniform makes each, so every image is bit-for-bit the one a per-image loop drew.
    u = rng.random((count, 5))
    scale = 1.45 + (2.0 - 1.45) * u[:, 0]
    shear = -0.35 + (0.35 - -0.35) * u[:, 1]
    centre_r = 7.5 + (-1.5 + (1.5 - -1.5) * u[:, 2])
    centre_c = 7.5 + (-1.5 + (1.5 - -1.5) * u[:, 3])
    width = 0.55 + (0.95 - 0.55) * u[:, 4]  # stroke radius in pixels
    images = np.zeros((count, SIZE, SIZE), dtype=np.float64)
    grid_r, grid_c = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    for digit in range(NUM_CLASSES):  # one glyph's images at a time, _CHUNK at a time
        pts = _ink_points(digit)
        which = np.flatnonzero(labels == digit)
        for start in range(0, which.size, _CHUNK):
            i = which[start:start + _CHUNK]
            # glyph (row, col) -> canvas: scale, shear columns by row, then shift the centre.
            rr = pts[None, :, 0] * scale[i, None] + centre_r[i, None]
            cc = (pts[None, :, 1] + shear[i, None] * pts[None, :, 0]) * scale[i, None] + centre_c[i, None]
            d2 = ((grid_r - rr[..., None, None]) ** 2 + (grid_c - cc[..., None, None]) ** 2).min(axis=1)
            # The nearest ink point's stroke is the brightest: exp and the division by 2w^2 > 0 keep order, so
            # exp of the least distance is the most of the per-point exps, with one exp per pixel instead of one
            # per pixel and point.
            with np.errstate(under="ignore"):  # far from the ink exp(-d2 / 2w^2) is below float64's range too: 0
                images[i] = np.exp(-d2 / (2 * width[i, None, None] ** 2))
    images += rng.normal(0.0, noise, size=images.shape)
    # Without noise, pixels far from the ink hold exp(-hundreds): below float32's range, so they become 0,
    # as intended; under np.seterr(all="raise") that cast would raise an underflow FloatingPointError.
    with np.errstate(under="ignore"):
        return images.reshape(count, SIZE * SIZE).astype(np.float32), labels.astype(np.int64)


def train_test_split(n_train: int = 8000, n_test: int = 2000, *, seed: int = 0):
    """Disjoint train and held-out sets drawn from different seeds (seed=None: fresh entropy for each, as the
    maker takes it; seed + 1_000_003 failed on None)."""
    x_train, y_train = make_digits(n_train, seed=seed)
    x_test, y_test = make_digits(n_test, seed=None if seed is None else seed + 1_000_003)
    return (x_train, y_train), (x_test, y_test)
