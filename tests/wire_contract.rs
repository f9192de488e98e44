//! Stub (being written).

#[test]
fn stub() {
    let _ = protox::compile(
        ["common.proto"],
        [concat!(env!("CARGO_MANIFEST_DIR"), "/proto")],
    );
}
