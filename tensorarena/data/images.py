"""Generated RGB shape/pattern images: the embedded image classification set (nothing downloaded).

Ten classes of procedurally drawn pictures (see CLASS_NAMES): five shapes and five
full-frame patterns, each with a random position, scale, rotation, foreground and
background colour, pattern frequency/phase and pixel noise. Shapes are drawn from signed
distance functions with a one-pixel soft edge, so the same parameters give the same
picture at any resolution — 32x32 for quick runs, 224x224 for the models' native size.
Every sample is a pure function of (seed, count, size), rendered in fixed-size chunks so
memory stays bounded for large images.
"""

from __future__ import annotations

import numpy as np

NUM_CLASSES = 10
CLASS_NAMES = ("circle", "square", "triangle", "ring", "cross",
               "stripes-horizontal", "stripes-vertical", "stripes-diagonal", "checkerboard", "gradient")
MEAN = 0.5  # images are drawn in [0, 1] (plus noise) and returned as (x - MEAN) / STD
STD = 0.5
_CHUNK = 128  # images rendered at once: bounds the (chunk, S, S) temporaries at 224x224 to ~25 MB each


def _draw_params(rng: np.random.Generator, labels: np.ndarray) -> dict[str, np.ndarray]:
    """All random parameters, drawn up front so a sample does not depend on chunking."""
    n = len(labels)
    # Dark background, light foreground (random hues): the contrast polarity is fixed, so an edge
    # looks the same in every image and a small model learns the shapes in tens of steps.
    bg = rng.uniform(0.0, 0.4, size=(n, 3))
    fg = rng.uniform(0.6, 1.0, size=(n, 3))
    # Stripe orientation per class: near 0, near 90 degrees, or near +-45 degrees.
    angle = rng.uniform(-np.pi / 12, np.pi / 12, size=n)
    angle = np.where(labels == 6, angle + np.pi / 2, angle)
    angle = np.where(labels == 7, angle + rng.choice([np.pi / 4, -np.pi / 4], size=n), angle)
    rotation = rng.uniform(0.0, 2 * np.pi, size=n)
    return {
        "bg": bg.astype(np.float32), "fg": fg.astype(np.float32),
        # Patterns fill the frame (centre 0); shapes move around.
        "cx": np.where(labels >= 5, 0.0, rng.uniform(-0.35, 0.35, size=n)),
        "cy": np.where(labels >= 5, 0.0, rng.uniform(-0.35, 0.35, size=n)),
        "radius": rng.uniform(0.3, 0.55, size=n),
        "rotation": np.where(labels >= 5, angle, rotation),
        "freq": rng.uniform(2.0, 4.5, size=n),  # stripe / checker cycles across the image
        "phase": rng.uniform(0.0, 2 * np.pi, size=n),
        "noise": rng.uniform(0.02, 0.12, size=n).astype(np.float32),
    }


def _coverage(label: int, a: np.ndarray, b: np.ndarray, p: dict, pixel: float) -> np.ndarray:
    """Foreground coverage in [0, 1] for one class. a, b: (n, S, S) rotated coordinates; p: (n,) params."""
    r = p["radius"][:, None, None]
    if label == 0:  # circle
        sdf = np.sqrt(a * a + b * b) - r
    elif label == 1:  # square (Chebyshev distance; exact enough for a one-pixel soft edge)
        sdf = np.maximum(np.abs(a), np.abs(b)) - 0.8 * r
    elif label == 2:  # equilateral triangle: max of three half-plane distances
        sdf = np.maximum(np.maximum(b, -0.866 * a - 0.5 * b), 0.866 * a - 0.5 * b) - 0.6 * r
    elif label == 3:  # ring
        sdf = np.abs(np.sqrt(a * a + b * b) - r) - 0.22 * r
    elif label == 4:  # plus-shaped cross
        w = 0.25 * r
        sdf = np.minimum(np.maximum(np.abs(a) - r, np.abs(b) - w), np.maximum(np.abs(a) - w, np.abs(b) - r))
    elif label in (5, 6, 7):  # stripes: a square wave along the rotated b axis, edges one pixel soft
        wave = np.sin(np.pi * p["freq"][:, None, None] * b + p["phase"][:, None, None])
        return np.clip(0.5 + wave / (np.pi * p["freq"][:, None, None] * pixel), 0.0, 1.0)
    elif label == 8:  # checkerboard
        f = np.pi * p["freq"][:, None, None]
        wave = np.sin(f * a + p["phase"][:, None, None]) * np.sin(f * b)
        return np.clip(0.5 + wave / (f * pixel), 0.0, 1.0)
    else:  # linear gradient across the whole frame in a random direction
        return np.clip(0.5 + 0.6 * (np.cos(p["phase"])[:, None, None] * a + np.sin(p["phase"])[:, None, None] * b),
                       0.0, 1.0)
    return np.clip(0.5 - sdf / pixel, 0.0, 1.0)


def make_images(count: int, *, size: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` images (count, 3, size, size) float32, normalised ((x - 0.5) / 0.5), and labels (count,) int64."""
    for name, value in (("count", count), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    # Every sample is a pure function of the seed (the noise chunks are seeded with [seed, chunk]), so it must
    # be an int that np.random.default_rng takes: None or a negative one used to fail deep inside numpy.
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative integer, got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    if size < 8:
        raise ValueError(f"size must be at least 8 pixels to draw the shapes, got {size}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=count).astype(np.int64)
    params = _draw_params(rng, labels)
    images = np.empty((count, 3, size, size), dtype=np.float32)
    grid = ((np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0)  # pixel centres in [-1, 1]
    pixel = 2.0 / size
    for begin in range(0, count, _CHUNK):
        end = min(begin + _CHUNK, count)
        # Noise depends on (seed, chunk) only. Not [seed, begin]: a SeedSequence drops trailing zeros, so chunk 0's
        # noise was `rng`'s own stream, the labels' draws again (a helper's hunt).
        chunk_rng = np.random.default_rng([seed, begin, 1])
        for label in np.unique(labels[begin:end]):
            idx = begin + np.flatnonzero(labels[begin:end] == label)
            p = {k: v[idx] for k, v in params.items()}
            cos, sin = np.cos(p["rotation"]).astype(np.float32), np.sin(p["rotation"]).astype(np.float32)
            dx = grid[None, None, :] - p["cx"].astype(np.float32)[:, None, None]  # (n, 1, S)
            dy = grid[None, :, None] - p["cy"].astype(np.float32)[:, None, None]  # (n, S, 1)
            a = cos[:, None, None] * dx + sin[:, None, None] * dy  # (n, S, S)
            b = cos[:, None, None] * dy - sin[:, None, None] * dx
            cover = _coverage(int(label), a, b, p, pixel).astype(np.float32)
            bg, fg = p["bg"][:, :, None, None], p["fg"][:, :, None, None]
            images[idx] = bg + cover[:, None] * (fg - bg)  # (n, 3, S, S)
        noise = chunk_rng.standard_normal((end - begin, 3, size, size), dtype=np.float32)
        images[begin:end] += noise * params["noise"][begin:end, None, None, None]
        images[begin:end] -= MEAN
        images[begin:end] *= 1.0 / STD
    return images, labels


def train_test_split(n_train: int = 2048, n_test: int = 512, *, size: int = 32, seed: int = 0):
    """Disjoint train and held-out sets drawn from different seeds."""
    x_train, y_train = make_images(n_train, size=size, seed=seed)
    x_test, y_test = make_images(n_test, size=size, seed=seed + 1_000_003)
    return (x_train, y_train), (x_test, y_test)
