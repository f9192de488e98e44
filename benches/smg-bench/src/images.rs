//! Synthetic images for multimodal workloads, generated and encoded before
//! the run so that encoding never competes with sending.
//!
//! Each image is a seeded pattern (a colour gradient plus random 16×16 blocks)
//! so JPEG/PNG sizes are in the range of real photos rather than of flat or
//! pure-noise images, and two seeds never give the same bytes (the gateway
//! routes and caches images by content hash: `unique` must mean unique).
//! Images are referenced either as base64 `data:` URLs or as `file://` URLs
//! of files written to a directory the server is allowed to read.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use image::{ImageFormat as Codec, RgbImage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cli::{ImageFormat, ImageTransport, Resolution};
use crate::error::{SetupError, SetupResult};

/// Encodes one seeded image.
pub fn encode_image(
    resolution: Resolution,
    format: ImageFormat,
    seed: u64,
) -> SetupResult<Vec<u8>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (w, h) = (resolution.width, resolution.height);
    let base: [f32; 3] = [rng.random(), rng.random(), rng.random()];
    let blocks_x = w.div_ceil(16) as usize;
    let blocks_y = h.div_ceil(16) as usize;
    let block_colors: Vec<[u8; 3]> = (0..blocks_x * blocks_y)
        .map(|_| [rng.random(), rng.random(), rng.random()])
        .collect();
    let img = RgbImage::from_fn(w, h, |x, y| {
        let block = block_colors[(y as usize / 16) * blocks_x + x as usize / 16];
        let fx = x as f32 / w as f32;
        let fy = y as f32 / h as f32;
        let mut px = [0u8; 3];
        for (c, value) in px.iter_mut().enumerate() {
            let gradient = 255.0 * (base[c] * 0.5 + 0.25 * fx + 0.25 * fy);
            *value = ((gradient * 3.0 + f32::from(block[c])) / 4.0) as u8;
        }
        image::Rgb(px)
    });
    let codec = match format {
        ImageFormat::Jpeg => Codec::Jpeg,
        ImageFormat::Png => Codec::Png,
    };
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, codec)
        .map_err(|e| SetupError::Io(format!("encoding a {w}x{h} image: {e}")))?;
    Ok(out.into_inner())
}

/// Encodes `count` distinct images (seeds `seed..seed+count`) on all cores.
pub fn encode_images(
    count: usize,
    resolution: Resolution,
    format: ImageFormat,
    seed: u64,
) -> SetupResult<Vec<Vec<u8>>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(count.max(1));
    let mut slots: Vec<Option<SetupResult<Vec<u8>>>> = (0..count).map(|_| None).collect();
    std::thread::scope(|scope| {
        for (worker, chunk) in slots.chunks_mut(count.div_ceil(threads).max(1)).enumerate() {
            let first = worker * count.div_ceil(threads).max(1);
            scope.spawn(move || {
                for (offset, slot) in chunk.iter_mut().enumerate() {
                    let index = (first + offset) as u64;
                    *slot = Some(encode_image(resolution, format, seed.wrapping_add(index)));
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|slot| slot.unwrap_or_else(|| Err(SetupError::Io("image worker died".into()))))
        .collect()
}

/// A directory of generated image files, removed on drop when we created it.
#[derive(Debug)]
pub struct ImageDir {
    path: PathBuf,
    remove_on_drop: bool,
}

impl ImageDir {
    /// Uses `dir` (created if missing, kept afterwards) or a fresh temporary
    /// directory (removed on drop).
    pub fn open(dir: Option<&Path>) -> SetupResult<Self> {
        let (path, remove_on_drop) = match dir {
            Some(dir) => (dir.to_path_buf(), false),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or(0);
                let name = format!("smg-bench-images-{}-{nanos}", std::process::id());
                (std::env::temp_dir().join(name), true)
            }
        };
        std::fs::create_dir_all(&path)
            .map_err(|e| SetupError::Io(format!("creating {}: {e}", path.display())))?;
        let path = path
            .canonicalize()
            .map_err(|e| SetupError::Io(format!("resolving {}: {e}", path.display())))?;
        Ok(ImageDir {
            path,
            remove_on_drop,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ImageDir {
    fn drop(&mut self) {
        if self.remove_on_drop {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Turns encoded images into the URLs requests carry.
pub fn image_urls(
    images: &[Vec<u8>],
    format: ImageFormat,
    transport: ImageTransport,
    dir: Option<&ImageDir>,
    seed: u64,
) -> SetupResult<Vec<String>> {
    let (mime, ext) = match format {
        ImageFormat::Jpeg => ("image/jpeg", "jpg"),
        ImageFormat::Png => ("image/png", "png"),
    };
    images
        .iter()
        .enumerate()
        .map(|(i, bytes)| match (transport, dir) {
            (ImageTransport::DataUrl, _) => {
                Ok(format!("data:{mime};base64,{}", BASE64.encode(bytes)))
            }
            (ImageTransport::FileUrl, Some(dir)) => {
                let file = dir.path().join(format!("img-{seed}-{i}.{ext}"));
                std::fs::write(&file, bytes)
                    .map_err(|e| SetupError::Io(format!("writing {}: {e}", file.display())))?;
                Ok(format!("file://{}", file.display()))
            }
            (ImageTransport::FileUrl, None) => {
                Err(SetupError::Io("file URLs need an image directory".into()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn images_decode_at_the_requested_size_and_seeds_differ() {
        let res = Resolution {
            width: 64,
            height: 40,
        };
        for format in [ImageFormat::Jpeg, ImageFormat::Png] {
            let imgs = encode_images(3, res, format, 9).unwrap();
            assert_eq!(imgs.len(), 3);
            let decoded = image::load_from_memory(&imgs[0]).unwrap();
            assert_eq!((decoded.width(), decoded.height()), (64, 40));
            assert_ne!(imgs[0], imgs[1]);
            assert_eq!(imgs[1], encode_image(res, format, 10).unwrap(), "seeded");
        }
    }

    #[test]
    fn file_urls_point_at_written_files_and_the_temp_dir_is_removed() {
        let imgs = encode_images(
            2,
            Resolution {
                width: 8,
                height: 8,
            },
            ImageFormat::Png,
            1,
        )
        .unwrap();
        let dir = ImageDir::open(None).unwrap();
        let root = dir.path().to_path_buf();
        let urls = image_urls(
            &imgs,
            ImageFormat::Png,
            ImageTransport::FileUrl,
            Some(&dir),
            1,
        )
        .unwrap();
        let path = urls[1].strip_prefix("file://").unwrap();
        assert_eq!(std::fs::read(path).unwrap(), imgs[1]);
        drop(dir);
        assert!(!root.exists());
        let data = image_urls(&imgs, ImageFormat::Png, ImageTransport::DataUrl, None, 1).unwrap();
        assert!(data[0].starts_with("data:image/png;base64,iVBOR"));
    }
}
