//! End-to-end tests of the RDMA lane's loopback transport against real
//! `smg-sim-worker` processes: the gateway side publishes a tensor into its
//! arena (`smg_dataplane::lanes::rdma`), a TokenSpeed request carries the
//! `RemoteTensorHandle`, and the worker, another process, reads it by
//! descriptor. The digest in the output proves the exact bytes arrived.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use smg::proto::common;
use smg::proto::tokenspeed_encoder as enc;
use smg::proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use smg_dataplane::lanes::rdma::{RdmaArena, RdmaConfig, RdmaTensor};
use support::{SimWorker, bounded, digest, expected_header};
use tonic::Code;

const SHAPE: [u32; 2] = [4, 1176];

fn arena() -> RdmaArena {
    RdmaArena::loopback(&RdmaConfig {
        slot_bytes: 1 << 20,
        slots: 2,
        ..RdmaConfig::default()
    })
    .unwrap()
}

fn publish(arena: &RdmaArena, bytes: &[u8]) -> RdmaTensor {
    let mut writer = arena.reserve(bytes.len()).unwrap();
    writer.buffer().copy_from_slice(bytes);
    writer.publish(Duration::from_secs(60))
}

fn grid() -> Vec<u8> {
    [1i64, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An image item whose pixels travel as `tensor`'s remote handle.
fn remote_item(tensor: &RdmaTensor) -> ts::MultimodalItem {
    ts::MultimodalItem {
        modality: common::Modality::Image as i32,
        content_hash: vec![0xcd; 32].into(),
        encoder_input: Some(ts::TensorData {
            shape: SHAPE.to_vec(),
            dtype: "bfloat16".to_owned(),
            payload: Some(ts::tensor_data::Payload::Remote(
                common::RemoteTensorHandle {
                    transport: tensor.transport().to_owned(),
                    descriptor: tensor.descriptor().to_vec().into(),
                    nbytes: tensor.nbytes(),
                },
            )),
        }),
        model_specific_tensors: [(
            "image_grid_thw".to_owned(),
            ts::TensorData {
                shape: vec![1, 3],
                dtype: "int64".to_owned(),
                payload: Some(ts::tensor_data::Payload::Inline(grid().into())),
            },
        )]
        .into(),
        placeholders: vec![ts::PlaceholderRange {
            offset: 3,
            length: 1,
        }],
        placeholder_token_id: Some(4005),
    }
}

#[tokio::test]
async fn a_worker_reads_the_exact_bytes_of_a_loopback_tensor() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let arena = arena();
    let pixels = support::pixels(4 * 1176 * 2, 9);
    let tensor = publish(&arena, &pixels);
    let ids = support::encode("<|im_start|>user\nDescribe the picture.<|im_end|>\n");
    let request = ts::GenerateRequest {
        request_id: "rdma-1".to_owned(),
        tokenized: Some(ts::TokenizedInput {
            input_ids: ids.clone(),
            original_text: String::new(),
        }),
        sampling_params: Some(ts::SamplingParams {
            max_new_tokens: Some(24),
            ..Default::default()
        }),
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![remote_item(&tensor)],
        }),
        ..Default::default()
    };
    let mut client = TokenSpeedSchedulerClient::connect(worker.url())
        .await
        .unwrap();
    let mut stream = client.generate(request).await.unwrap().into_inner();
    let mut output = Vec::new();
    while let Some(message) = bounded("generate", stream.message()).await.unwrap() {
        if let Some(ts::generate_response::Response::Complete(done)) = message.response {
            output = done.output_ids;
        }
    }
    // The RPC returned: the request drops its guard.
    drop(tensor);
    assert_eq!(arena.occupancy().slots_in_use, 0);

    let item = digest::item_digest(
        &digest::tensor_digest("bfloat16", &SHAPE, &pixels),
        &[(
            "image_grid_thw".to_owned(),
            digest::tensor_digest("int64", &[1, 3], &grid()),
        )],
    );
    let text = support::decode(&output);
    assert!(
        text.starts_with(&expected_header(&ids, &[item])),
        "{text:?}"
    );
}

#[tokio::test]
async fn an_encoder_reads_before_answering_and_refuses_a_stale_descriptor() {
    let encoder = SimWorker::start("tokenspeed", "encode", &["--zero-delay"]);
    let arena = arena();
    let tensor = publish(&arena, &support::pixels(4 * 1176 * 2, 3));
    let encode = |room: i64, item: ts::MultimodalItem| enc::EncodeRequest {
        request_id: format!("rdma-enc-{room}"),
        mm_inputs: Some(ts::MultimodalInputs { items: vec![item] }),
        items: vec![enc::EncodeItemAssignment {
            bootstrap_room: room,
        }],
    };
    let item = remote_item(&tensor);
    let mut client = TokenSpeedEncoderClient::connect(encoder.url())
        .await
        .unwrap();
    let accepted = bounded("encode", client.encode(encode(1, item.clone())))
        .await
        .unwrap()
        .into_inner();
    assert!(accepted.accepted);

    // The slot is taken back and reused by another tensor: the same
    // descriptor, sent again (a late retry), must not read the new bytes.
    drop(tensor);
    let _reused = publish(&arena, &support::pixels(4 * 1176 * 2, 4));
    let _other = publish(&arena, &support::pixels(4 * 1176 * 2, 5));
    let status = bounded("encode", client.encode(encode(2, item)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("rdma_stale_descriptor"),
        "{status:?}"
    );
}
