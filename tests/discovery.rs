//! Learning a model from its workers: with no `--model-path`, the
//! tokenizer comes from a worker (the directory it advertises, else its
//! `GetTokenizer` archive), and the vision preprocessing settings come
//! with it, so images are served rather than answered 501.

mod support;

use support::media::{chat, expected, image_url, messages};
use support::{Gateway, SimWorker};

#[tokio::test]
async fn images_are_served_when_the_tokenizer_comes_from_the_worker() {
    // An advertised directory the gateway can read, then (the advertised
    // path missing) the worker's archive.
    for hostile in [None, Some("tokenizer-path=/nonexistent/smg-test-dir")] {
        let mut extra = vec!["--zero-delay"];
        if let Some(hostile) = hostile {
            extra.extend(["--hostile", hostile]);
        }
        let worker = SimWorker::start("tokenspeed", "regular", &extra);
        let gateway = Gateway::start_with_model(
            None,
            &[
                "--worker-urls",
                &worker.grpc_url(),
                "--served-model-name",
                "model",
                "--allowed-local-media-path",
                &support::media::images_dir().display().to_string(),
            ],
        );
        let messages = messages(&[image_url("palette_97x61.png")]);
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 200, "{hostile:?}: {body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        let header = expected(&["palette_97x61.png"], &messages);
        assert!(content.starts_with(&header), "{hostile:?}: {content:?}");
    }
}
