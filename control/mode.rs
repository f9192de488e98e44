//! The three disaggregation modes and everything that differs between them,
//! in one table.
//!
//! A router is one type carrying a [`Mode`]; the pipeline builder and the
//! stages ask the mode's [`ModeSpec`] instead of matching on the mode, so a
//! new mode is a new row here rather than a new router.

use crate::workers::WorkerRole;

/// How a request is spread over workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One worker does everything.
    Regular,
    /// A prefill and a decode worker joined by a KV rendezvous.
    PrefillDecode,
    /// An encode worker per media item, then prefill and decode.
    EncodePrefillDecode,
}

/// The shape of the engine calls a request makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionPlan {
    /// One Generate call; its stream is the response.
    Single,
    /// Prefill and decode Generate calls in parallel; decode's stream is the
    /// response, prefill's must succeed too.
    DualLeg,
}

/// What a mode implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeSpec {
    /// Roles a worker must be healthy in for the mode to serve.
    pub required_roles: &'static [WorkerRole],
    /// The Generate legs a request makes.
    pub plan: ExecutionPlan,
    /// Whether prefill and decode get a KV bootstrap (host, port, room).
    pub injects_kv_bootstrap: bool,
    /// Whether media items go through encode workers first.
    pub encodes_media: bool,
    /// The `router` label on metrics (SMG's names).
    pub metrics_label: &'static str,
}

const REGULAR: ModeSpec = ModeSpec {
    required_roles: &[WorkerRole::Regular],
    plan: ExecutionPlan::Single,
    injects_kv_bootstrap: false,
    encodes_media: false,
    metrics_label: "grpc",
};

const PREFILL_DECODE: ModeSpec = ModeSpec {
    required_roles: &[WorkerRole::Prefill, WorkerRole::Decode],
    plan: ExecutionPlan::DualLeg,
    injects_kv_bootstrap: true,
    encodes_media: false,
    metrics_label: "grpc_pd",
};

const ENCODE_PREFILL_DECODE: ModeSpec = ModeSpec {
    required_roles: &[WorkerRole::Encode, WorkerRole::Prefill, WorkerRole::Decode],
    plan: ExecutionPlan::DualLeg,
    injects_kv_bootstrap: true,
    encodes_media: true,
    metrics_label: "grpc_epd",
};

impl Mode {
    pub const fn spec(self) -> &'static ModeSpec {
        match self {
            Mode::Regular => &REGULAR,
            Mode::PrefillDecode => &PREFILL_DECODE,
            Mode::EncodePrefillDecode => &ENCODE_PREFILL_DECODE,
        }
    }

    pub const fn metrics_label(self) -> &'static str {
        self.spec().metrics_label
    }

    /// The name users see (and give `smg demo --mode`): `regular`, `pd`,
    /// `epd`.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Regular => "regular",
            Mode::PrefillDecode => "pd",
            Mode::EncodePrefillDecode => "epd",
        }
    }

    /// The mode a set of registered roles implies: encode+prefill+decode →
    /// EPD, prefill+decode → PD, otherwise Regular.
    pub fn implied_by(roles: &[WorkerRole]) -> Mode {
        let has = |role| roles.contains(&role);
        match (
            has(WorkerRole::Encode),
            has(WorkerRole::Prefill),
            has(WorkerRole::Decode),
        ) {
            (true, true, true) => Mode::EncodePrefillDecode,
            (_, true, true) => Mode::PrefillDecode,
            _ => Mode::Regular,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WorkerRole::*;

    #[test]
    fn the_mode_table() {
        // (mode, roles, plan, kv bootstrap, encodes, label): typed out by hand.
        let table = [
            (
                Mode::Regular,
                &[Regular][..],
                ExecutionPlan::Single,
                false,
                false,
                "grpc",
            ),
            (
                Mode::PrefillDecode,
                &[Prefill, Decode][..],
                ExecutionPlan::DualLeg,
                true,
                false,
                "grpc_pd",
            ),
            (
                Mode::EncodePrefillDecode,
                &[Encode, Prefill, Decode][..],
                ExecutionPlan::DualLeg,
                true,
                true,
                "grpc_epd",
            ),
        ];
        for (mode, roles, plan, kv, encodes, label) in table {
            let spec = mode.spec();
            assert_eq!(spec.required_roles, roles, "{mode:?}");
            assert_eq!(spec.plan, plan, "{mode:?}");
            assert_eq!(spec.injects_kv_bootstrap, kv, "{mode:?}");
            assert_eq!(spec.encodes_media, encodes, "{mode:?}");
            assert_eq!(mode.metrics_label(), label);
        }
    }

    #[test]
    fn roles_imply_a_mode() {
        assert_eq!(Mode::implied_by(&[Regular]), Mode::Regular);
        assert_eq!(Mode::implied_by(&[Prefill, Decode]), Mode::PrefillDecode);
        assert_eq!(
            Mode::implied_by(&[Decode, Encode, Prefill]),
            Mode::EncodePrefillDecode
        );
        assert_eq!(Mode::implied_by(&[Prefill]), Mode::Regular);
        assert_eq!(Mode::implied_by(&[Encode, Decode]), Mode::Regular);
    }
}
