//! The stages between Preparation and RequestExecution: WorkerSelection,
//! ClientAcquisition, Encode (EPD), RequestBuilding and DispatchMetadata.
//! Each runs once per attempt (see `attempt`, which runs them in the order
//! the pipeline declares): a retry picks workers, rooms and engine request
//! ids afresh.

use std::sync::Arc;

use crate::engine::{
    EncodeBootstrap, Engine, GenerateRequest, KvBootstrap, MediaItem, Runtime, TensorPayload,
    mint_room,
};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics;
use crate::mode::{ExecutionPlan as PlanShape, Mode};
use crate::policies::{Policy, Pool, SelectionRequest};
use crate::workers::{HealthState, LoadGuard, Refusal, Worker, WorkerRole, WorkerSet};

use super::execution::{EncodeCall, ExecutionPlan, Leg};
use super::prepare::PreparedRequest;

/// The policy of each role, and when selection panics.
#[derive(Debug, Clone)]
pub struct RolePolicies {
    pub regular: Arc<dyn Policy>,
    pub prefill: Arc<dyn Policy>,
    pub decode: Arc<dyn Policy>,
    pub encode: Arc<dyn Policy>,
    /// Panic mode (as in Envoy): when fewer than this percentage of a
    /// role's workers are available, route across all of them. 0: never.
    pub panic_threshold: u8,
}

impl RolePolicies {
    pub fn of(&self, role: WorkerRole) -> &Arc<dyn Policy> {
        match role {
            WorkerRole::Regular => &self.regular,
            WorkerRole::Prefill => &self.prefill,
            WorkerRole::Decode => &self.decode,
            WorkerRole::Encode => &self.encode,
        }
    }
}

/// The workers one attempt uses, each held by a load guard.
#[derive(Debug)]
pub(crate) struct Selection {
    /// Regular worker, or decode in PD/EPD: its stream is the response.
    pub primary: LoadGuard,
    pub prefill: Option<LoadGuard>,
    /// EPD: one encode worker per media item, in item order.
    pub encoders: Vec<LoadGuard>,
}

impl Selection {
    /// Every chosen worker: primary, prefill, then the encoders.
    pub(crate) fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        std::iter::once(&self.primary)
            .chain(&self.prefill)
            .chain(&self.encoders)
            .map(LoadGuard::worker)
    }
}

/// Whether selection panics: fewer than `threshold` percent of the
/// `candidates` (workers that have been in rotation and are not leaving)
/// are `available`. Envoy's rule, with its default of 50%.
pub(crate) fn panics(available: usize, candidates: usize, threshold: u8) -> bool {
    candidates > 0 && available * 100 < usize::from(threshold) * candidates
}

/// What [`try_pick`] found.
#[derive(Debug)]
pub(crate) enum Picked {
    Held(LoadGuard),
    /// Workers could take the request, but each holds as many as its
    /// in-flight limit allows: wait for room.
    Full,
}

/// Picks one available worker of `role` with the role's policy and holds it
/// (counting the prompt's tokens against it). A worker whose half-open
/// circuit gave its last trial slot away meanwhile is passed over, and so
/// is one at its in-flight limit.
///
/// In panic mode (too few available: see [`panics`]) every worker of the
/// role that is not pending or draining is a candidate, whatever its health
/// or circuit says: a fleet that is mostly out, or a lone worker whose
/// circuit opened, serves what it can instead of refusing everything.
/// In-flight limits hold in panic mode too.
///
/// Workers in `avoid` (a retry's: their connections failed under the
/// request) are chosen only when no other could take it.
pub(crate) fn try_pick(
    workers: &WorkerSet,
    policies: &RolePolicies,
    role: WorkerRole,
    request: &SelectionRequest<'_>,
    avoid: &[Arc<str>],
) -> Result<Picked> {
    let (members, generation) = workers.members(role);
    let Selectable {
        available,
        mut full,
        panic,
    } = selectable(&members, policies.panic_threshold);
    if panic {
        tracing::debug!(role = role.name(), "panic routing");
        metrics::record_panic_routing(role.name());
    }
    let policy = policies.of(role);
    // Asks the policy for one of `available` until one is held.
    let mut hold = |mut available: Vec<usize>| -> Option<LoadGuard> {
        while !available.is_empty() {
            let pool = Pool::new(&members, &available, generation);
            let mut index = policy.select(&pool, request);
            if !pool.is_available(index) {
                tracing::error!(
                    policy = policy.name(),
                    index,
                    "a policy chose an unavailable worker"
                );
                index = available[0];
            }
            let worker: &Arc<Worker> = &members[index];
            let guard = match worker.try_hold(request.input_ids.len() as u64, !panic) {
                Ok(guard) => guard,
                Err(refusal) => {
                    full |= refusal == Refusal::Full;
                    available.retain(|&i| i != index);
                    continue;
                }
            };
            policy.on_routed(worker, request);
            metrics::record_selection(worker.label(), role.name(), policy.name());
            return Some(guard);
        }
        None
    };
    let (avoided, preferred): (Vec<usize>, Vec<usize>) = available
        .into_iter()
        .partition(|&i| avoid.iter().any(|url| **url == *members[i].url()));
    if let Some(guard) = hold(preferred).or_else(|| hold(avoided)) {
        return Ok(Picked::Held(guard));
    }
    if full {
        return Ok(Picked::Full);
    }
    Err(Error::new(
        ErrorCode::NoHealthyWorker,
        format!("no healthy {role} worker is available"),
    ))
}

/// The workers a selection may choose among.
struct Selectable {
    /// Indices into the members: available (or, in panic mode, candidates)
    /// with room under their in-flight limit.
    available: Vec<usize>,
    /// Some would be chosen but for their in-flight limit.
    full: bool,
    panic: bool,
}

fn selectable(members: &[Arc<Worker>], panic_threshold: u8) -> Selectable {
    let up: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].is_available())
        .collect();
    let candidates: Vec<usize> = (0..members.len())
        .filter(|&i| !members[i].is_draining() && members[i].health() != HealthState::Pending)
        .collect();
    let panic = panics(up.len(), candidates.len(), panic_threshold);
    let mut full = false;
    let mut available: Vec<usize> = if panic { candidates } else { up };
    available.retain(|&i| {
        let room = members[i].has_room();
        full |= !room;
        room
    });
    Selectable {
        available,
        full,
        panic,
    }
}

/// Whether `role` has only full workers now (some would be chosen, but all
/// are at their in-flight limit).
fn only_full(workers: &WorkerSet, policies: &RolePolicies, role: WorkerRole) -> bool {
    let selectable = selectable(&workers.of_role(role), policies.panic_threshold);
    selectable.full && selectable.available.is_empty()
}

/// [`try_pick`], waiting for room while every worker that could take the
/// request is at its in-flight limit (the request's deadline bounds the
/// wait: see the router).
pub(crate) async fn pick(
    workers: &WorkerSet,
    policies: &RolePolicies,
    role: WorkerRole,
    request: &SelectionRequest<'_>,
    avoid: &[Arc<str>],
) -> Result<LoadGuard> {
    with_room(workers, &[role], || {
        Ok(match try_pick(workers, policies, role, request, avoid)? {
            Picked::Held(guard) => Some(guard),
            Picked::Full => None,
        })
    })
    .await
}

/// Runs `attempt` until it holds what it needs (`Some`), waiting for a
/// request on a limited worker of `roles` to end whenever it finds them
/// full (`None`). An attempt that needs several workers takes them all or
/// none, so it never holds one role's slot while it waits for another's.
async fn with_room<T>(
    workers: &WorkerSet,
    roles: &[WorkerRole],
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    loop {
        if let Some(held) = attempt()? {
            return Ok(held);
        }
        let limited: Vec<Arc<Worker>> = roles
            .iter()
            .flat_map(|&role| workers.of_role(role).to_vec())
            .filter(|worker| worker.max_in_flight().is_some())
            .collect();
        let mut freed: Vec<_> = limited
            .iter()
            .map(|worker| Box::pin(worker.room_freed()))
            .collect();
        for wake in &mut freed {
            wake.as_mut().enable();
        }
        // A slot freed between the attempt and the subscriptions would be
        // missed: look once more now that they are in place.
        if let Some(held) = attempt()? {
            return Ok(held);
        }
        if freed.is_empty() {
            return Err(Error::internal(
                "selection found every worker full, but none has a limit",
            ));
        }
        futures::future::select_all(freed).await;
    }
}

/// WorkerSelection: one worker, or prefill + decode, plus an encode worker
/// per media item in EPD (keyed by the item's content hash). Waits while
/// any role it needs has only full workers, holding none meanwhile.
pub(crate) async fn select_workers(
    mode: Mode,
    request: &PreparedRequest,
    workers: &WorkerSet,
    policies: &RolePolicies,
    avoid: &[Arc<str>],
) -> Result<Selection> {
    let mut roles = match mode.spec().plan {
        PlanShape::Single => vec![WorkerRole::Regular],
        PlanShape::DualLeg => vec![WorkerRole::Prefill, WorkerRole::Decode],
    };
    if mode.spec().encodes_media && !request.media.is_empty() {
        roles.push(WorkerRole::Encode);
    }
    with_room(workers, &roles, || {
        try_select(mode, request, workers, policies, &roles, avoid)
    })
    .await
}

/// One try at every worker a request needs: all of them, or (some role's
/// workers all full) none. Roles whose workers are all full are looked for
/// first, so no slot is taken and given back (waking the waiters) while
/// another role is full.
fn try_select(
    mode: Mode,
    request: &PreparedRequest,
    workers: &WorkerSet,
    policies: &RolePolicies,
    roles: &[WorkerRole],
    avoid: &[Arc<str>],
) -> Result<Option<Selection>> {
    if roles.iter().any(|&role| only_full(workers, policies, role)) {
        return Ok(None);
    }
    let selection_request = SelectionRequest {
        input_ids: &request.input_ids,
        routing_key: request.routing_key.as_deref(),
        content_hash: None,
    };
    let pick = |role: WorkerRole, request: &SelectionRequest<'_>| {
        try_pick(workers, policies, role, request, avoid).map(|picked| match picked {
            Picked::Held(guard) => Some(guard),
            Picked::Full => None,
        })
    };
    let selection = match mode.spec().plan {
        PlanShape::Single => {
            let Some(primary) = pick(WorkerRole::Regular, &selection_request)? else {
                return Ok(None);
            };
            Selection {
                primary,
                prefill: None,
                encoders: Vec::new(),
            }
        }
        PlanShape::DualLeg => {
            let Some(prefill) = pick(WorkerRole::Prefill, &selection_request)? else {
                return Ok(None);
            };
            // Dropping `prefill` on the way out gives its slot back.
            let Some(decode) = pick(WorkerRole::Decode, &selection_request)? else {
                return Ok(None);
            };
            Selection {
                primary: decode,
                prefill: Some(prefill),
                encoders: Vec::new(),
            }
        }
    };
    if !mode.spec().encodes_media {
        return Ok(Some(selection));
    }
    let mut encoders = Vec::with_capacity(request.media.len());
    for item in &request.media {
        let by_content = SelectionRequest {
            content_hash: Some(&item.content_hash),
            ..selection_request
        };
        let Some(encoder) = pick(WorkerRole::Encode, &by_content)? else {
            return Ok(None);
        };
        encoders.push(encoder);
    }
    Ok(Some(Selection {
        encoders,
        ..selection
    }))
}

/// ClientAcquisition: the gRPC client of each chosen worker.
#[derive(Debug)]
pub(crate) struct Clients {
    pub primary: Arc<dyn Engine>,
    pub prefill: Option<Arc<dyn Engine>>,
    pub encoders: Vec<Arc<dyn Engine>>,
}

pub(crate) fn acquire_clients(selection: &Selection) -> Clients {
    let client = |guard: &LoadGuard| Arc::clone(guard.worker().client());
    Clients {
        primary: client(&selection.primary),
        prefill: selection.prefill.as_ref().map(client),
        encoders: selection.encoders.iter().map(client).collect(),
    }
}

/// What the Encode stage decided: where prefill fetches each embedding and
/// the supervised encode calls.
#[derive(Debug, Default)]
pub(crate) struct EncodeDispatch {
    pub bootstrap: Vec<EncodeBootstrap>,
    pub calls: Vec<EncodeCall>,
}

/// Headroom left in a gRPC message for everything but the tensors.
const MESSAGE_HEADROOM: usize = 1024 * 1024;

/// The inline tensor bytes `items` put in one message.
fn inline_bytes(items: &[MediaItem]) -> usize {
    items
        .iter()
        .flat_map(|item| {
            std::iter::once(&item.encoder_input).chain(item.model_specific.iter().map(|(_, t)| t))
        })
        .map(|tensor| match &tensor.payload {
            Some(TensorPayload::Inline(bytes)) => bytes.len(),
            _ => 0,
        })
        .sum()
}

/// Refuses a message whose inline tensors exceed what engines accept.
fn check_message_size(items: &[MediaItem], what: &str) -> Result<()> {
    let bytes = inline_bytes(items);
    let limit = crate::proto::MAX_MESSAGE_BYTES - MESSAGE_HEADROOM;
    if bytes > limit {
        return Err(Error::new(
            ErrorCode::MessageTooLarge,
            format!(
                "the {what} would carry {bytes} bytes of inline tensors; engines accept messages \
                 up to {} bytes (send fewer or smaller images, or use the shm lane: \
                 --multimodal-tensor-transport shm)",
                crate::proto::MAX_MESSAGE_BYTES
            ),
        )
        .with_param("messages"));
    }
    Ok(())
}

/// The request's media for one attempt: each lane-held tensor renewed, so a
/// retry never names a shm file a worker already consumed.
pub(crate) fn media_for_attempt(request: &PreparedRequest) -> Result<Vec<MediaItem>> {
    let mut media = request.media.clone();
    for (item, lease) in media.iter_mut().zip(&request.leases) {
        let Some(lease) = lease else { continue };
        let renewed = lease.renew().map_err(|err| {
            let code = if err.code() == "shm_slot_lost" {
                ErrorCode::TensorLost
            } else {
                ErrorCode::EncodeFailed
            };
            Error::new(
                code,
                format!("the image's tensor cannot be sent again: {err}"),
            )
        })?;
        if let Some(fallback) = lease.take_fallback() {
            crate::lanes::record_fallback(&fallback);
        }
        if let Some(payload) = renewed {
            item.encoder_input.payload = Some(crate::lanes::engine_payload(payload));
        }
    }
    Ok(media)
}

/// Encode (EPD only): a room per media item, the encode worker's bootstrap
/// host/port, and the Encode call that carries the item's tensor.
pub(crate) fn plan_encodes(
    media: &[MediaItem],
    selection: &Selection,
    clients: &Clients,
) -> Result<EncodeDispatch> {
    let mut dispatch = EncodeDispatch::default();
    for (index, (item, (guard, client))) in media
        .iter()
        .zip(selection.encoders.iter().zip(&clients.encoders))
        .enumerate()
    {
        let worker = guard.worker();
        let port = worker.bootstrap_port().ok_or_else(|| {
            Error::internal(format!(
                "encode worker {} has no bootstrap port",
                worker.url()
            ))
        })?;
        check_message_size(std::slice::from_ref(item), "Encode request")?;
        let room = mint_room(client.runtime());
        dispatch.bootstrap.push(EncodeBootstrap {
            item_index: index as u32,
            host: worker.bootstrap_host().to_owned(),
            port,
            room,
        });
        dispatch.calls.push(EncodeCall {
            client: Arc::clone(client),
            request_id: String::new(),
            item: item.clone(),
            room,
        });
    }
    Ok(dispatch)
}

/// The item as prefill and decode see it in EPD (and decode in PD):
/// placeholders and side tensors, no encoder payload.
fn metadata_only(item: &MediaItem) -> MediaItem {
    let mut item = item.clone();
    item.encoder_input.payload = None;
    item
}

/// RequestBuilding: the engine requests of one attempt, still unnamed
/// (DispatchMetadata gives them their ids: [`ExecutionPlan::stamp`]).
pub(crate) fn build_plan(
    mode: Mode,
    request: &PreparedRequest,
    media: Vec<MediaItem>,
    selection: Selection,
    clients: Clients,
    encodes: EncodeDispatch,
) -> Result<ExecutionPlan> {
    let rank_of = |guard: &LoadGuard| {
        guard
            .worker()
            .dp_rank()
            .and_then(|rank| i32::try_from(rank).ok())
    };
    let base = GenerateRequest {
        data_parallel_rank: rank_of(&selection.primary),
        input_ids: request.input_ids.clone(),
        original_text: request.prompt_text.clone(),
        sampling: request.sampling.clone(),
        stream: request.stream,
        return_logprob: request.logprobs.is_some(),
        top_logprobs_num: request.logprobs.map_or(0, |k| k as i32),
        media,
        output_budget: Some(request.output_budget),
        ..Default::default()
    };
    let leases = request.leases.iter().flatten().cloned().collect();
    let Selection {
        primary,
        prefill,
        encoders,
    } = selection;
    let mut guards = vec![primary];
    guards.extend(encoders);
    let Some(prefill_guard) = prefill else {
        check_message_size(&base.media, "Generate request")?;
        return Ok(ExecutionPlan {
            primary: Leg {
                client: clients.primary,
                request: base,
            },
            prefill: None,
            encodes: Vec::new(),
            guards,
            leases,
        });
    };
    let prefill_worker = Arc::clone(prefill_guard.worker());
    guards.push(prefill_guard);
    let port = prefill_worker.bootstrap_port().ok_or_else(|| {
        Error::internal(format!(
            "prefill worker {} has no bootstrap port",
            prefill_worker.url()
        ))
    })?;
    let runtime: Runtime = clients.primary.runtime();
    let kv = KvBootstrap {
        host: prefill_worker.bootstrap_host().to_owned(),
        port,
        room: mint_room(runtime),
    };
    let encoded = mode.spec().encodes_media && !encodes.bootstrap.is_empty();
    let prefill_request = GenerateRequest {
        data_parallel_rank: prefill_worker
            .dp_rank()
            .and_then(|rank| i32::try_from(rank).ok()),
        kv_bootstrap: Some(kv.clone()),
        media: if encoded {
            base.media.iter().map(metadata_only).collect()
        } else {
            base.media.clone()
        },
        encode_bootstrap: encodes.bootstrap,
        ..base.clone()
    };
    check_message_size(&prefill_request.media, "prefill request")?;
    let decode_request = GenerateRequest {
        kv_bootstrap: Some(kv),
        media: base.media.iter().map(metadata_only).collect(),
        ..base
    };
    let prefill_client = clients
        .prefill
        .ok_or_else(|| Error::internal("a prefill worker was selected without a client"))?;
    Ok(ExecutionPlan {
        primary: Leg {
            client: clients.primary,
            request: decode_request,
        },
        prefill: Some(Leg {
            client: prefill_client,
            request: prefill_request,
        }),
        encodes: encodes.calls,
        guards,
        leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Modality, Tensor};

    #[test]
    fn selection_panics_below_the_threshold_share_as_envoy_does() {
        // (available, candidates, threshold %) → panic; typed by hand.
        let cases = [
            (0, 0, 50, false), // no workers at all: nothing to panic over
            (0, 1, 50, true),  // a lone worker out
            (1, 2, 50, false), // exactly half: not below
            (1, 3, 50, true),  // a third
            (2, 3, 50, false),
            (0, 4, 0, false),  // threshold 0: never
            (3, 4, 100, true), // 100: unless all are available
            (4, 4, 100, false),
        ];
        for (available, candidates, threshold, panic) in cases {
            assert_eq!(
                panics(available, candidates, threshold),
                panic,
                "{available}/{candidates} at {threshold}%"
            );
        }
    }
    use bytes::Bytes;
    use smg_shared::tensor::DType;

    fn item(inline: usize) -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            content_hash: [0; 32],
            encoder_input: Tensor {
                dtype: DType::BFloat16,
                shape: vec![inline as u32 / 2],
                // Zeroed pages are not touched: cheap even at 128 MiB.
                payload: Some(TensorPayload::Inline(Bytes::from(vec![0u8; inline]))),
            },
            model_specific: Vec::new(),
            placeholders: vec![(0, 1)],
            placeholder_token_id: None,
        }
    }

    #[test]
    fn inline_tensors_over_the_engine_limit_are_refused_with_a_stable_code() {
        let half = crate::proto::MAX_MESSAGE_BYTES / 2;
        assert!(check_message_size(&[item(half)], "request").is_ok());
        let err = check_message_size(&[item(half), item(half)], "request")
            .expect_err("two halves and headroom do not fit");
        assert_eq!(err.code, ErrorCode::MessageTooLarge);
        assert_eq!(err.code.http_status(), 413);
        // Handles instead of bytes take no room.
        let mut shm = item(0);
        shm.encoder_input.payload = Some(TensorPayload::Shm {
            name: "smg-1-2-x".into(),
            offset: 0,
            nbytes: u64::MAX,
            owner_id: String::new(),
        });
        assert!(check_message_size(&[item(half), shm], "request").is_ok());
    }
}
