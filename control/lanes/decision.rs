//! The lane decision: which lane one request's tensors take, as a pure
//! function of what each receiving worker accepts and which lanes exist.
//!
//! A lane is taken only when every receiver accepts it (mode `shm`, or
//! `auto` with the worker sharing our `/dev/shm`; `rdma` when the RDMA lane
//! opened); otherwise the tensors go inline, and where inline was not what
//! the operator asked for, the [`Fallback`] says why.

use std::sync::Arc;

use smg_dataplane::lanes::{Fallback, LaneChoice, LaneKind, TensorLane};

use crate::workers::{LaneMode, WorkerTransport};

/// The lane decision for one request's tensors.
#[derive(Debug, Clone, Default)]
pub struct LaneDecision {
    /// `None`: inline.
    pub choice: Option<LaneChoice>,
    /// Inline although the receivers' mode asked for another lane.
    pub fallback: Option<Fallback>,
}

/// Whether a receiver shares this gateway's `/dev/shm` (read for `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedMemory {
    Shared,
    /// It advertised another namespace, or none.
    NotShared,
    /// Not known yet (being asked).
    Unknown,
}

/// What the decision knows of one receiving worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Receiver {
    pub transport: WorkerTransport,
    pub shm: SharedMemory,
}

/// The lanes that exist now.
#[derive(Debug, Clone)]
pub(crate) struct AvailableLanes {
    /// The shm lane, or why it does not exist (the fallback reason).
    pub shm: Result<Arc<dyn TensorLane>, &'static str>,
    pub rdma: Option<Arc<dyn TensorLane>>,
}

/// The lane for tensors that go to `receivers` (the available workers of
/// the receiving role).
pub(crate) fn decide(receivers: &[Receiver], lanes: &AvailableLanes) -> LaneDecision {
    let mut min_bytes = 0usize;
    // The one lane every receiver accepts, if any.
    let mut common: Option<LaneKind> = None;
    let mut everyone_agrees = !receivers.is_empty();
    let mut fallback = None;
    for receiver in receivers {
        let transport = receiver.transport;
        min_bytes = min_bytes.max(transport.min_bytes);
        let accepted = match transport.mode {
            LaneMode::Inline => Err(None),
            LaneMode::Rdma if lanes.rdma.is_some() => Ok(LaneKind::Rdma),
            LaneMode::Rdma => Err(Some(Fallback {
                requested: LaneKind::Rdma,
                reason: "rdma_unavailable",
            })),
            LaneMode::Shm => Ok(LaneKind::Shm),
            LaneMode::Auto => match receiver.shm {
                SharedMemory::Shared => Ok(LaneKind::Shm),
                SharedMemory::NotShared => Err(Some(Fallback {
                    requested: LaneKind::Shm,
                    reason: "namespace_mismatch",
                })),
                SharedMemory::Unknown => Err(Some(Fallback {
                    requested: LaneKind::Shm,
                    reason: "namespace_unknown",
                })),
            },
        };
        match accepted {
            Ok(lane) if common.is_none_or(|c| c == lane) => common = Some(lane),
            Ok(lane) => {
                everyone_agrees = false;
                fallback = fallback.or(Some(Fallback {
                    requested: lane,
                    reason: "mixed_lanes",
                }));
            }
            Err(why) => {
                everyone_agrees = false;
                fallback = fallback.or(why);
            }
        }
    }
    let lane = match common {
        Some(lane) if everyone_agrees => lane,
        _ => {
            return LaneDecision {
                choice: None,
                fallback,
            };
        }
    };
    let (available, missing) = match lane {
        LaneKind::Shm => match &lanes.shm {
            Ok(lane) => (Some(Arc::clone(lane)), ""),
            Err(why) => (None, *why),
        },
        LaneKind::Rdma => (lanes.rdma.clone(), "rdma_unavailable"),
        LaneKind::Inline => (None, ""),
    };
    match available {
        Some(lane) => LaneDecision {
            choice: Some(LaneChoice { lane, min_bytes }),
            fallback: None,
        },
        None => LaneDecision {
            choice: None,
            fallback: (lane != LaneKind::Inline).then_some(Fallback {
                requested: lane,
                reason: missing,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use smg_dataplane::lanes::InlineLane;

    use super::*;
    use crate::workers::TransportSource;

    fn receiver(mode: LaneMode, min_bytes: usize, shm: SharedMemory) -> Receiver {
        Receiver {
            transport: WorkerTransport {
                mode,
                min_bytes,
                source: TransportSource::Default,
            },
            shm,
        }
    }

    /// Stands in for a pool: the decision only hands the lane on.
    fn some_lane() -> Arc<dyn TensorLane> {
        Arc::new(InlineLane)
    }

    /// The chosen lane's threshold (`None`: inline) and the fallback reason.
    type Outcome = (Option<usize>, Option<&'static str>);

    fn outcome(receivers: &[Receiver], lanes: &AvailableLanes) -> Outcome {
        let decision = decide(receivers, lanes);
        (
            decision.choice.map(|choice| choice.min_bytes),
            decision.fallback.map(|fallback| fallback.reason),
        )
    }

    #[test]
    fn a_lane_is_taken_only_when_every_receiver_accepts_it() {
        use LaneMode::*;
        use SharedMemory::*;
        let both = AvailableLanes {
            shm: Ok(some_lane()),
            rdma: Some(some_lane()),
        };
        let no_shm = AvailableLanes {
            shm: Err("shm_no_space"),
            rdma: None,
        };
        let cases: &[(&[Receiver], &AvailableLanes, Outcome)] = &[
            (&[], &both, (None, None)),
            (
                &[receiver(Shm, 10, Unknown), receiver(Auto, 99, Shared)],
                &both,
                (Some(99), None),
            ),
            (&[receiver(Inline, 0, Shared)], &both, (None, None)),
            (
                &[receiver(Auto, 0, NotShared)],
                &both,
                (None, Some("namespace_mismatch")),
            ),
            (
                &[receiver(Auto, 0, Unknown)],
                &both,
                (None, Some("namespace_unknown")),
            ),
            (
                &[receiver(Shm, 0, Shared), receiver(Rdma, 0, Shared)],
                &both,
                (None, Some("mixed_lanes")),
            ),
            (
                &[receiver(Shm, 0, Shared), receiver(Inline, 0, Shared)],
                &both,
                (None, None),
            ),
            (&[receiver(Rdma, 5, Shared)], &both, (Some(5), None)),
            (
                &[receiver(Rdma, 0, Shared)],
                &no_shm,
                (None, Some("rdma_unavailable")),
            ),
            (
                &[receiver(Shm, 0, Shared)],
                &no_shm,
                (None, Some("shm_no_space")),
            ),
        ];
        for (index, (receivers, lanes, expected)) in cases.iter().enumerate() {
            assert_eq!(outcome(receivers, lanes), *expected, "case {index}");
        }
    }
}
