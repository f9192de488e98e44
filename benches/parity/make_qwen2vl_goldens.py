#!/usr/bin/env python3
"""Golden outputs of Hugging Face's Qwen2-VL image processor, for smg's parity test.

Why this exists: the data plane re-implements `Qwen2VLImageProcessor` (decode,
PIL-style bicubic resize, rescale, normalize, patchify) in Rust. The test
`dataplane/tests/hf_parity.rs` compares its output with what this script records
from the real processor, so a drift from Hugging Face shows up as a test failure
rather than as a quietly worse model.

Setup (no torch needed; HF falls back to its numpy processor):

    python3 -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install transformers==4.57.6 pillow==13.0.0 numpy==2.4.6

Run from the repository root:

    /tmp/hfvenv/bin/python benches/parity/make_qwen2vl_goldens.py    # missing images + goldens
    /tmp/hfvenv/bin/python benches/parity/make_qwen2vl_goldens.py --goldens-only
    /tmp/hfvenv/bin/python benches/parity/make_qwen2vl_goldens.py --rewrite-images

The fixture images are drawn deterministically (numpy's legacy RandomState) and
written to `dataplane/tests/fixtures/images/` when missing (all of them with
`--rewrite-images`); the goldens are always computed from the committed image
files, so a different libjpeg or libwebp build can change the images' bytes on
a rewrite but never makes goldens disagree with the images beside them. Use
`--goldens-only` to refresh goldens for the committed images.

What a golden holds, per (image, processor settings) case:
- `shape`, `image_grid_thw`: exact.
- `sum`, `abs_sum`: float64 sums over the whole `pixel_values` tensor.
- `samples`: 64 `[row, col, value]` triples at seeded positions.
- `decoded_rgb_u8_sum` / `resized_rgb_u8_fingerprint`: checksums of PIL's RGB
  image before and after its bicubic resize, so the Rust side can tell a
  decoder difference from a resampler difference.
- `full_f32_le_base64`: the whole tensor (little-endian f32) for the two
  smallest cases.

The processor is loaded from `tests/fixtures/model` (Qwen2-VL's real
preprocessor_config.json); some cases override settings at call time (a
deployment-style `max_pixels`, and Qwen3-VL's patch 16 / mean 0.5) to exercise
the antialiasing downscale and the 1536-wide layout.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image, features
from transformers import AutoImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "tests" / "fixtures" / "model"
IMAGE_DIR = ROOT / "dataplane" / "tests" / "fixtures" / "images"
GOLDENS = ROOT / "dataplane" / "tests" / "fixtures" / "qwen2vl_goldens.json"

SAMPLES_PER_CASE = 64
FULL_TENSOR_CASES = 2

# Call-time overrides (HF `preprocess(**kwargs)` names).
DEPLOYMENT_MAX_PIXELS = {"max_pixels": 256 * 28 * 28}
QWEN3_STYLE = {
    "patch_size": 16,
    "min_pixels": 65536,
    "max_pixels": 16777216,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


# ---------------------------------------------------------------- fixtures --


def photo_like(width: int, height: int, seed: int, noise: float) -> np.ndarray:
    """A smooth scene with edges and mild noise: gradients, a few discs, stripes."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    r = 40 + 170 * u + 30 * np.sin(6.0 * v)
    g = 30 + 150 * v + 40 * np.cos(5.0 * u + 1.0)
    b = 200 - 120 * u * v + 25 * np.sin(9.0 * (u + v))
    img = np.stack([r, g, b], axis=-1)
    for _ in range(6):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rad = rng.uniform(0.05, 0.25) * min(width, height)
        color = rng.uniform(0, 255, size=3)
        inside = (x - cx) ** 2 + (y - cy) ** 2 < rad**2
        img[inside] = 0.35 * img[inside] + 0.65 * color
    stripes = (np.floor(x / max(width / 40.0, 1.0)) % 2 == 0) & (v > 0.8)
    img[stripes] *= 0.6
    img += rng.normal(0.0, noise, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_fixtures(rewrite: bool) -> None:
    """Writes the fixture images that are missing (all of them with `rewrite`)."""
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    drawn = set()
    for name, draw in FIXTURES.items():
        path = IMAGE_DIR / name
        if (rewrite or not path.exists()) and draw not in drawn:
            draw(path)
            drawn.add(draw)
            print(f"drew {path.relative_to(ROOT)} (with {draw.__name__})")


def draw_original_fixtures() -> None:
    """The first fixture set, drawn in one go (kept for byte-identical re-runs)."""
    Image.fromarray(photo_like(333, 517, seed=1, noise=2.0)).save(IMAGE_DIR / "odd_333x517.png")

    rng = np.random.RandomState(2)
    tiny = rng.randint(0, 256, size=(20, 20, 3)).astype(np.uint8)
    Image.fromarray(tiny).save(IMAGE_DIR / "tiny_20x20.png")

    gray = photo_like(257, 193, seed=3, noise=1.5).mean(axis=-1).astype(np.uint8)
    Image.fromarray(gray, mode="L").save(IMAGE_DIR / "gray_257x193.png")

    # Alpha varies and fully transparent pixels keep vivid colours: a converter
    # that composites on white (instead of dropping alpha, as PIL does) fails.
    rgb = photo_like(150, 100, seed=4, noise=1.0)
    yy, xx = np.mgrid[0:100, 0:150]
    alpha = np.clip(xx * 255 // 149, 0, 255).astype(np.uint8)
    alpha[(yy // 10 + xx // 10) % 3 == 0] = 0
    Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA").save(IMAGE_DIR / "rgba_150x100.png")

    Image.fromarray(photo_like(300, 2400, seed=5, noise=2.0)).save(
        IMAGE_DIR / "panorama_300x2400.jpg", quality=85
    )
    Image.fromarray(photo_like(640, 480, seed=6, noise=4.0)).save(
        IMAGE_DIR / "photo_640x480.jpg", quality=90
    )
    Image.fromarray(photo_like(1920, 1080, seed=7, noise=3.0)).save(
        IMAGE_DIR / "photo_1920x1080.jpg", quality=85
    )
    Image.fromarray(photo_like(320, 240, seed=8, noise=2.0)).save(
        IMAGE_DIR / "lossy_320x240.webp", quality=80
    )

    # 16-bit grayscale: PIL opens it as "I;16" and convert("RGB") clips at 255
    # instead of scaling; values stay small so the clip and the rest both show.
    g16 = (np.arange(40 * 48).reshape(40, 48) * 7 % 400).astype(np.uint16)
    Image.fromarray(g16).save(IMAGE_DIR / "gray16_48x40.png")

    pal = Image.fromarray(photo_like(97, 61, seed=9, noise=0.0)).quantize(colors=32, dither=0)
    pal.save(IMAGE_DIR / "palette_97x61.png")


def exif_orientation(value: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = value  # Orientation
    return exif


def draw_exif_rotated(path: Path) -> None:
    # Orientation 6 ("rotate 90 CW to view"): HF's processor, given the PIL
    # image, does not apply it, so the tensor follows the stored 200x120.
    Image.fromarray(photo_like(200, 120, seed=10, noise=2.0)).save(
        path, quality=90, exif=exif_orientation(6)
    )


def draw_gray_jpeg(path: Path) -> None:
    gray = photo_like(211, 157, seed=11, noise=2.0).mean(axis=-1).astype(np.uint8)
    Image.fromarray(gray, mode="L").save(path, quality=88)


def draw_cmyk_jpeg(path: Path) -> None:
    # Pillow writes CMYK JPEGs with an Adobe marker, inverted, and reads every
    # 4-component JPEG back as inverted CMYK.
    Image.fromarray(photo_like(120, 90, seed=12, noise=2.0)).convert("CMYK").save(path, quality=90)


def draw_progressive_odd_jpeg(path: Path) -> None:
    # Odd sides with 4:2:0 chroma exercise the upsampler's edge handling.
    Image.fromarray(photo_like(333, 517, seed=13, noise=3.0)).save(
        path, quality=85, progressive=True
    )


def draw_422_jpeg(path: Path) -> None:
    Image.fromarray(photo_like(301, 203, seed=14, noise=3.0)).save(path, quality=92, subsampling=1)


def draw_444_jpeg(path: Path) -> None:
    Image.fromarray(photo_like(161, 97, seed=15, noise=3.0)).save(path, quality=95, subsampling=0)


def draw_tiny_jpeg(path: Path) -> None:
    rng = np.random.RandomState(16)
    Image.fromarray(rng.randint(0, 256, size=(7, 9, 3)).astype(np.uint8)).save(path, quality=75)


def draw_transparent_png(path: Path) -> None:
    # Fully transparent everywhere, colours still there: PIL's convert("RGB")
    # keeps them, so the tensor is of the colours, not of white or black.
    rgb = photo_like(64, 48, seed=17, noise=1.0)
    Image.fromarray(np.dstack([rgb, np.zeros((48, 64), np.uint8)]), mode="RGBA").save(path)


def drawn_once(path: Path) -> None:
    draw_original_fixtures()


FIXTURES = {
    **{
        name: drawn_once
        for name in [
            "odd_333x517.png",
            "tiny_20x20.png",
            "gray_257x193.png",
            "rgba_150x100.png",
            "panorama_300x2400.jpg",
            "photo_640x480.jpg",
            "photo_1920x1080.jpg",
            "lossy_320x240.webp",
            "gray16_48x40.png",
            "palette_97x61.png",
        ]
    },
    "exif_rot90_200x120.jpg": draw_exif_rotated,
    "gray_211x157.jpg": draw_gray_jpeg,
    "cmyk_120x90.jpg": draw_cmyk_jpeg,
    "progressive_333x517.jpg": draw_progressive_odd_jpeg,
    "subsampled_422_301x203.jpg": draw_422_jpeg,
    "full_chroma_444_161x97.jpg": draw_444_jpeg,
    "tiny_9x7.jpg": draw_tiny_jpeg,
    "transparent_64x48.png": draw_transparent_png,
}


# ----------------------------------------------------------------- goldens --


CASES = [
    # (name, file, overrides)
    ("tiny_20x20", "tiny_20x20.png", {}),
    ("gray16_48x40", "gray16_48x40.png", {}),
    ("palette_97x61", "palette_97x61.png", {}),
    ("rgba_150x100", "rgba_150x100.png", {}),
    ("gray_257x193", "gray_257x193.png", {}),
    ("odd_333x517", "odd_333x517.png", {}),
    ("odd_333x517_qwen3_style", "odd_333x517.png", QWEN3_STYLE),
    ("lossy_320x240_webp", "lossy_320x240.webp", {}),
    ("photo_640x480", "photo_640x480.jpg", {}),
    ("panorama_300x2400", "panorama_300x2400.jpg", {}),
    ("photo_1920x1080", "photo_1920x1080.jpg", {}),
    ("photo_1920x1080_max_pixels_200704", "photo_1920x1080.jpg", DEPLOYMENT_MAX_PIXELS),
    ("odd_333x517_max_pixels_50176", "odd_333x517.png", {"max_pixels": 64 * 28 * 28}),
    ("exif_rot90_200x120", "exif_rot90_200x120.jpg", {}),
    ("gray_jpeg_211x157", "gray_211x157.jpg", {}),
    ("cmyk_jpeg_120x90", "cmyk_120x90.jpg", {}),
    ("progressive_333x517", "progressive_333x517.jpg", {}),
    ("subsampled_422_301x203", "subsampled_422_301x203.jpg", {}),
    ("full_chroma_444_161x97", "full_chroma_444_161x97.jpg", {}),
    ("tiny_jpeg_9x7", "tiny_9x7.jpg", {}),
    ("transparent_64x48", "transparent_64x48.png", {}),
]


def u8_fingerprint(arr: np.ndarray) -> int:
    """sum(v * (i % 251 + 1)) over the flattened HWC uint8 array: order-sensitive."""
    flat = arr.reshape(-1).astype(np.int64)
    weights = np.arange(flat.size, dtype=np.int64) % 251 + 1
    return int((flat * weights).sum())


def golden_for(processor, name: str, file: str, overrides: dict) -> dict:
    path = IMAGE_DIR / file
    image = Image.open(path)
    mode = image.mode
    out = processor(images=image, return_tensors="np", **overrides)
    pixel_values = np.asarray(out["pixel_values"])
    assert pixel_values.dtype == np.float32, pixel_values.dtype
    grid = [int(v) for v in np.asarray(out["image_grid_thw"])[0]]

    # PIL's view of the same pipeline, for attributing differences.
    patch = overrides.get("patch_size", processor.patch_size)
    merge = overrides.get("merge_size", processor.merge_size)
    min_pixels = overrides.get("min_pixels", processor.min_pixels)
    max_pixels = overrides.get("max_pixels", processor.max_pixels)
    rgb = Image.open(path).convert("RGB")
    h, w = smart_resize(rgb.height, rgb.width, patch * merge, min_pixels, max_pixels)
    resized = np.asarray(rgb.resize((w, h), resample=Image.BICUBIC))
    assert grid == [1, h // patch, w // patch], (grid, h, w)

    rng = np.random.RandomState(zlib.crc32(name.encode()))
    rows = rng.randint(0, pixel_values.shape[0], size=SAMPLES_PER_CASE)
    cols = rng.randint(0, pixel_values.shape[1], size=SAMPLES_PER_CASE)
    samples = [[int(r), int(c), float(pixel_values[r, c])] for r, c in zip(rows, cols)]

    return {
        "name": name,
        "file": f"images/{file}",
        "overrides": overrides,
        "pil_mode": mode,
        "source_size": [image.width, image.height],
        "resized_size": [w, h],
        "shape": list(pixel_values.shape),
        "image_grid_thw": grid,
        "sum": float(pixel_values.astype(np.float64).sum()),
        "abs_sum": float(np.abs(pixel_values.astype(np.float64)).sum()),
        "decoded_rgb_u8_sum": int(np.asarray(rgb).astype(np.int64).sum()),
        "resized_rgb_u8_fingerprint": u8_fingerprint(resized),
        "samples": samples,
        "_tensor": pixel_values,
    }


def write_goldens() -> None:
    processor = AutoImageProcessor.from_pretrained(str(MODEL_DIR), use_fast=False)
    if type(processor).__name__ != "Qwen2VLImageProcessor":
        sys.exit(f"expected Qwen2VLImageProcessor, got {type(processor).__name__}")

    cases = [golden_for(processor, *case) for case in CASES]
    for case in sorted(cases, key=lambda c: c["_tensor"].size)[:FULL_TENSOR_CASES]:
        raw = case["_tensor"].astype("<f4").tobytes()
        case["full_f32_le_base64"] = base64.b64encode(raw).decode("ascii")
    for case in cases:
        del case["_tensor"]

    doc = {
        "generated_by": "benches/parity/make_qwen2vl_goldens.py",
        "processor": type(processor).__name__,
        "model_dir": "tests/fixtures/model",
        "versions": {
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
            "numpy": np.__version__,
            "libjpeg_turbo": features.version("libjpeg_turbo"),
            "libwebp": features.version("webp"),
        },
        "cases": cases,
    }
    GOLDENS.write_text(json.dumps(doc, indent=1) + "\n")
    for case in cases:
        print(f"{case['name']:40s} {case['pil_mode']:5s} shape={case['shape']} grid={case['image_grid_thw']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goldens-only", action="store_true", help="write no image")
    parser.add_argument(
        "--rewrite-images", action="store_true", help="redraw every image, not only missing ones"
    )
    args = parser.parse_args()
    if not args.goldens_only:
        write_fixtures(args.rewrite_images)
    write_goldens()


if __name__ == "__main__":
    main()
