//! Which cores the data plane gets and which the control plane keeps.
//!
//! Why it exists: `core_affinity::get_core_ids()` reports the *calling
//! thread's* affinity mask, so once anything is pinned, later calls see one
//! core. The gateway therefore enumerates its cores exactly once, at start-up
//! before any thread is pinned ([`CorePlan::enumerate`]), and splits them:
//! the last N go to the data plane (one pinned thread each), the rest to the
//! tokio runtime, whose threads are confined to them so a burst of images
//! cannot steal the cores that serve text requests.

use core_affinity::CoreId;
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

/// The data plane's default share: a quarter of the cores, at least one.
pub fn default_dataplane_cores(total: usize) -> usize {
    (total / 4).max(1)
}

/// The split of this process's cores between the two planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorePlan {
    /// Data-plane threads to start.
    pub threads: usize,
    /// The core each data-plane thread is pinned to (empty when the cores
    /// could not be enumerated: the threads then run unpinned).
    pub dataplane: Vec<CoreId>,
    /// The cores the control plane (tokio) runs on.
    pub control: Vec<CoreId>,
    /// Whether the two sets are disjoint. When the machine has too few cores
    /// for the requested split, both planes share every core (and tokio's
    /// threads are left unpinned).
    pub exclusive: bool,
}

impl CorePlan {
    /// Enumerates the cores this process may run on (call once, before
    /// pinning anything) and splits them. `requested`: data-plane threads,
    /// else [`default_dataplane_cores`].
    pub fn enumerate(requested: Option<usize>) -> Self {
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        Self::split(cores, requested)
    }

    /// Splits `cores` (as enumerated) for `requested` data-plane threads.
    pub fn split(mut cores: Vec<CoreId>, requested: Option<usize>) -> Self {
        cores.sort_by_key(|core| core.id);
        let total = cores.len();
        let wanted = requested
            .unwrap_or_else(|| default_dataplane_cores(total))
            .max(1);
        if total == 0 {
            // Affinity is unknown here: run unpinned threads.
            return Self {
                threads: wanted,
                dataplane: Vec::new(),
                control: Vec::new(),
                exclusive: false,
            };
        }
        if wanted < total {
            let control = cores[..total - wanted].to_vec();
            let dataplane = cores[total - wanted..].to_vec();
            return Self {
                threads: wanted,
                dataplane,
                control,
                exclusive: true,
            };
        }
        // More data-plane threads than cores leaves nothing for tokio: share.
        let dataplane = cores.iter().copied().cycle().take(wanted).collect();
        Self {
            threads: wanted,
            dataplane,
            control: cores,
            exclusive: false,
        }
    }
}

/// Confines the calling thread to `cores` (for tokio's worker threads). An
/// empty set or a failing call leaves the thread as it was; returns whether
/// the mask was applied.
pub fn confine_current_thread(cores: &[CoreId]) -> bool {
    if cores.is_empty() {
        return false;
    }
    let mut set = CpuSet::new();
    for core in cores {
        // Cores beyond CPU_SETSIZE cannot be named; they are left out.
        let _ = set.set(core.id);
    }
    // Pid 0 is the calling thread.
    sched_setaffinity(Pid::from_raw(0), &set).is_ok()
}

/// Lowers the calling thread's scheduling priority to `nice` (1..=19; 0
/// leaves it as it is): when the cores are contended the kernel gives it
/// a smaller share than threads at the default priority (at nice 10,
/// about a tenth of theirs). Linux keeps the nice value per thread, so
/// only the caller changes. Returns whether it was applied. The control
/// plane's threads for CPU-heavy request work use it, so that a flood of
/// heavy requests cannot starve the threads serving everyone's I/O.
///
/// It never raises the priority: a thread already at `nice` or lower
/// priority (a gateway started under `nice -n 15`) stays where it is,
/// which matters when running as root, where setpriority could raise it.
#[allow(unsafe_code)]
pub fn lower_current_thread_priority(nice: u8) -> bool {
    if nice == 0 {
        return false;
    }
    // SAFETY: getpriority takes no pointers and cannot break memory
    // safety; on Linux `who` 0 with PRIO_PROCESS names the calling thread.
    // Its -1 may be an error or nice -1: either way the max below picks
    // `nice`, a lower priority.
    let current = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let target = current.max(i32::from(nice.min(19)));
    // SAFETY: as above, for setpriority.
    target == current || unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, target) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[usize]) -> Vec<CoreId> {
        list.iter().map(|&id| CoreId { id }).collect()
    }

    #[test]
    fn default_share_is_a_quarter_and_at_least_one() {
        assert_eq!(default_dataplane_cores(1), 1);
        assert_eq!(default_dataplane_cores(2), 1);
        assert_eq!(default_dataplane_cores(8), 2);
        assert_eq!(default_dataplane_cores(64), 16);
    }

    #[test]
    fn the_last_cores_go_to_the_data_plane() {
        let plan = CorePlan::split(ids(&[3, 0, 2, 1]), None);
        assert_eq!(plan.dataplane, ids(&[3]));
        assert_eq!(plan.control, ids(&[0, 1, 2]));
        assert!(plan.exclusive);
        let plan = CorePlan::split(ids(&[0, 1, 2, 3, 4, 5, 6, 7]), Some(3));
        assert_eq!(plan.dataplane, ids(&[5, 6, 7]));
        assert_eq!(plan.control, ids(&[0, 1, 2, 3, 4]));
    }

    #[test]
    fn too_few_cores_means_sharing_them() {
        let plan = CorePlan::split(ids(&[0, 1]), Some(3));
        assert_eq!(plan.dataplane, ids(&[0, 1, 0]));
        assert_eq!(plan.control, ids(&[0, 1]));
        assert!(!plan.exclusive);
        let single = CorePlan::split(ids(&[5]), None);
        assert_eq!(single.dataplane, ids(&[5]));
        assert!(!single.exclusive);
        let unknown = CorePlan::split(Vec::new(), Some(2));
        assert_eq!((unknown.threads, unknown.dataplane.len()), (2, 0));
    }
}
