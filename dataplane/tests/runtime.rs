//! The data-plane runtime on real threads, real io_uring and real files:
//! round trips, file reads and their refusals, images, many submitters,
//! backpressure, cancellation and shutdown — each in both loop backends
//! (io_uring and the plain fallback).

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use smg_dataplane::preprocess::{ImageLimits, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_dataplane::runtime::testing::{self, HoldHandle};
use smg_dataplane::runtime::{
    ActiveBackend, DataPlane, DataPlaneConfig, Destination, FileReadError, IoBackend, JobError,
    Output, Work,
};
use smg_shared::tensor::DType;

/// Every test's upper bound: a hang fails the test instead of the suite.
const DEADLINE: Duration = Duration::from_secs(30);

const BACKENDS: [IoBackend; 2] = [IoBackend::Uring, IoBackend::Plain];

fn start(io: IoBackend, configure: impl FnOnce(&mut DataPlaneConfig)) -> DataPlane {
    let mut config = DataPlaneConfig {
        io,
        ..DataPlaneConfig::default()
    };
    configure(&mut config);
    let dataplane = DataPlane::start(config).expect("data plane starts");
    let expected = match io {
        IoBackend::Plain => ActiveBackend::Plain,
        _ => ActiveBackend::Uring,
    };
    assert_eq!(dataplane.backend(), expected);
    dataplane
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("finished within the deadline")
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name)
}

#[tokio::test]
async fn auto_picks_io_uring_here_and_plain_can_be_forced() {
    let auto = DataPlane::start(DataPlaneConfig::default()).expect("starts");
    // These machines run io_uring (see the design notes); Auto must use it.
    assert_eq!(auto.backend(), ActiveBackend::Uring);
    within(auto.ping()).await.expect("pong");
    let plain = start(IoBackend::Plain, |_| {});
    within(plain.ping()).await.expect("pong");
}

#[tokio::test]
async fn many_submitters_get_every_answer_exactly_once() {
    for io in BACKENDS {
        let dataplane = start(io, |config| {
            config.threads = 2;
            config.ring_capacity = 4;
            config.submit_wait = Duration::from_secs(20);
        });
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let dataplane = dataplane.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        dataplane.ping().await.expect("pong");
                    }
                })
            })
            .collect();
        for task in tasks {
            within(task).await.expect("submitter task");
        }
        let completed: u64 = dataplane.stats().iter().map(|s| s.completed).sum();
        assert_eq!(completed, 32 * 50, "{io:?}");
    }
}

#[tokio::test]
async fn reads_files_and_hashes_them() {
    let dir = tempfile::tempdir().unwrap();
    // Several megabytes with a pattern, so short reads and offsets matter.
    let big: Vec<u8> = (0..5_000_003u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    std::fs::write(dir.path().join("small.png"), b"small").unwrap();
    for io in BACKENDS {
        let dataplane = start(io, |_| {});
        let read = within(dataplane.read_file(dir.path().join("big.bin"), 8 << 20))
            .await
            .expect("read");
        assert!(read.bytes == big, "{io:?}: the exact bytes");
        assert_eq!(read.content_hash, *blake3::hash(&big).as_bytes());
        let small = within(dataplane.read_file(dir.path().join("small.png"), 5))
            .await
            .expect("exactly at the cap");
        assert_eq!(small.bytes.as_ref(), b"small");
    }
}

#[tokio::test]
async fn refuses_what_is_not_a_readable_regular_file_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("big.bin"), vec![1u8; 4096]).unwrap();
    std::fs::write(path("empty.png"), b"").unwrap();
    symlink(path("big.bin"), path("link.png")).unwrap();
    std::fs::create_dir(path("sub")).unwrap();
    let fifo = std::ffi::CString::new(path("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a valid C path; creates a FIFO nobody writes to.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    for io in BACKENDS {
        let dataplane = start(io, |_| {});
        let cases = [
            ("missing.png", 1 << 20, FileReadError::NotFound),
            (
                "big.bin",
                4095,
                FileReadError::TooLarge {
                    len: 4096,
                    max_bytes: 4095,
                },
            ),
            ("empty.png", 1 << 20, FileReadError::Empty),
            ("link.png", 1 << 20, FileReadError::Symlink),
            ("sub", 1 << 20, FileReadError::NotRegular),
            // Opened without blocking, refused before any read: a FIFO never
            // stalls the core.
            ("fifo", 1 << 20, FileReadError::NotRegular),
        ];
        for (name, cap, expected) in cases {
            match within(dataplane.read_file(path(name), cap)).await {
                Err(JobError::File(error)) => assert_eq!(error, expected, "{io:?} {name}"),
                other => panic!("{io:?} {name}: {other:?}"),
            }
        }
        // The core still serves afterwards.
        within(dataplane.ping()).await.expect("pong");
    }
}

fn processor() -> Arc<Qwen2VlImageProcessor> {
    let config = VisionPreprocessConfig::from_model_dir(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model"),
    )
    .unwrap();
    Arc::new(Qwen2VlImageProcessor::new(config, ImageLimits::default()).unwrap())
}

#[tokio::test]
async fn images_come_back_exactly_as_the_kernel_writes_them_and_bad_ones_fail_cleanly() {
    let processor = processor();
    let good = Bytes::from(std::fs::read(fixture("palette_97x61.png")).unwrap());
    let photo = Bytes::from(std::fs::read(fixture("photo_640x480.jpg")).unwrap());
    let expected = processor.preprocess(&good, DType::BFloat16).unwrap();
    let corrupt = {
        let mut bytes = std::fs::read(fixture("odd_333x517.png")).unwrap();
        bytes.truncate(bytes.len() / 3);
        Bytes::from(bytes)
    };
    for io in BACKENDS {
        let dataplane = start(io, |_| {});
        let run = |bytes: Bytes| {
            dataplane.preprocess_image(
                Arc::clone(&processor),
                bytes,
                DType::BFloat16,
                Destination::Inline,
            )
        };
        let image = within(run(good.clone())).await.expect("preprocessed");
        assert_eq!(image.plan, expected.plan);
        assert!(image.data == expected.data, "{io:?}: the same tensor bytes");
        for bad in [corrupt.clone(), Bytes::from_static(b"hello, not an image")] {
            let error = within(run(bad)).await.expect_err("refused");
            assert!(
                matches!(error, JobError::Image(_)),
                "{io:?}: an image error, not a runtime failure: {error:?}"
            );
        }
        let again = within(run(good.clone())).await.expect("still serving");
        assert!(again.data == expected.data);
        // The core's scratch buffers, grown for a larger image and reused
        // for a smaller one, leave no trace in either tensor.
        for (name, bytes) in [("photo", &photo), ("palette", &good)] {
            let want = processor.preprocess(bytes, DType::BFloat16).unwrap();
            let got = within(run(bytes.clone())).await.expect(name);
            assert!(got.data == want.data, "{io:?}: {name} after reuse");
        }
    }
}

#[tokio::test]
async fn decodes_inline_base64_on_a_core_and_hashes_it() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use smg_dataplane::runtime::Base64Error;

    let image: Vec<u8> = (0..300_007u32).map(|i| (i * 13 % 251) as u8).collect();
    let encoded = Bytes::from(STANDARD.encode(&image));
    for io in BACKENDS {
        let dataplane = start(io, |_| {});
        let decoded = within(dataplane.decode_base64(encoded.clone(), image.len()))
            .await
            .expect("decoded");
        assert!(decoded.bytes == image, "{io:?}: the exact bytes");
        assert_eq!(decoded.content_hash, *blake3::hash(&image).as_bytes());
        let mut spoiled = encoded.to_vec();
        spoiled[200_001] = b'*';
        let error = within(dataplane.decode_base64(Bytes::from(spoiled), image.len()))
            .await
            .expect_err("refused");
        assert_eq!(error.code(), "invalid_base64");
        assert!(
            matches!(
                error,
                JobError::Base64(Base64Error::InvalidByte {
                    offset: 200_001,
                    byte: '*'
                })
            ),
            "{io:?}: {error:?}"
        );
        let over = within(dataplane.decode_base64(encoded.clone(), image.len() - 1))
            .await
            .expect_err("over the cap");
        assert!(matches!(
            over,
            JobError::Base64(Base64Error::TooLarge { .. })
        ));
        within(dataplane.ping()).await.expect("still serving");
    }
}

/// Polls `future` once and hands it back still pending. A submit pushes
/// its job onto a ring in its first poll, so afterwards the job is queued
/// (or the submitter waits for room).
async fn queued<F: Future + ?Sized>(mut future: Pin<Box<F>>) -> Pin<Box<F>> {
    std::future::poll_fn(|cx| {
        assert!(
            future.as_mut().poll(cx).is_pending(),
            "the job waits behind the hold"
        );
        Poll::Ready(())
    })
    .await;
    future
}

/// A job's result, still to come.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<Output, JobError>> + 'a>>;

/// Submits a hold and waits until a core runs it.
async fn hold_a_core(
    dataplane: &DataPlane,
) -> (
    tokio::task::JoinHandle<Result<Output, JobError>>,
    HoldHandle,
) {
    let (job, mut handle) = testing::hold();
    let running = tokio::spawn({
        let dataplane = dataplane.clone();
        async move { dataplane.submit(Work::Hold(job)).await }
    });
    assert!(within(handle.started()).await, "a core runs the hold");
    (running, handle)
}

#[tokio::test]
async fn a_full_ring_waits_for_room_then_fails_busy() {
    for io in BACKENDS {
        let dataplane = start(io, |config| {
            config.ring_capacity = 2;
            config.submit_wait = Duration::from_millis(100);
        });
        // One job holds the core; two fill its ring.
        let (hold, handle) = hold_a_core(&dataplane).await;
        let queued_pings = [
            queued(Box::pin(dataplane.ping())).await,
            queued(Box::pin(dataplane.ping())).await,
        ];
        match within(dataplane.ping()).await {
            Err(error @ JobError::Busy { .. }) => assert_eq!(error.code(), "dataplane_busy"),
            other => panic!("{io:?}: expected busy, got {other:?}"),
        }
        handle.release();
        assert!(matches!(within(hold).await.unwrap(), Ok(Output::Pong)));
        for ping in queued_pings {
            within(ping).await.expect("queued jobs run");
        }
        within(dataplane.ping()).await.expect("room again");
    }
}

#[tokio::test]
async fn a_submitter_waiting_for_room_gets_in_once_the_core_takes_a_job() {
    for io in BACKENDS {
        let dataplane = start(io, |config| {
            config.ring_capacity = 2;
            config.submit_wait = DEADLINE;
        });
        let (hold, handle) = hold_a_core(&dataplane).await;
        let queued_pings = [
            queued(Box::pin(dataplane.ping())).await,
            queued(Box::pin(dataplane.ping())).await,
        ];
        // The ring is full: this one waits for room.
        let patient = queued(Box::pin(dataplane.ping())).await;
        handle.release();
        within(patient).await.expect("got in once room appeared");
        assert!(matches!(within(hold).await.unwrap(), Ok(Output::Pong)));
        for ping in queued_pings {
            within(ping).await.expect("queued jobs run");
        }
        assert_eq!(dataplane.stats()[0].completed, 4, "{io:?}");
    }
}

#[tokio::test]
async fn abandoned_jobs_are_skipped() {
    for io in BACKENDS {
        let dataplane = start(io, |_| {});
        let (hold, handle) = hold_a_core(&dataplane).await;
        for _ in 0..3 {
            // Queued behind the hold, then given up on.
            drop(queued(Box::pin(dataplane.ping())).await);
        }
        handle.release();
        within(hold).await.unwrap().expect("hold");
        within(dataplane.ping()).await.expect("pong");
        let stats = dataplane.stats();
        assert_eq!(stats[0].skipped_cancelled, 3, "{io:?}: {stats:?}");
        assert_eq!(stats[0].completed, 2, "{io:?}: the hold and the last ping");
    }
}

#[tokio::test]
async fn shutdown_finishes_the_running_job_fails_the_queued_ones_and_joins() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), vec![9u8; 1 << 20]).unwrap();
    for io in BACKENDS {
        let dataplane = start(io, |config| {
            config.threads = 1;
            config.ring_capacity = 4;
            config.submit_wait = DEADLINE;
        });
        let (running, handle) = hold_a_core(&dataplane).await;
        // Four jobs fill the ring behind the hold.
        let mut queued_jobs: Vec<Pending<'_>> = Vec::new();
        for k in 0..4 {
            let dataplane = dataplane.clone();
            let path = dir.path().join("a.bin");
            let job: Pending<'_> = if k % 2 == 0 {
                Box::pin(async move { dataplane.ping().await.map(|()| Output::Pong) })
            } else {
                Box::pin(async move { dataplane.read_file(path, 2 << 20).await.map(Output::File) })
            };
            queued_jobs.push(queued(job).await);
        }
        // The ring is full, so this one waits for room; nothing but the
        // shutdown can wake it while the core is held.
        let patient = queued(Box::pin(dataplane.ping())).await;
        let stopper = {
            let dataplane = dataplane.clone();
            tokio::task::spawn_blocking(move || dataplane.shutdown())
        };
        // The shutdown closes the ring, then wakes the waiting submitter,
        // which is refused: from here on the ring is closed.
        assert!(
            matches!(within(patient).await, Err(JobError::ShuttingDown)),
            "{io:?}: a submitter waiting for room learns of the shutdown"
        );
        handle.release();
        assert!(
            matches!(within(running).await.unwrap(), Ok(Output::Pong)),
            "{io:?}: the running job completes"
        );
        for job in queued_jobs {
            assert!(
                matches!(within(job).await, Err(JobError::ShuttingDown)),
                "{io:?}: queued jobs fail, they do not hang"
            );
        }
        within(stopper).await.expect("threads joined");
        // After shutdown: refused at once; a second shutdown is a no-op.
        assert!(matches!(
            within(dataplane.ping()).await,
            Err(JobError::ShuttingDown)
        ));
        dataplane.shutdown();
    }
}

/// Names of this process's live threads.
fn live_thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim_end().to_owned())
        .collect()
}

#[tokio::test]
async fn dropping_the_last_handle_shuts_down_and_joins_the_threads() {
    for io in BACKENDS {
        let dataplane = start(io, |config| config.threads = 2);
        let names = dataplane.thread_names().to_vec();
        assert_eq!(names.len(), 2);
        // A core's thread is named before it runs anything, so once every
        // core has completed a job, every name is set.
        within(async {
            while dataplane.stats().iter().any(|core| core.completed == 0) {
                dataplane.ping().await.expect("pong");
            }
        })
        .await;
        let live = live_thread_names();
        assert!(
            names.iter().all(|name| live.contains(name)),
            "{names:?} in {live:?}"
        );
        let clone = dataplane.clone();
        drop(dataplane);
        within(clone.ping())
            .await
            .expect("a clone keeps it running");
        within(tokio::task::spawn_blocking(move || drop(clone)))
            .await
            .expect("the drop joins");
        // A join returns once the kernel clears the thread's id, a moment
        // before it removes the thread from /proc: look until it has.
        within(async {
            while names.iter().any(|name| live_thread_names().contains(name)) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }
}
