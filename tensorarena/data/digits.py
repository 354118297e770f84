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
    images = np.zeros((count, SIZE, SIZE), dtype=np.float64)
    grid_r, grid_c = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    for i, digit in enumerate(labels):
        pts = _ink_points(int(digit))
        scale = rng.uniform(1.45, 2.0)
        shear = rng.uniform(-0.35, 0.35)
        # glyph (row, col) -> canvas: scale, shear columns by row, then shift the centre.
        rr = pts[:, 0] * scale
        cc = (pts[:, 1] + shear * pts[:, 0]) * scale
        centre = np.array([7.5, 7.5]) + rng.uniform(-1.5, 1.5, size=2)
        rr += centre[0]
        cc += centre[1]
        width = rng.uniform(0.55, 0.95)  # stroke radius in pixels
        d2 = (grid_r[None] - rr[:, None, None]) ** 2 + (grid_c[None] - cc[:, None, None]) ** 2
        with np.errstate(under="ignore"):  # far from the ink exp(-d2 / 2w^2) is below float64's range too: 0
            images[i] = np.exp(-d2 / (2 * width**2)).max(axis=0)
    images += rng.normal(0.0, noise, size=images.shape)
    # Without noise, pixels far from the ink hold exp(-hundreds): below float32's range, so they become 0,
    # as intended; under np.seterr(all="raise") that cast would raise an underflow FloatingPointError.
    with np.errstate(under="ignore"):
        return images.reshape(count, SIZE * SIZE).astype(np.float32), labels.astype(np.int64)


def train_test_split(n_train: int = 8000, n_test: int = 2000, *, seed: int = 0):
    """Disjoint train and held-out sets drawn from different seeds."""
    x_train, y_train = make_digits(n_train, seed=seed)
    x_test, y_test = make_digits(n_test, seed=seed + 1_000_003)
    return (x_train, y_train), (x_test, y_test)
